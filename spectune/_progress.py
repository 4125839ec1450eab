"""Rendering for the CLI: rich progress for trials and tables for results (stderr/stdout)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

if TYPE_CHECKING:
    from spectune.trial import Measurement, TrialHook

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
