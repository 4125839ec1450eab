"""Rendering for the CLI: rich progress for trials and tables for results (stderr/stdout)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from spectune.records import StudyRecord

if TYPE_CHECKING:
    from spectune.measurement import Measurement
    from spectune.trial import TrialHook

_PHASES = {"start": "starting engine", "warmup": "warming up", "measure": "measuring"}


@contextlib.contextmanager
def trial_progress(console: Console, label: str, *, enabled: bool = True) -> Iterator[TrialHook | None]:
    """A progress hook for one trial that draws a rich bar on ``console`` (None when disabled)."""
    if not enabled or not console.is_terminal:
        yield None
        return
    with Progress(
        TextColumn("[bold]{task.fields[label]}[/bold] {task.description}"),
        BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, transient=True,
    ) as progress:
        task = progress.add_task("starting engine", total=None, label=label)

        def hook(phase: str, done: int, total: int) -> None:
            progress.update(task, description=_PHASES.get(phase, phase), completed=done,
                            total=total if phase == "measure" else None)

        yield hook


def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def render_measurement(m: Measurement, console: Console | None = None) -> None:
    """A human summary of one Measurement."""
    console = console or Console()
    t = Table(title=f"{m.spec.label()} on {m.engine.model}", show_header=False)
    t.add_row("requests", f"{m.num_requests - m.num_failed} ok, {m.num_failed} failed, concurrency {m.concurrency}")
    t.add_row("output throughput", f"{m.output_throughput:.1f} tok/s")
    t.add_row("TTFT median / p99", f"{_fmt(m.ttft_ms.median)} / {_fmt(m.ttft_ms.p99)} ms")
    t.add_row("TPOT median / p99", f"{_fmt(m.tpot_ms.median)} / {_fmt(m.tpot_ms.p99)} ms")
    t.add_row("end-to-end median", f"{_fmt(m.e2el_ms.median)} ms")
    if m.acceptance is not None:
        a = m.acceptance
        t.add_row("acceptance rate", f"{a.acceptance_rate:.3f}")
        t.add_row("mean acceptance length", f"{a.mean_acceptance_length:.2f}")
        t.add_row("per position", " ".join(f"{x:.2f}" for x in a.per_position))
    t.add_row("engine start", f"{m.startup_seconds:.1f} s")
    if m.peak_memory_bytes:
        t.add_row("peak engine memory", f"{m.peak_memory_bytes / 2**30:.2f} GiB")
    console.print(t)


class StudyProgress:
    """Rich progress for ``spectune optimize``: trial n of N, the candidate, best so far.

    Use as a context manager; ``on_event`` is the study hook and ``trial_hook`` the per-trial
    phase hook factory. Finished trials are printed as lines above the bars.
    """

    def __init__(self, console: Console, total: int) -> None:
        self.console = console
        self.enabled = console.is_terminal
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=console, transient=True,
        )
        self._study_task = None
        self._trial_task = None
        self._total = total
        self._best = ""  # the last best so far: a starting trial's event carries none

    def __enter__(self) -> StudyProgress:
        if self.enabled:
            self.progress.__enter__()
            self._study_task = self.progress.add_task("trials", total=self._total)
            self._trial_task = self.progress.add_task("", total=None)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self.progress.__exit__(None, None, None)

    def on_event(self, e: object) -> None:
        from rich.markup import escape

        from spectune.study import StudyEvent

        assert isinstance(e, StudyEvent)
        if e.best_label and e.best_speedup is not None:
            self._best = f"best so far: {escape(e.best_label)} ({e.best_speedup:.2f}x)"
        elif e.kind == "trial_end":  # nothing feasible any more
            self._best = ""
        best = self._best
        if e.kind == "trial_start":
            if self.enabled:
                self.progress.update(self._study_task, completed=e.number - 1, total=e.total,
                                     description=f"trial {e.number} of {e.total}  {best}")
                self.progress.update(self._trial_task, description=f"  {escape(e.label)}: starting engine",
                                     completed=0, total=None)
            else:
                self.console.print(f"trial {e.number} of {e.total}: {escape(e.label)} ...")
        elif e.kind == "guide_stop":
            self.console.print(f"guided search stops: the {e.done} candidates left are predicted clearly "
                               f"worse than the best measured  [dim]{best}[/dim]", soft_wrap=True)
        elif e.kind == "trial_end":
            value = f" {e.values[0]:.4g}" if e.values else ""
            color = {"COMPLETE": "green", "REUSED": "cyan", "FAIL": "red"}.get(e.state, "white")
            why = f": {escape(e.reason)}" if e.reason else ""
            self.console.print(
                f"trial {e.number} of {e.total} [{color}]{e.state}[/{color}] {escape(e.label)}{value}{why}"
                + (f"  [dim]{best}[/dim]" if best else ""), soft_wrap=True)
            if self.enabled:
                self.progress.update(self._study_task, completed=e.number)

    def trial_hook(self, label: str) -> TrialHook | None:
        if not self.enabled:
            return None
        from rich.markup import escape

        def hook(phase: str, done: int, total: int) -> None:
            self.progress.update(self._trial_task, description=f"  {escape(label)}: {_PHASES.get(phase, phase)}",
                                 completed=done, total=total if phase == "measure" else None)

        return hook


def render_study(view: object, console: Console | None = None) -> None:
    """The trials of a study as a table, best first."""
    from rich.markup import escape

    from spectune.results import StudyView, engine_spread, engine_spread_note

    assert isinstance(view, StudyView)
    console = console or Console()
    t = Table(title=f"study {escape(view.name)} ({', '.join(f'{o} {d}' for o, d in zip(view.objectives, view.directions, strict=False))})")
    guided = any(r.predicted is not None for r in view.rows)
    for col in ("#", "state", "config", *view.objectives, *(["predicted"] if guided else []),
                "speedup", "acceptance", "accept len", "note", *(["ran on"] if view.placed else [])):
        t.add_column(col, overflow="fold")
    for r in view.sorted_rows():
        vals = [f"{v:.4g}" for v in r.values] if r.values else ["-"] * len(view.objectives)
        if guided:
            vals.append(_fmt(r.predicted, ".4g"))
        t.add_row(str(r.number), r.state, escape(r.label), *vals,
                  _fmt(r.speedup, ".3f") + ("x" if r.speedup else ""),
                  _fmt(r.acceptance_rate, ".3f"), _fmt(r.mean_acceptance_length, ".2f"), escape(r.note),
                  *([escape(r.placement or "-")] if view.placed else []))
    console.print(t)
    guide = StudyRecord.of(view.study).guide or {}
    skipped = guide.get("skipped") or []
    if skipped:
        console.print(f"guided search left {len(skipped)} candidates unmeasured, predicted clearly worse than "
                      f"the best measured (spectune predict ranks them)")
    if (spread := engine_spread_note(engine_spread(view.engines()))) is not None:
        console.print(spread)
