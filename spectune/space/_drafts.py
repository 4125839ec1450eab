"""Which method a draft or head given with ``--draft`` is for, as vLLM itself would take it.

A search space names its drafts and heads with one placeholder, ``${draft}``; the user may give
several. Each goes only to the methods it can serve: a speculators-format checkpoint to the
method its ``speculators_model_type`` names (``eagle3``, ``eagle``...), an EAGLE checkpoint to
``eagle`` or ``eagle3`` by its architecture, anything else to ``draft_model``. A hub name is
read as vLLM reads it when no method is given: ``eagle3`` in the name is an EAGLE-3 head,
``eagle`` an EAGLE head.
"""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path
from typing import Any

__all__ = ["draft_method", "local_heads", "route_drafts"]

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=64)
def draft_method(name: str) -> str:
    """The vLLM method that serves the checkpoint ``name`` (a folder or a hub name)."""
    config = _config(Path(name).expanduser())
    if config is not None:
        kind = config.get("speculators_model_type")
        if isinstance(kind, str) and kind:
            return kind
        arch = " ".join(str(a) for a in config.get("architectures") or []).lower()
        if "eagle3" in arch:
            return "eagle3"
        if "eagle" in arch:
            return "eagle"
        if config.get("model_type") == "mlp_speculator":
            return "mlp_speculator"
        return "draft_model"
    lowered = name.lower()
    if "eagle3" in lowered:
        return "eagle3"
    if "eagle" in lowered:
        return "eagle"
    return "draft_model"


def local_heads(target: str) -> list[str]:
    """Heads built for the local target ``target`` beside it: ``<target>-eagle3`` (what
    ``spectune models prepare`` and ``train-head`` write) and ``eagle3`` (``build-tiny``), each
    taken only when it names ``target`` as its verifier."""
    folder = Path(target).expanduser()
    if not folder.is_dir():
        return []
    found = []
    for candidate in (folder.parent / f"{folder.name}-eagle3", folder.parent / "eagle3"):
        config = _config(candidate)
        verifier = ((config or {}).get("speculators_config") or {}).get("verifier") or {}
        path = verifier.get("name_or_path")
        if isinstance(path, str) and Path(path).expanduser().resolve() == folder.resolve():
            found.append(str(candidate))
    return found


def _config(folder: Path) -> dict | None:
    try:
        data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def route_drafts(space: Any, drafts: list[str]) -> Any:
    """``space`` (resolved with ``drafts`` for ``${draft}``) with each of ``drafts`` kept only
    under the method it serves (:func:`draft_method`); a method left without models is dropped,
    with a WARNING line (the CLI's level). Models a space names itself are left alone.

    Raises:
        ConfigError: no method but the baseline is left where the space had others.
    """
    from spectune.errors import ConfigError

    given = set(drafts)
    methods = {}
    for method, part in space.methods.items():
        if not part.models:
            methods[method] = part
            continue
        models = [m for m in part.models if m not in given or draft_method(m) == method.value]
        if not models:
            logger.warning("search space: method %s left out: no draft given is for it (%s)", method,
                        ", ".join(f"{m}: {draft_method(m)}" for m in part.models))
            continue
        methods[method] = part.model_copy(update={"models": models})
    if len(methods) == 1 and len(space.methods) > 1:
        raise ConfigError(f"no method of the space takes the drafts given: "
                          f"{', '.join(f'{m} is for {draft_method(m)}' for m in drafts)}")
    return space.model_copy(update={"methods": methods})
