"""optuna-dashboard over a study's storage: the note and figures saved into each study, and the server."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from spectune._util import is_loopback
from spectune.errors import ConfigError, SpectuneError
from spectune.records import StudyRecord
from spectune.report._figures import FIGURE_IDS, figures
from spectune.report._text import study_note

if TYPE_CHECKING:
    import optuna

    from spectune.results import StudyView


__all__ = ["NOTE_MARK", "annotate_storage", "annotate_study", "serve_dashboard"]

_logger = logging.getLogger(__name__)

# -- the dashboard -------------------------------------------------------------------------------


NOTE_MARK = "*Above: written by spectune, replaced on each update. Notes below the line are kept.*"
"""The line that ends spectune's part of the study note; what follows it belongs to people."""


def _mergestudy_note(old: str, ours: str) -> str:
    """spectune's part, then the people's part of ``old`` (all of it when spectune never wrote)."""
    if NOTE_MARK in old:
        theirs = old.split(NOTE_MARK, 1)[1].strip().removeprefix("---").strip()
    else:
        theirs = old.strip()
    return f"{ours.rstrip()}\n\n{NOTE_MARK}\n\n---\n\n{theirs}".rstrip() + "\n"


def annotate_study(view: StudyView) -> None:
    """Save the note (best configuration, its YAML and speedup) and the figures into the study,
    for optuna-dashboard. Saving again replaces spectune's part of the note (what people wrote
    below :data:`NOTE_MARK` is kept) and the figures. May run while workers run trials; two
    annotations at the same moment may mix, and the next one sets it right."""
    from optuna_dashboard import get_note, save_note, save_plotly_graph_object

    old = get_note(view.study)
    note = _mergestudy_note(old, study_note(view))
    if note != old:
        save_note(view.study, note)
    for key, fig in figures(view).items():
        save_plotly_graph_object(view.study, fig, graph_object_id=FIGURE_IDS[key])


def _is_spectune_study(study: optuna.Study) -> bool:
    return StudyRecord.of(study).made_by_spectune


def annotate_storage(url: str, storage: optuna.storages.BaseStorage | None = None) -> list[str]:
    """Annotate every spectune study in the storage at ``url``; the names annotated.

    ``storage`` is that storage when already open. A study that cannot be annotated (e.g. its
    measurements are missing) is logged and skipped.
    """
    import optuna

    from spectune.results import StudyView
    from spectune.storage import MeasurementStore, open_optuna_storage

    storage = storage or open_optuna_storage(url)
    store = MeasurementStore(url)
    names: list[str] = []
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        if not _is_spectune_study(study):
            continue
        try:
            annotate_study(StudyView(study, store, url))
        except SpectuneError as e:
            _logger.warning("study %s not annotated: %s", summary.study_name, e)
            continue
        names.append(summary.study_name)
    return names


def serve_dashboard(
    storage: str | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    annotate: bool = True,
    ready: Callable[[str], None] | None = None,
) -> None:
    """Serve optuna-dashboard on the study storage until Ctrl-C (KeyboardInterrupt returns).

    The studies are annotated first (see :func:`annotate_study`). The dashboard has no login
    and can delete studies: it listens on loopback unless ``host`` says otherwise. ``ready``
    is called with the dashboard's URL once the port is bound.

    Raises:
        StorageError: the storage cannot be used.
        ConfigError: the address cannot be bound (port taken, unknown host).
    """
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from optuna_dashboard import wsgi

    from spectune.storage import open_optuna_storage, resolve_storage_url

    url = resolve_storage_url(storage)
    rdb = open_optuna_storage(url)
    if annotate:
        annotate_storage(url, rdb)
    if not is_loopback(host):
        _logger.warning("the dashboard listens on %s: anyone who reaches it can change or delete studies", host)

    class _Handler(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            _logger.debug("dashboard: " + format, *args)

    server_class = WSGIServer
    if ":" in host:
        import socket

        class _V6Server(WSGIServer):
            address_family = socket.AF_INET6

        server_class = _V6Server
    try:
        server = make_server(host, port, wsgi(rdb), server_class=server_class, handler_class=_Handler)
    except OSError as e:
        raise ConfigError(f"dashboard: cannot listen on {host}:{port}: {e.strerror or e}") from e
    shown = f"[{host}]" if ":" in host else host
    with server:
        if ready is not None:
            ready(f"http://{shown}:{server.server_port}/dashboard")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            _logger.info("dashboard stopped")


