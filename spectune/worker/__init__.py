"""A worker: asks the study's search for trials and measures them, one engine per GPU group,
until the study needs no more.

Any number of workers share a study through its storage: on PostgreSQL from any number of
machines (``spectune worker --storage postgresql+psycopg://... --study NAME``), on SQLite from
one process. Each trial is chosen and created under the study's lock
(:func:`spectune.storage.study_lock`) from what the storage holds, so no two workers measure
the same candidate; while it runs, the worker's heartbeat thread marks it alive. A worker that
dies (even by SIGKILL) takes its engine with it (:class:`spectune.engines.VLLMServer`'s
watchdog), and its RUNNING trial goes stale: the next worker that asks fails it, and Optuna's
stale-trial callback queues it again (:func:`spectune.storage.open_optuna_storage`), for the
first worker that asks next.

A worker told to stop politely (SIGTERM, as Kubernetes evicts a pod; Ctrl-C) stops its engines
and hands their trials back at once: each is told FAIL as ``interrupted``, which the search
measures again first, on whichever worker asks next. A stop lands only where a worker waits
(:data:`spectune._util.STOPS`), never while it creates, records or tells a trial.

Every storage call of a worker goes through one :class:`spectune.storage.StorageGuard`. While
the storage is unreachable (PostgreSQL down or restarting, a SQLite file locked by another
process) the worker waits and tries again: it claims no trial and so starts no engine, an engine
already measuring goes on, and a measurement finished meanwhile is kept in memory and written
when the storage answers. Its heartbeat thread notes the failed beats and goes on. Once the
outage has lasted the study's ``storage_outage_limit`` (10 minutes by default), the worker stops
its engines and raises :class:`~spectune.errors.StorageUnreachableError` (one line naming the
storage); its unrecorded trials stay RUNNING and, after the grace period, are measured again.

An outage of the database stops every worker's heartbeat at once. A worker that has just seen
the storage come back therefore judges no trial stale until it has answered for two heartbeat
intervals, time enough for every live worker to beat again: an outage longer than the grace
period does not make live workers' trials stale. A worker cut off from a storage that others
still reach (a network partition) for longer than the grace period has its trial failed and
measured again elsewhere; its own measurement, when it comes, is dropped with a warning.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from spectune._util import STOPS, Stopped
from spectune.errors import SlotsLostError
from spectune.objective import TrialFunction
from spectune.search import SearchStrategy, snapshots
from spectune.slots import Slot, check_placement, parse_gpus
from spectune.storage import worker_claim
from spectune.study import StudyConfig, StudyContext, StudyEvent, StudyHook, StudyResult, create_study, plan_study
from spectune.worker._clock import replay_on_clock
from spectune.worker._loop import POLL_SECONDS as POLL_SECONDS
from spectune.worker._loop import SLOT_FAULTS_OUT
from spectune.worker._loop import _Worker as _Worker

if TYPE_CHECKING:
    from spectune.measurement import Measurement
    from spectune.trial import TrialHook

__all__ = ["Slot", "parse_gpus", "replay_on_clock", "run_study", "run_worker"]

_logger = logging.getLogger(__name__)

def run_worker(
    ctx: StudyContext,
    *,
    slots: list[Slot] | None = None,
    progress: StudyHook | None = None,
    trial_progress: Callable[[str], TrialHook | None] | None = None,
    measure_fn: Callable[..., Measurement] | None = None,
    strategy: SearchStrategy | None = None,
    poll_seconds: float | None = None,
    stop_signals: Sequence[int] = (),
    mixed_gpus: bool = False,
) -> StudyResult:
    """Work on study ``ctx`` until it needs no more trials: its budget of finished trials is spent
    (counted over every worker), the search has stopped and its rechecks and confirmations are
    done. ``slots``: one engine at a time on each (default: one, placed by the environment).
    ``poll_seconds``: how often a waiting worker looks again (default :data:`POLL_SECONDS`).
    ``mixed_gpus``: share the study with slots on other GPU models (:func:`~spectune.slots.check_placement`).

    ``stop_signals`` (``signal.SIGTERM``, ``signal.SIGINT``; from the main thread only) stop the
    worker politely: its engines are stopped (within 10 s), their trials told FAIL as
    ``interrupted`` at once, so that another worker measures them without waiting for the
    heartbeat's grace period, and it returns with :attr:`StudyResult.stopped` and
    :attr:`StudyResult.handed_back` set. A second signal meanwhile is ignored.

    While the storage is unreachable the worker waits for it (no engine starts; a measurement
    finished meanwhile is written when it answers), up to the study's ``storage_outage_limit``
    (:class:`~spectune.storage.StorageGuard`).

    Raises:
        StorageError: another process works on the same SQLite file (one line naming PostgreSQL).
        StorageUnreachableError: the storage stayed unreachable past ``storage_outage_limit``;
            every engine has stopped.
        ConfigError: GPU groups that do not fit the study (their size or, unless ``mixed_gpus``, model).
        SlotsLostError: every slot left the study, each after two faults of its own in a row.
        BaselineFailedError: the baseline failed for its own configuration; the study stops.
    Lets KeyboardInterrupt (not one of ``stop_signals``) through once every engine has stopped
    and its trial is marked ``interrupted``.
    """
    from spectune.trial import measure as measure_engine

    slots = slots or [Slot()]
    hook = progress or (lambda e: None)
    config = ctx.config
    guard = ctx.guard()
    with worker_claim(ctx.url), _stopping_on(stop_signals) as stopped:
        guard.call("joining the study", lambda: check_placement(ctx, slots, mixed_gpus=mixed_gpus))
        strategy = strategy or ctx.strategy(
            on_guide_stopped=lambda why: hook(StudyEvent("guide_stop", 0, config.trials, "", reason=why)),
            on_budget_spent=lambda spent: hook(StudyEvent("budget_stop", 0, config.trials, "", done=round(spent),
                                                          of=round(config.time_budget or 0))))
        run = TrialFunction(ctx, measure=measure_fn or measure_engine, hook=hook, trial_progress=trial_progress,
                            guard=guard, load_process=len(slots) > 1)  # engines side by side: clients that share no GIL
        worker = _Worker(ctx, strategy, run, slots, poll_seconds, guard)
        try:
            worker.run_slots()
        except Stopped:
            if not stopped:  # a Stopped no signal of ours asked for: not a polite stop
                raise
        if len(worker.lost) == len(slots) and not stopped:
            raise SlotsLostError(f"this worker stops: every slot failed {SLOT_FAULTS_OUT} times in a row for "
                                 f"reasons of its own, not of the configurations ({next(iter(worker.lost.values()))});"
                                 " their trials are handed back to the study")
    study = ctx.study

    def standing() -> tuple[list[int], int]:
        complete = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
        return ([t.number for t in study.best_trials] if complete else []), sum(1 for t in snapshots(study) if t.finished)

    if not stopped:
        best, finished = guard.call("reading where the study stands", standing)
    else:  # a polite stop does not wait for the storage
        try:
            best, finished = standing()
        except Exception as e:
            if not guard.failed(e):
                raise
            best, finished = [], 0
    return StudyResult(study_name=study.study_name, storage=ctx.url, **run.counts, best=best, finished=finished,
                       stopped=stopped[0] if stopped else None, handed_back=sorted(worker.handed_back))


@contextlib.contextmanager
def _stopping_on(signals: Sequence[int]) -> Iterator[list[str]]:
    """While the block runs, each of ``signals`` stops the worker politely (:data:`STOPS`); the
    list yielded gets the first one's name. Outside the main thread nothing changes (Python
    handles signals there only)."""
    got: list[str] = []
    if not signals or threading.current_thread() is not threading.main_thread():
        yield got
        return

    def handler(signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        if got:
            _logger.warning("%s: already stopping", name)
            return
        got.append(name)
        _logger.info("%s: stopping the engines and handing their trials back to the study", name)
        STOPS.stop_here()

    # a signal ignored when the worker started (nohup, a shell's background job) stays ignored
    before = {s: signal.signal(s, handler) for s in signals if signal.getsignal(s) is not signal.SIG_IGN}
    try:
        yield got
    finally:
        for s, previous in before.items():
            signal.signal(s, previous)
        STOPS.forget()


def run_study(
    config: StudyConfig,
    *,
    progress: StudyHook | None = None,
    trial_progress: Callable[[str], TrialHook | None] | None = None,
    measure_fn: Callable[..., Measurement] | None = None,
    gpus: str | None = None,
    stop_signals: Sequence[int] = (),
    mixed_gpus: bool = False,
) -> StudyResult:
    """Create (or resume) the study ``config`` describes and work on it in this process until it
    needs no more trials (:func:`spectune.study.create_study`, then :func:`run_worker`). Other
    workers may join it meanwhile (``spectune worker``); ``config.trials`` counts for the study.

    ``measure_fn`` replaces :func:`spectune.trial.measure` (same arguments): a recorded
    landscape answers with :meth:`spectune.landscape.Landscape.measurer`, to compare search
    strategies without engines. ``gpus``: one engine per GPU group at once (``"0,1"``, ``"0-1,2-3"``).
    ``stop_signals``, ``mixed_gpus``: as for :func:`run_worker`.

    Raises ConfigError / StorageError for bad input before anything is written, and lets
    KeyboardInterrupt through after the running engines have been stopped.
    """
    slots = parse_gpus(gpus)  # bad input first
    plan = plan_study(config)  # resolved once (the storage URL too), and handed down
    with worker_claim(plan.url):  # a second process on SQLite writes nothing
        return run_worker(create_study(config, plan), slots=slots, progress=progress, trial_progress=trial_progress,
                          measure_fn=measure_fn, stop_signals=stop_signals, mixed_gpus=mixed_gpus)
