"""Reports of a study: a self-contained HTML page with its figures, or a Markdown summary for CI."""

from __future__ import annotations

import datetime as dt
import html
import importlib.metadata
import logging
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from spectune._util import atomic_write_text
from spectune.errors import ConfigError
from spectune.records import StudyRecord
from spectune.report._figures import FIGURE_IDS, figures
from spectune.report._text import best_config_yaml, best_line, decide, fmt, level_markdown, level_rows, md_cell
from spectune.notes import answers_line, edge_notes, prediction_errors_note, stop_note
from spectune.results import engine_spread_note
from spectune.storage import safe_url

if TYPE_CHECKING:

    from spectune.measurement import Measurement
    from spectune.results import Choice, StudyView, TrialRow


__all__ = ["ReportFormat", "render_html", "render_markdown", "write_report"]

_logger = logging.getLogger(__name__)

ReportFormat = Literal["html", "md"]

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
        return fmt(x)
    return str(x)


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
        choice, why = decide(view)
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
        if w.is_mix:
            weights = w.weights()
            load = (f"a load mix of {', '.join(f'{w.level_name(k)} ({weights[k]:.0%})' for k in w.levels)}"
                    + (f", at most {m.concurrency} in flight" if w.by_rate else ""))
        else:
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
        feats = StudyRecord.of(self.view.study).workload_features
        return [(k, _value(v)) for k, v in _flatten(feats)] if feats else []

    def provenance_rows(self) -> list[tuple[str, str]]:
        rows = [("study", self.view.name), ("storage", safe_url(self.view.url)),
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
    values = [fmt(v) for v in r.values] if r.values else ["-"] * len(view.objectives)
    return [str(r.number), r.state, r.label, *values, fmt(r.speedup, ".3f", "x"),
            fmt(r.noise, ".1%") if r.noise is not None else "-",
            fmt(r.acceptance_rate, ".3f"), fmt(r.mean_acceptance_length, ".2f"), r.memory,
            str(r.kv_cache_tokens) if r.kv_cache_tokens is not None else "-",
            a.summary() if (a := r.answers) is not None else "-", r.note,
            *([r.placement or "-"] if view.placed else [])]


def _trial_header(view: StudyView) -> list[str]:
    return ["#", "state", "config", *view.objectives, "speedup", "noise", "acceptance", "accept len", "peak memory",
            "KV cache tokens", "answers", "note", *(["ran on"] if view.placed else [])]


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
        if (spread := engine_spread_note(ctx.choice.spread)) is not None:
            parts.append(f"<p>{e(spread)}</p>")
        if (answers := answers_line(view, ctx.choice)) is not None:
            parts.append(f"<p id='answers'>{e(answers)}</p>")
        if (errors := prediction_errors_note(view)) is not None:
            parts.append(f"<p id='prediction-errors'>{e(errors)}</p>")
        if (stopped := stop_note(view)) is not None:
            parts.append(f"<p id='stop'>{e(stopped)}</p>")
        parts.extend(f"<p class='edge'>{e(note)}</p>" for note in edge_notes(view))
        if (mix := level_rows(view, ctx.choice)) is not None:
            parts.append(f"<h3>At each level of the load mix ({e(view.objectives[0])})</h3><table id='levels'><tr>"
                         + "".join(f"<th>{e(h)}</th>" for h in mix[0]) + "</tr>"
                         + "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in mix[1])
                         + "</table>")
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
    numeric = set(range(3, 3 + len(view.objectives) + 6))  # objectives, speedup, noise, acceptance, memory, KV
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


def render_markdown(view: StudyView) -> str:
    """A Markdown summary for a CI job to post: decision, best config YAML, trials, setup."""
    ctx = _Context.of(view)
    lines = [f"## spectune study `{view.name}`", ""]
    if ctx.choice is None:
        lines += [f"No best configuration yet: {ctx.why_none}.", ""]
    else:
        lines += [f"**Best configuration:** {best_line(ctx.choice)}", ""]
        if (spread := engine_spread_note(ctx.choice.spread)) is not None:
            lines += [spread, ""]
        if (answers := answers_line(view, ctx.choice)) is not None:
            lines += [answers, ""]
        if (errors := prediction_errors_note(view)) is not None:
            lines += [errors, ""]
        if (stopped := stop_note(view)) is not None:
            lines += [stopped, ""]
        for note in edge_notes(view):
            lines += [note, ""]
        lines += level_markdown(view, ctx.choice)
        if ctx.yaml is not None:
            lines += ["```yaml", ctx.yaml.rstrip(), "```", ""]
    header = _trial_header(view)
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(md_cell(c) for c in _trial_cells(view, r)) + " |" for r in view.sorted_rows()]
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

