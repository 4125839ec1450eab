"""Progress for the CLI: every long step shows its phase and elapsed time (on stderr).

On a terminal, rich draws live lines: the phase, a bar with its count and the time left where
the phase counts something, and the phase's elapsed time (against its limit, where it has one:
an engine's start-up timeout). Anywhere else (a CI log, a pipe) each phase is one line as it
begins, with the elapsed time of its job, so that logs stay readable. Jobs report through a
:data:`spectune._util.ProgressHook`; nothing in the library prints.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TaskID, TextColumn
from rich.table import Table
from rich.text import Text

from spectune._tables import short_label, short_state

if TYPE_CHECKING:
    from spectune._util import ProgressHook
    from spectune.measurement import Measurement

__all__ = ["PhaseProgress", "StudyProgress", "clock", "phase_progress", "render_measurement", "trial_progress"]

NARROW = 100
"""Terminals narrower than this get candidates' short labels (:func:`spectune._tables.short_label`)."""

TRIAL_PHASES = {"start": "starting engine", "warmup": "warming up", "measure": "measuring {total} requests",
                "margins": "asking {total} answers again with log-probabilities (untimed)",
                "step cost": "timing the engine's steps at {total} sizes (untimed)"}
"""What a trial's phases (:data:`spectune.trial.TrialHook`) are called on screen."""


def clock(seconds: float) -> str:
    """``0:07``, ``12:34``, ``1:02:03``."""
    s = max(0, int(seconds))
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


class _Clock(ProgressColumn):
    """The phase's elapsed time, ``of`` its limit where it has one, and the time left where it counts."""

    def render(self, task: Task) -> Text:
        text = clock(task.elapsed or 0.0)
        if (limit := task.fields.get("limit")) is not None:
            text += f" of {clock(limit)}"
        if task.total and 0 < task.completed < task.total and (left := task.time_remaining) is not None:
            text += f", ~{clock(left)} left"
        return Text(text, style="progress.elapsed")


class _Count(ProgressColumn):
    def render(self, task: Task) -> Text:
        return Text(f"{int(task.completed)}/{int(task.total)}" if task.total else "", style="progress.download")


def _bars(console: Console) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(bar_width=20), _Count(), _Clock(),
                    console=console, transient=True)


class PhaseProgress:
    """One job's phases on ``console``: :meth:`hook` is its :data:`~spectune._util.ProgressHook`.

    ``phases`` names the job's phase keys on screen (a key without a name is shown as it is;
    ``{total}`` in a name is the phase's count); ``limits`` gives a phase a time limit in
    seconds, shown beside its elapsed time. On a terminal the job is one live line in
    ``progress`` (its own, or one shared with other jobs); elsewhere each new phase prints
    ``label: phase [elapsed]`` and the end ``label: done [elapsed]``.
    """

    def __init__(self, console: Console, label: str, *, phases: Mapping[str, str] | None = None,
                 limits: Mapping[str, float] | None = None, progress: Progress | None = None) -> None:
        self.console = console
        self.label = label
        self.phases = dict(phases or {})
        self.limits = dict(limits or {})
        self.live = console.is_terminal
        self._own = progress is None and self.live
        self.progress = progress if progress is not None else _bars(console) if self.live else None
        self._task: TaskID | None = None
        self._phase: str | None = None
        self._t0 = time.monotonic()
        self._lock = threading.Lock()

    def __enter__(self) -> PhaseProgress:
        if self._own and self.progress is not None:
            self.progress.__enter__()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(done=exc_type is None)
        if self._own and self.progress is not None:
            self.progress.__exit__(None, None, None)

    def close(self, *, done: bool = True) -> None:
        """Take the job's line off the screen; outside a terminal, say it is done (when it is)."""
        with self._lock:
            if self.progress is not None and self._task is not None:
                self.progress.remove_task(self._task)
                self._task = None
            elif not self.live and done and self._phase is not None:
                self.console.print(f"{escape(self.label)}: done [{clock(time.monotonic() - self._t0)}]",
                                   soft_wrap=True)
            self._phase = None

    def hook(self, phase: str, done: int, total: int) -> None:
        with self._lock:
            name = self.phases.get(phase, phase).replace("{total}", str(total))
            new = phase != self._phase
            self._phase = phase
            limit = self.limits.get(phase)
            if not self.live:
                if new:
                    extra = f" (limit {clock(limit)})" if limit else ""
                    self.console.print(f"{escape(self.label)}: {escape(name)}{extra} "
                                       f"[{clock(time.monotonic() - self._t0)}]", soft_wrap=True)
                return
            assert self.progress is not None
            description = f"{escape(self.label)}: {escape(name)}"
            if self._task is None:
                self._task = self.progress.add_task(description, total=total or None, completed=done, limit=limit)
            elif new:  # the phase's own clock starts again
                self.progress.reset(self._task, total=total or None, completed=done, description=description,
                                    limit=limit)
            else:
                self.progress.update(self._task, completed=done, total=total or None)


@contextlib.contextmanager
def phase_progress(console: Console, label: str, *, enabled: bool = True, **kwargs: object) -> Iterator[ProgressHook | None]:
    """A :class:`PhaseProgress` for one job, as its hook (None when not ``enabled``)."""
    if not enabled:
        yield None
        return
    with PhaseProgress(console, label, **kwargs) as p:  # type: ignore[arg-type]
        yield p.hook


def trial_progress(console: Console, label: str, *, startup_timeout: float, enabled: bool = True) -> contextlib.AbstractContextManager[ProgressHook | None]:
    """The progress of one trial (``spectune measure``): engine start against ``startup_timeout``,
    warm-up, the requests measured."""
    return phase_progress(console, label, enabled=enabled, phases=TRIAL_PHASES, limits={"start": startup_timeout})


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
    for key, why in m.engine_defaults.items():
        t.add_row(f"{key} (default)", why)
    if m.peak_memory_bytes:
        t.add_row("peak engine memory", f"{m.peak_memory_bytes / 2**30:.2f} GiB")
    console.print(t)


class StudyProgress:
    """Progress of ``spectune optimize`` and ``spectune worker``: trial n of N, the candidate,
    the best so far, and each running trial's phases (:meth:`trial_hook`).

    Use as a context manager; ``on_event`` is the study hook. Finished trials are printed as
    lines above the live ones (on a terminal) or between the phase lines (elsewhere). Trials
    running at once (one per GPU group) each have their own line.
    """

    def __init__(self, console: Console, total: int, *, startup_timeout: float | None = None) -> None:
        self.console = console
        self.enabled = console.is_terminal
        self.narrow = console.width < NARROW
        """In a narrow terminal, candidates' labels and trials' states are short, so that lines fit it."""
        self.label = short_label if self.narrow else str
        self.progress = _bars(console)
        self.startup_timeout = startup_timeout
        self._study_task: TaskID | None = None
        self._total = total
        self._best = ""  # the last best so far: a starting trial's event carries none
        self._trials: dict[str, PhaseProgress] = {}

    def __enter__(self) -> StudyProgress:
        if self.enabled:
            self.progress.__enter__()
            self._study_task = self.progress.add_task("trials", total=self._total)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self.progress.__exit__(None, None, None)

    def on_event(self, e: object) -> None:
        from spectune.study import StudyEvent

        assert isinstance(e, StudyEvent)
        if e.best_label and e.best_speedup is not None:
            if not self.narrow:
                self._best = f"best so far: {escape(e.best_label)} ({e.best_speedup:.2f}x)"
            elif e.kind == "trial_end" and e.best_label == e.label:  # this trial is the best: its label once
                self._best = f"best ({e.best_speedup:.2f}x)"
            else:
                self._best = f"best: {escape(short_label(e.best_label))} ({e.best_speedup:.2f}x)"
        elif e.kind == "trial_end":  # nothing feasible any more
            self._best = ""
        best = self._best
        if e.kind == "trial_start":
            if self.enabled:
                assert self._study_task is not None
                self.progress.update(self._study_task, completed=e.number - 1, total=e.total,
                                     description=f"{_trial(e)}  {best}")
            else:
                self.console.print(f"{_trial(e)}: {escape(self.label(e.label))} ...", soft_wrap=True)
        elif e.kind == "budget_stop":
            self.console.print(f"time budget spent: {clock(e.done)} of engine time of {clock(e.of)}; no more "
                               f"trials start  [dim]{best}[/dim]", soft_wrap=True)
        elif e.kind == "guide_stop":
            self.console.print(f"guided search stops: {escape(e.reason or 'nothing left could beat the best')}"
                               f"  [dim]{best}[/dim]", soft_wrap=True)
        elif e.kind == "trial_end":
            if (running := self._trials.pop(e.label, None)) is not None:
                running.close(done=False)
            value = f" {e.values[0]:.4g}" if e.values else ""
            color = {"COMPLETE": "green", "REUSED": "cyan", "FAIL": "red", "HANDED BACK": "yellow"}.get(e.state, "white")
            state = short_state(e.state) if self.narrow else e.state
            why = f": {escape(e.reason)}" if e.reason else ""
            self.console.print(
                f"{_trial(e)} [{color}]{state}[/{color}] {escape(self.label(e.label))}{value}{why}"
                + (f"  [dim]{best}[/dim]" if best else ""), soft_wrap=True)
            if self.enabled:
                assert self._study_task is not None
                self.progress.update(self._study_task, completed=e.number)

    def trial_hook(self, label: str) -> ProgressHook:
        """The phase hook of the trial of ``label`` that starts now."""
        limits = {"start": self.startup_timeout} if self.startup_timeout else {}
        trial = PhaseProgress(self.console, f"  {self.label(label)}", phases=TRIAL_PHASES, limits=limits,
                              progress=self.progress if self.enabled else None)
        self._trials[label] = trial
        return trial.hook


def _trial(e: object) -> str:
    """A trial as the progress lines name it: its number as ``spectune show``, the report and the
    export give it, then its place in the study's count (``trial 4 (5 of 8)``)."""
    from spectune.study import StudyEvent

    assert isinstance(e, StudyEvent)
    if e.trial is None:
        return f"trial {e.number} of {e.total}"
    return f"trial {e.trial} ({e.number} of {e.total})"
