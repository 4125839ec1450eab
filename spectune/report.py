"""Figures, the study note for the Optuna dashboard, and reports (HTML, Markdown) of a study.

Everything here reads a :class:`~spectune.results.StudyView` (Optuna's trials with spectune's
user attributes) and, where a figure or a table needs more, the stored Measurements; never an
engine. The figure functions are pure: a view in, a plotly ``Figure`` out.

- :func:`annotate_study` saves into the study what a person needs in optuna-dashboard: a note
  with the best configuration (its ``vllm serve --config`` YAML and speedup) and the figures
  as the dashboard's plotly graph objects (shown on the study's page). Saving again replaces
  them (the graph objects have fixed ids).
- :func:`write_report` writes a self-contained HTML report (plotly's JavaScript inline: the
  machines that read it are often offline) or a Markdown summary a CI job can post.
- :func:`serve_dashboard` annotates the studies of a storage and serves optuna-dashboard on it,
  on loopback unless told otherwise, until Ctrl-C.
"""

from __future__ import annotations

import datetime as dt
import html
import importlib.metadata
import logging
import math
import re
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml

from spectune._util import atomic_write_text
from spectune.errors import ConfigError, SpectuneError
from spectune.measurement import TrialRecord
from spectune.results import engine_spread_note

if TYPE_CHECKING:
    import optuna
    from plotly.graph_objects import Figure

    from spectune.measurement import Measurement
    from spectune.results import Choice, StudyView, TrialRow

__all__ = [
    "FIGURE_IDS",
    "NOTE_MARK",
    "annotate_storage",
    "annotate_study",
    "best_config_yaml",
    "fig_acceptance_per_position",
    "fig_predicted_vs_measured",
    "fig_speedup_vs_k",
    "fig_throughput_vs_latency",
    "figures",
    "render_html",
    "render_markdown",
    "serve_dashboard",
    "write_report",
]

_logger = logging.getLogger(__name__)

ReportFormat = Literal["html", "md"]

FIGURE_IDS: dict[str, str] = {
    "speedup_vs_k": "spectune-speedup-vs-k",
    "acceptance_per_position": "spectune-acceptance-per-position",
    "throughput_vs_latency": "spectune-throughput-vs-latency",
    "predicted_vs_measured": "spectune-predicted-vs-measured",
}
"""Dashboard graph-object id of each figure; fixed, so that annotating again replaces them."""

_TEMPLATE = "plotly_white"
_LATENCY_DEFAULT = "tpot_median_ms"
_UNITS = {"output_throughput": "output tokens/s", "tpot_median_ms": "TPOT median (ms)",
          "tpot_p99_ms": "TPOT p99 (ms)", "ttft_p99_ms": "TTFT p99 (ms)",
          "e2el_median_ms": "end-to-end median (ms)", "e2el_p99_ms": "end-to-end p99 (ms)"}


# -- what the figures read ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Point:
    """A completed, measured (not reused) trial with the user attributes figures need."""

    row: TrialRow
    rec: TrialRecord

    @property
    def k(self) -> int | None:
        k = self.row.spec.get("num_speculative_tokens")
        return int(k) if k is not None else None

    @property
    def proposer(self) -> str:
        """The candidate without its k: ``ngram lookup=1..3``, ``draft_model (draft)``."""
        return re.sub(r" k=\d+", "", self.row.label)

    def metric(self, view: StudyView, name: str) -> float | None:
        """An objective's value (the trial's value when it is an objective, else its attribute)."""
        if name in view.objectives and self.row.values is not None:
            return float(self.row.values[view.objectives.index(name)])
        value = getattr(self.rec, name, None) if name in TrialRecord.model_fields else None
        return float(value) if isinstance(value, int | float) else None


def _points(view: StudyView) -> list[_Point]:
    records = {t.number: TrialRecord.of(t) for t in view.study.get_trials(deepcopy=False)}
    return [_Point(r, records.get(r.number, TrialRecord())) for r in view.complete() if r.duplicate_of is None]


def _go() -> Any:
    import plotly.graph_objects as go

    return go


def _layout(fig: Figure, title: str, x: str, y: str) -> Figure:
    fig.update_layout(title=title, xaxis_title=x, yaxis_title=y, template=_TEMPLATE,
                      legend={"title": {"text": ""}}, margin={"l": 60, "r": 20, "t": 60, "b": 50})
    return fig


def _hover(p: _Point) -> str:
    return f"#{p.row.number} {p.row.label}"


# -- figures (pure) ------------------------------------------------------------------------------


def fig_speedup_vs_k(view: StudyView) -> Figure:
    """Speedup over the baseline against k, one line per proposer (method and its model or
    lookup range); the baseline is the dashed line at 1. Infeasible trials are hollow."""
    go = _go()
    fig = go.Figure()
    groups: dict[str, list[_Point]] = {}
    for p in _points(view):
        if p.row.is_baseline or p.k is None or p.row.speedup is None:
            continue
        groups.setdefault(p.proposer, []).append(p)
    for name, pts in sorted(groups.items()):
        pts.sort(key=lambda p: (p.k or 0, p.row.number))
        fig.add_trace(go.Scatter(
            x=[p.k for p in pts], y=[p.row.speedup for p in pts], name=name, mode="lines+markers",
            text=[_hover(p) for p in pts], hovertemplate="%{text}<br>k=%{x}: %{y:.3f}x<extra></extra>",
            marker={"size": 9, "symbol": ["circle" if p.row.feasible else "circle-open" for p in pts]},
        ))
    fig.add_hline(y=1.0, line_dash="dash", line_color="gray", annotation_text="baseline (no speculation)",
                  annotation_position="bottom right")
    fig.update_xaxes(dtick=1)
    objective = view.objectives[0] if view.objectives else "objective"
    return _layout(fig, "Speedup over no speculation against k", "k (num_speculative_tokens)",
                   f"speedup ({objective})")


def fig_acceptance_per_position(view: StudyView) -> Figure:
    """P(the first i drafted tokens are all accepted) for i = 1..k, one curve per proposer,
    from its trial with the largest k (acceptance hardly depends on k; more positions show more)."""
    go = _go()
    fig = go.Figure()
    chosen: dict[str, _Point] = {}
    for p in _points(view):
        per = p.rec.per_position_acceptance
        if p.row.is_baseline or not per:
            continue
        old = chosen.get(p.proposer)
        if old is None or len(per) > len(old.rec.per_position_acceptance or []):
            chosen[p.proposer] = p
    for name, p in sorted(chosen.items()):
        per = [float(x) for x in p.rec.per_position_acceptance or []]
        fig.add_trace(go.Scatter(
            x=list(range(1, len(per) + 1)), y=per, name=name, mode="lines+markers",
            text=[_hover(p)] * len(per),
            hovertemplate="%{text}<br>position %{x}: %{y:.3f}<extra></extra>",
        ))
    fig.update_xaxes(dtick=1)
    fig.update_yaxes(range=[0, 1.05])
    return _layout(fig, "Acceptance per draft position", "draft position i",
                   "P(first i drafted tokens accepted)")


def _latency_metric(view: StudyView) -> str:
    return next((o for o in view.objectives if o.endswith("_ms")), _LATENCY_DEFAULT)


def _pareto(points: Iterable[tuple[float, float, _Point]]) -> list[tuple[float, float, _Point]]:
    """Points no other point beats on both lower latency and higher throughput, by latency."""
    pts = sorted(points, key=lambda t: (t[0], -t[1]))
    front: list[tuple[float, float, _Point]] = []
    for lat, thr, p in pts:
        if not front or thr > front[-1][1]:
            front.append((lat, thr, p))
    return front


def fig_throughput_vs_latency(view: StudyView) -> Figure:
    """Output throughput against latency (the latency objective, else TPOT median) of every
    measured trial, with the Pareto front of the feasible ones; SLO breakers are crosses."""
    go = _go()
    latency = _latency_metric(view)
    fig = go.Figure()
    measured = [(lat, thr, p) for p in _points(view)
                if (lat := p.metric(view, latency)) is not None
                and (thr := p.metric(view, "output_throughput")) is not None]
    groups = {
        "baseline": [t for t in measured if t[2].row.is_baseline],
        "speculative": [t for t in measured if not t[2].row.is_baseline and t[2].row.feasible],
        "breaks SLO": [t for t in measured if not t[2].row.is_baseline and not t[2].row.feasible],
    }
    symbols = {"baseline": "diamond", "speculative": "circle", "breaks SLO": "x"}
    for name, pts in groups.items():
        if not pts:
            continue
        fig.add_trace(go.Scatter(
            x=[t[0] for t in pts], y=[t[1] for t in pts], name=name, mode="markers",
            text=[_hover(t[2]) for t in pts], marker={"size": 10, "symbol": symbols[name]},
            hovertemplate="%{text}<br>%{x:.2f} ms, %{y:.1f} tok/s<extra></extra>",
        ))
    front = _pareto(t for t in measured if t[2].row.feasible)
    if front:
        fig.add_trace(go.Scatter(
            x=[t[0] for t in front], y=[t[1] for t in front], name="Pareto front", mode="lines+markers",
            line={"dash": "dot", "color": "black", "shape": "hv"}, text=[_hover(t[2]) for t in front],
            marker={"size": 16, "symbol": "circle-open", "color": "black"},
            hovertemplate="%{text}<extra>Pareto front</extra>",
        ))
    return _layout(fig, "Throughput against latency", _UNITS.get(latency, latency), _UNITS["output_throughput"])


def fig_predicted_vs_measured(view: StudyView) -> Figure | None:
    """Predicted against measured value per objective, for trials that carry a
    ``predicted_<objective>`` user attribute, with the line y = x; None when no trial does."""
    go = _go()
    fig = go.Figure()
    lo, hi = math.inf, -math.inf
    for objective in view.objectives:
        pairs = [(float(pred), meas, p) for p in _points(view)
                 if p.rec.predicted_objective == objective and (pred := p.rec.predicted) is not None
                 and (meas := p.metric(view, objective)) is not None]
        if not pairs:
            continue
        lo = min(lo, *(min(a, b) for a, b, _ in pairs))
        hi = max(hi, *(max(a, b) for a, b, _ in pairs))
        fig.add_trace(go.Scatter(
            x=[a for a, _, _ in pairs], y=[b for _, b, _ in pairs], name=objective, mode="markers",
            text=[_hover(p) for _, _, p in pairs], marker={"size": 9},
            hovertemplate="%{text}<br>predicted %{x:.4g}, measured %{y:.4g}<extra></extra>",
        ))
    if not fig.data:
        return None
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], name="y = x", mode="lines",
                             line={"dash": "dash", "color": "gray"}, hoverinfo="skip"))
    return _layout(fig, "Predicted against measured", "predicted", "measured")


def figures(view: StudyView) -> dict[str, Figure]:
    """Every figure that applies to the study, by the keys of :data:`FIGURE_IDS`."""
    out: dict[str, Figure] = {
        "speedup_vs_k": fig_speedup_vs_k(view),
        "acceptance_per_position": fig_acceptance_per_position(view),
        "throughput_vs_latency": fig_throughput_vs_latency(view),
    }
    predicted = fig_predicted_vs_measured(view)
    if predicted is not None:
        out["predicted_vs_measured"] = predicted
    return out


# -- the decision, as text ----------------------------------------------------------------------


def _choice(view: StudyView) -> tuple[Choice | None, str]:
    try:
        return view.best(), ""
    except ConfigError as e:
        return None, str(e)


def best_config_yaml(view: StudyView, choice: Choice) -> str | None:
    """The chosen configuration as ``vllm serve --config`` YAML (None without its measurement)."""
    from spectune.export import vllm_config

    m = view.store.measurement(choice.row.trial_id)
    if m is None:
        return None
    config = vllm_config(m.engine.model_dump(exclude={"host", "env"}), m.engine.model, choice.row.spec)
    return yaml.safe_dump(config, sort_keys=False)


def _fmt(x: float | None, spec: str = ".4g", suffix: str = "") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{format(x, spec)}{suffix}"


def _best_line(choice: Choice) -> str:
    row = choice.row
    if choice.is_baseline:
        return f"no speculation (`{row.label}`, trial {row.number}): {choice.reason}"
    return f"`{row.label}` (trial {row.number}): {choice.reason}"


def _note(view: StudyView) -> str:
    choice, why = _choice(view)
    lines = [f"## spectune: {view.name}", ""]
    objectives = ", ".join(f"{o} ({d})" for o, d in zip(view.objectives, view.directions, strict=False))
    done = len(view.complete())
    lines += [f"Objectives: {objectives}. {done} of {len(view.rows)} trials completed.", ""]
    if choice is None:
        lines += [f"No best configuration yet: {why}."]
        return "\n".join(lines) + "\n"
    lines += [f"**Best configuration:** {_best_line(choice)}", ""]
    values = ", ".join(f"{o} = {_fmt(v)}" for o, v in zip(view.objectives, choice.row.values or [], strict=False))
    base = ", ".join(f"{o} = {_fmt(v)}" for o, v in zip(view.objectives, choice.baseline.values or [], strict=False))
    several = len(choice.engines) > 1 or len(choice.baseline_engines) > 1
    first = " (first engine)" if several else ""
    lines += [f"- measured{first}: {values}", f"- baseline (trial {choice.baseline.number}){first}: {base}"]
    if several:
        lines.append(f"- {view.objectives[0]} on each engine: {', '.join(_fmt(v) for v in choice.engines)} "
                     f"(baseline: {', '.join(_fmt(v) for v in choice.baseline_engines)})")
    lines.append(f"- noise band: +-{choice.noise_band:.1%}")
    if (spread := engine_spread_note(choice.engine_spread)) is not None:
        lines.append(f"- {spread}")
    lines.append("")
    text = best_config_yaml(view, choice)
    if text is not None:
        lines += ["`vllm serve --config best.yaml` with this `best.yaml` "
                  "(`spectune export -o best.yaml` writes it, with its provenance):", "",
                  "```yaml", text.rstrip(), "```", ""]
    lines += ["Figures: speedup against k, acceptance per draft position, throughput against "
              "latency with the Pareto front, and predicted against measured when the study "
              "has predictions. `spectune report` writes them into one HTML file."]
    return "\n".join(lines) + "\n"


# -- the dashboard -------------------------------------------------------------------------------


NOTE_MARK = "*Above: written by spectune, replaced on each update. Notes below the line are kept.*"
"""The line that ends spectune's part of the study note; what follows it belongs to people."""


def _merge_note(old: str, ours: str) -> str:
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
    note = _merge_note(old, _note(view))
    if note != old:
        save_note(view.study, note)
    for key, fig in figures(view).items():
        save_plotly_graph_object(view.study, fig, graph_object_id=FIGURE_IDS[key])


def _is_spectune_study(study: optuna.Study) -> bool:
    attrs = study.user_attrs
    return "spectune_config" in attrs or "objectives" in attrs


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
    if host not in {"127.0.0.1", "localhost", "::1"}:
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


# -- reports -------------------------------------------------------------------------------------


def _measurements(view: StudyView) -> dict[int, Measurement]:
    out = {}
    for stored in view.store.trials(view.name):
        m = stored.measurement()
        if m is not None:
            out[stored.trial_id] = m
    return out


def _flatten(data: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(data, dict):
        return [kv for k, v in data.items() for kv in _flatten(v, f"{prefix}{k}.")]
    return [(prefix.rstrip("."), data)] if data is not None else []


def _value(x: Any) -> str:
    if isinstance(x, float):
        return _fmt(x)
    return str(x)


def _safe_url(url: str) -> str:
    import sqlalchemy as sa

    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - a URL that does not parse is shown without its credentials
        return re.sub(r"//[^@/]*@", "//***@", url)


def _spectune_version() -> str:
    try:
        return importlib.metadata.version("spectune")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class _Context:
    """What a report shows, gathered once from the view and its stored measurements."""

    view: StudyView
    choice: Choice | None
    why_none: str
    yaml: str | None
    measurements: dict[int, Measurement]
    generated: str

    @classmethod
    def of(cls, view: StudyView) -> _Context:
        choice, why = _choice(view)
        ms = _measurements(view)
        return cls(view=view, choice=choice, why_none=why,
                   yaml=best_config_yaml(view, choice) if choice is not None else None,
                   measurements=ms, generated=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))

    def reference(self) -> Measurement | None:
        """The measurement describing the workload and setup: the chosen trial's, else any."""
        if self.choice is not None and self.choice.row.trial_id in self.measurements:
            return self.measurements[self.choice.row.trial_id]
        return next(iter(self.measurements.values()), None)

    def workload_rows(self) -> list[tuple[str, str]]:
        m = self.reference()
        if m is None:
            return []
        w = m.workload
        load = (f"Poisson arrivals at {w.request_rate} req/s, at most {m.concurrency} in flight"
                if w.request_rate else f"concurrency {m.concurrency}")
        return [
            ("source", f"{w.source} (format {w.format}, api {w.api})"),
            ("prompts", f"{w.num_prompts if w.num_prompts is not None else 'all'} (selection seed {w.seed})"),
            ("sampling", f"max_tokens {w.sampling.max_tokens}, temperature {w.sampling.temperature}"),
            ("load", load),
            ("measured window", f"{m.num_requests} requests, {m.input_tokens} input and {m.output_tokens} output tokens"),
            ("warm-up requests", str(w.warmup_requests)),
        ]

    def feature_rows(self) -> list[tuple[str, str]]:
        feats = self.view.study.user_attrs.get("workload_features")
        return [(k, _value(v)) for k, v in _flatten(feats)] if feats else []

    def provenance_rows(self) -> list[tuple[str, str]]:
        rows = [("study", self.view.name), ("storage", _safe_url(self.view.url)),
                ("report", f"spectune {_spectune_version()}, {self.generated}")]
        ms = list(self.measurements.values())
        if not ms:
            return rows
        versions = sorted({", ".join(f"{k} {v}" for k, v in m.versions.model_dump().items()) for m in ms})
        hw = sorted({f"{m.hardware.platform}: {m.hardware.cpu} ({m.hardware.cpu_count} CPUs"
                     + (f", {m.hardware.memory_bytes / 2**30:.0f} GiB" if m.hardware.memory_bytes else "") + ")"
                     + (f", {', '.join(m.hardware.gpus)}" if m.hardware.gpus else "") for m in ms})
        rows += [("versions", v) for v in versions]
        rows += [("hardware", h) for h in hw]
        ref = self.reference()
        if ref is not None:
            rows.append(("engine command", shlex.join(ref.command)))
        return rows


def _trial_cells(view: StudyView, r: TrialRow) -> list[str]:
    values = [_fmt(v) for v in r.values] if r.values else ["-"] * len(view.objectives)
    return [str(r.number), r.state, r.label, *values, _fmt(r.speedup, ".3f", "x"),
            _fmt(r.noise, ".1%") if r.noise is not None else "-",
            _fmt(r.acceptance_rate, ".3f"), _fmt(r.mean_acceptance_length, ".2f"), r.note,
            *([r.placement or "-"] if view.placed else [])]


def _trial_header(view: StudyView) -> list[str]:
    return ["#", "state", "config", *view.objectives, "speedup", "noise", "acceptance", "accept len", "note",
            *(["ran on"] if view.placed else [])]


_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:2rem auto;max-width:1200px;
padding:0 1rem;color:#222}
h1{font-size:1.6rem}h2{font-size:1.25rem;margin-top:2rem;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.9rem;margin:.5rem 0}
th,td{border:1px solid #ddd;padding:.25rem .5rem;text-align:left;vertical-align:top}
th{background:#f5f5f5}tr.best td{background:#eef8ee}td.num{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#f7f7f7;padding:.75rem;overflow-x:auto}.figs{display:grid;grid-template-columns:1fr 1fr;gap:1rem}
.fig{border:1px solid #eee}.muted{color:#666}
"""


def _kv_table(rows: list[tuple[str, str]]) -> str:
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def render_html(view: StudyView) -> str:
    """The report as one self-contained HTML page (plotly.js inline, nothing fetched)."""
    ctx = _Context.of(view)
    e = html.escape
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
             f"<title>spectune report: {e(view.name)}</title><style>{_CSS}</style></head><body>",
             f"<h1>spectune report: <span id='study-name'>{e(view.name)}</span></h1>",
             f"<p class='muted'>{e(ctx.generated)}; objectives: "
             + e(", ".join(f"{o} ({d})" for o, d in zip(view.objectives, view.directions, strict=False)))
             + f"; {len(view.complete())} of {len(view.rows)} trials completed.</p>",
             "<h2>Decision</h2>"]
    if ctx.choice is None:
        parts.append(f"<p>No best configuration yet: {e(ctx.why_none)}.</p>")
    else:
        row = ctx.choice.row
        verdict = "No speculation" if ctx.choice.is_baseline else e(row.label)
        parts.append(f"<p id='best'><strong>Best configuration:</strong> {verdict} (trial {row.number}): "
                     f"{e(ctx.choice.reason)}.</p>")
        if (spread := engine_spread_note(ctx.choice.engine_spread)) is not None:
            parts.append(f"<p>{e(spread)}</p>")
        if ctx.yaml is not None:
            parts.append(f"<p>As <code>vllm serve --config best.yaml</code>:</p><pre>{e(ctx.yaml)}</pre>")
    parts.append("<h2>Figures</h2><div class='figs'>")
    first = True
    for key, fig in figures(view).items():
        parts.append("<div class='fig'>" + fig.to_html(
            full_html=False, include_plotlyjs=first, div_id=FIGURE_IDS[key], default_height="460px",
            config={"displaylogo": False, "responsive": True}) + "</div>")
        first = False
    parts.append("</div>")
    best_number = ctx.choice.row.number if ctx.choice is not None else None
    parts.append("<h2>Trials</h2><table id='trials'><tr>"
                 + "".join(f"<th>{e(h)}</th>" for h in _trial_header(view)) + "</tr>")
    numeric = set(range(3, 3 + len(view.objectives) + 4))  # objectives, speedup, noise, acceptance
    for r in view.sorted_rows():
        cells = _trial_cells(view, r)
        cls = " class='best'" if r.number == best_number else ""
        parts.append(f"<tr{cls}>" + "".join(
            f"<td class='num'>{e(c)}</td>" if i in numeric else f"<td>{e(c)}</td>"
            for i, c in enumerate(cells)) + "</tr>")
    parts.append("</table>")
    parts.append("<h2>Workload</h2>")
    wl = ctx.workload_rows()
    parts.append(_kv_table(wl) if wl else "<p>No stored measurement describes the workload.</p>")
    feats = ctx.feature_rows()
    if feats:
        parts.append("<h3>Workload features</h3>" + _kv_table(feats))
    parts.append("<h2>Provenance</h2>" + _kv_table(ctx.provenance_rows()))
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(view: StudyView) -> str:
    """A Markdown summary for a CI job to post: decision, best config YAML, trials, setup."""
    ctx = _Context.of(view)
    lines = [f"## spectune study `{view.name}`", ""]
    if ctx.choice is None:
        lines += [f"No best configuration yet: {ctx.why_none}.", ""]
    else:
        lines += [f"**Best configuration:** {_best_line(ctx.choice)}", ""]
        if (spread := engine_spread_note(ctx.choice.engine_spread)) is not None:
            lines += [spread, ""]
        if ctx.yaml is not None:
            lines += ["```yaml", ctx.yaml.rstrip(), "```", ""]
    header = _trial_header(view)
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_md_cell(c) for c in _trial_cells(view, r)) + " |" for r in view.sorted_rows()]
    lines.append("")
    wl = ctx.workload_rows()
    if wl:
        lines += ["**Workload:** " + "; ".join(f"{k}: {v}" for k, v in wl), ""]
    lines += ["<details><summary>Provenance</summary>", ""]
    lines += [f"- {k}: `{v}`" if k == "engine command" else f"- {k}: {v}" for k, v in ctx.provenance_rows()]
    lines += ["", "</details>", ""]
    return "\n".join(lines)


def write_report(view: StudyView, path: Path | str, fmt: ReportFormat = "html") -> Path:
    """Write the report of ``view`` to ``path`` atomically: HTML (self-contained) or Markdown.

    Raises:
        ConfigError: an unknown format.
        StorageError: the storage cannot be read.
    """
    if fmt not in ("html", "md"):
        raise ConfigError(f"report format {fmt!r}: expected html or md")
    text = render_html(view) if fmt == "html" else render_markdown(view)
    path = Path(path)
    try:
        atomic_write_text(path, text)
    except OSError as e:
        raise ConfigError(f"{path}: cannot write the report: {e.strerror or e}") from e
    return path

