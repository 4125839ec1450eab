"""The CLI's tables (``show``, ``predict``), fitted to the terminal's width.

Every cell stays on one line. A table wider than the terminal first takes its columns' short
headers, then leaves out its optional columns, least useful first, until it fits; what a
left-out column would have said that matters (a trial's note) is printed under the table.
``--json`` gives scripts the full record instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from spectune.predict import Estimate, LevelPrediction, Prediction
    from spectune.results import StudyView

__all__ = ["Column", "fitted_table", "levels_table", "predictions_table", "render_study", "short_label", "short_state"]


@dataclass(frozen=True)
class Column:
    """One column: its header, a shorter one for narrow terminals, and how readily it is left
    out (``drop`` 0: never; higher: sooner)."""

    header: str
    short: str | None = None
    drop: int = 0
    justify: str = "left"
    short_cells: Callable[[str], str] | None = None
    """The shorter form of a cell, used with the short header."""


def _table(title: str, columns: Sequence[Column], rows: Sequence[Sequence[str]], *, short: bool) -> Table:
    from rich import box
    from rich.table import Table

    t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), collapse_padding=True, title_justify="left")
    for c in columns:
        t.add_column((c.short or c.header) if short else c.header, no_wrap=True, overflow="ellipsis",
                     justify=c.justify)  # type: ignore[arg-type]
    for row in rows:
        t.add_row(*(c.short_cells(cell) if short and c.short_cells else cell
                    for c, cell in zip(columns, row, strict=True)))
    return t


def fitted_table(console: Console, title: str, columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> tuple[Table, list[Column]]:
    """The widest form of the table that fits ``console``'s width, and the columns it kept.

    Rows hold one string per column (rich markup escaped). The title wraps like any text; cells
    never do: where even the narrowest form is too wide, rich shortens its widest cells with an
    ellipsis rather than breaking a word.
    """
    from rich.measure import Measurement

    def width(t: Table) -> int:
        return Measurement.get(console, console.options.update_width(10_000), t).maximum

    kept = list(range(len(columns)))
    short = False
    while True:
        cols = [columns[i] for i in kept]
        table = _table(title, cols, [[row[i] for i in kept] for row in rows], short=short)
        if width(table) <= console.width:
            return table, cols
        if not short:
            short = True
            continue
        droppable = [i for i in kept if columns[i].drop > 0]
        if not droppable:
            return table, cols
        kept.remove(max(droppable, key=lambda i: (columns[i].drop, i)))


# -- spectune show -----------------------------------------------------------------------------

_STATE = {"COMPLETE": "done", "FAIL": "fail", "RUNNING": "run", "WAITING": "wait", "PRUNED": "pruned",
          "HANDED BACK": "back"}
_METHOD = {"draft_model ": "draft ", "mlp_speculator ": "mlp ", "lookup=": ""}
_OBJECTIVE = {"output_throughput": "tok/s", "tpot_median_ms": "TPOT ms", "tpot_p99_ms": "TPOT p99",
              "ttft_p99_ms": "TTFT p99", "e2el_median_ms": "E2E ms", "e2el_p99_ms": "E2E p99"}


def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def short_state(state: str) -> str:
    """A trial's state for narrow tables: ``done``, ``fail``, ``run``, ``wait``."""
    return _STATE.get(state, state)


def short_label(label: str) -> str:
    """A candidate's label for narrow tables: ``draft k=4 (name)``, ``ngram k=6 2..4``."""
    for long, short in _METHOD.items():
        label = label.replace(long, short)
    return label


def render_study(view: StudyView, console: Console | None = None) -> None:
    """The trials of a study as a table, best first, fitted to ``console``'s width; notes that
    do not fit beside the figures follow the table, one line per trial."""
    from rich.console import Console
    from rich.markup import escape

    from spectune.errors import ConfigError
    from spectune.records import StudyRecord
    from spectune.report import level_rows
    from spectune.notes import answers_line, edge_notes, prediction_errors_note, stop_note

    console = console or Console()
    guided = any(r.predicted is not None for r in view.rows)
    checked = any(r.fidelity is not None for r in view.rows)
    columns = [Column("#", justify="right"), Column("state", short_cells=short_state),
               Column("config", short_cells=short_label),
               *(Column(o, _OBJECTIVE.get(o, o), justify="right") for o in view.objectives),
               *([Column("predicted", "pred", drop=2, justify="right")] if guided else []),
               Column("speedup", justify="right"), Column("acceptance", "accept", drop=1, justify="right"),
               Column("accept len", "len", drop=3, justify="right"),
               *([Column("answers", "same", drop=4, justify="right")] if checked else []),
               *([Column("memory", "mem", drop=4, justify="right")] if any(r.peak_memory_bytes for r in view.rows) else []),
               Column("note", drop=6),
               *([Column("ran on", drop=5)] if view.placed else [])]
    ordered = view.sorted_rows()
    rows = []
    for r in ordered:
        values = [f"{v:.4g}" for v in r.values] if r.values else ["-"] * len(view.objectives)
        rows.append([str(r.number), r.state, escape(r.label), *values,
                     *([_fmt(r.predicted, ".4g")] if guided else []),
                     _fmt(r.speedup, ".3f") + ("x" if r.speedup else ""), _fmt(r.acceptance_rate, ".3f"),
                     _fmt(r.mean_acceptance_length, ".2f"),
                     *([a.label if (a := r.answers) is not None else "-"] if checked else []),
                     *([r.memory] if any(x.peak_memory_bytes for x in view.rows) else []), escape(r.note),
                     *([escape(r.placement or "-")] if view.placed else [])])
    title = f"study {escape(view.name)} ({', '.join(f'{o} {d}' for o, d in zip(view.objectives, view.directions, strict=False))})"
    table, kept = fitted_table(console, title, columns, rows)
    console.print(table)
    if not any(c.header == "note" for c in kept):
        for r in ordered:
            if r.note:
                console.print(f"#{r.number}: {escape(r.note)}")
    if guided and (errors := prediction_errors_note(view)) is not None:
        console.print(escape(errors))
    record = StudyRecord.of(view.study)
    if record.stopped:
        console.print(f"the search ended early: {escape(record.stopped)}")
    guide = record.guide or {}
    if guide.get("engine_knobs"):
        console.print(f"chosen: {escape(guide['engine_knobs'])}")
    skipped = guide.get("skipped") or []
    if (stopped := stop_note(view)) is not None:
        console.print(escape(stopped) + " (spectune predict ranks the candidates left)")
    elif skipped:
        console.print(f"guided search left {len(skipped)} candidates unmeasured, predicted clearly worse than "
                      f"the best measured (spectune predict ranks them)")
    for note in edge_notes(view):
        console.print(escape(note))
    console.print(escape(view.spread().note()))
    try:
        choice = view.best()
    except ConfigError:
        choice = None
    if (answers := answers_line(view, choice)) is not None:
        console.print(escape(answers))
    if (mix := level_rows(view)) is not None:  # a load mix: the choice at each level
        header, cells = mix
        table, _ = fitted_table(console, f"the choice at each level of the load mix ({view.objectives[0]})",
                                [Column(h, justify="right" if i != 5 else "left", drop=0 if i < 5 else 1)
                                 for i, h in enumerate(header)], [[escape(c) for c in row] for row in cells])
        console.print(table)


# -- spectune predict --------------------------------------------------------------------------

def _interval(e: Estimate, fmt: str = ".4g") -> str:
    if e.low == e.high == e.value:
        return f"{e.value:{fmt}}"
    return f"{e.value:{fmt}} [{e.low:{fmt}}, {e.high:{fmt}}]"


def predictions_table(console: Console, predictions: Sequence[Prediction], *,
                      title: str = "predicted, not measured", mix: bool = False) -> Table:
    """One row per prediction, in the given order: objective, TPOT and throughput with
    intervals, fitted to ``console``'s width. ``mix``: the objective is a load mix's (its own
    column; TPOT and throughput are the headline level's)."""
    from rich.markup import escape

    objective = predictions[0].objective if predictions else "output_throughput"
    # TPOT and throughput have their own columns; another objective, or a mix, gets one too
    own = mix or objective not in ("output_throughput", "tpot_median_ms")
    name = f"{objective} over the mix" if mix else objective
    short = f"{_OBJECTIVE.get(objective, objective)} mix" if mix else _OBJECTIVE.get(objective, objective)
    columns = [Column("#", justify="right"), Column("config", short_cells=short_label),
               *([Column(name, short)] if own else []),
               Column("tpot ms", "TPOT ms", drop=4), Column("throughput tok/s", "tok/s"),
               Column("acceptance", "accept", drop=2, justify="right"),
               Column("accept len", "len", drop=1, justify="right"),
               Column("tokens/step", "tok/step", drop=5), Column("source", "from", drop=3), Column("cost", drop=6),
               Column("note", drop=7)]
    rows = [[str(i), escape(p.label), *([_interval(p.value)] if own else []), _interval(p.tpot_ms),
             _interval(p.output_throughput), f"{p.acceptance_rate:.3f}", f"{p.mean_acceptance_length:.2f}",
             _interval(p.tokens_per_step, ".3f"), p.source, p.cost_source, escape(p.note)]
            for i, p in enumerate(predictions, 1)]
    return fitted_table(console, escape(title), columns, rows)[0]


def levels_table(console: Console, predictions: Sequence[Prediction],
                 levels: Sequence[Sequence[LevelPrediction]], *, title: str) -> Table:
    """One row per prediction, one column per level (a concurrency, or the study's own level):
    output throughput and TPOT, fitted to ``console``'s width (TPOT is left out first)."""
    from rich.markup import escape

    columns = [Column("#", justify="right"), Column("config", short_cells=short_label)]
    for lp in levels[0] if levels else ():
        name = lp.name or f"c={lp.concurrency:g}"
        columns += [Column(f"{name} tok/s"), Column(f"{name} tpot ms", drop=3)]
    columns += [Column("from", drop=2), Column("scaling", drop=1)]
    rows = [[str(i), escape(p.label), *(c for lp in row for c in (_interval(lp.output_throughput),
                                                                   _interval(lp.tpot_ms))),
             p.source, row[0].scale_source if row else ""]
            for i, (p, row) in enumerate(zip(predictions, levels, strict=True), 1)]
    return fitted_table(console, escape(title), columns, rows)[0]
