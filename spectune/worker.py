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
import os
import queue
import signal
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spectune._util import STOPS, Stopped, every
from spectune.config import candidate_label
from spectune.errors import (
    BaselineFailedError,
    EngineError,
    EngineSlotError,
    SlotsLostError,
    StorageUnreachableError,
)
from spectune.measurement import candidate_key
from spectune.objective import TrialFunction, trial_id
from spectune.records import (
    INTERRUPTED,
    RECORD_VERSION,
    Placement,
    TrialRecord,
    write_fields,
)
from spectune.search import (
    Run,
    SearchStrategy,
    Snapshot,
    Stop,
    StudyStrategy,
    Wait,
    snapshots,
)
from spectune.slots import Slot, check_placement, parse_gpus
from spectune.storage import StorageGuard, resolve_storage_url, study_lock, worker_claim
from spectune.study import (
    StudyConfig,
    StudyContext,
    StudyEvent,
    StudyHook,
    StudyResult,
    create_study,
)

if TYPE_CHECKING:
    import optuna

    from spectune.config import SpecConfig
    from spectune.measurement import Measurement
    from spectune.trial import TrialHook

__all__ = ["Slot", "parse_gpus", "replay_on_clock", "run_study", "run_worker"]

_logger = logging.getLogger(__name__)

MAX_ATTEMPTS_PER_TRIAL = 5
"""A sampler that keeps suggesting measured candidates is stopped after this many tries per trial."""

POLL_SECONDS = 5
"""How often a waiting worker looks at the study again (at most the heartbeat interval)."""

SLOT_FAULTS_OUT = 2
"""A slot whose engines fail this many times in a row for reasons of the slot
(:class:`~spectune.errors.EngineSlotError`) is taken out of the study."""

HOLD_OFF_BEATS = 2
"""After an outage, a worker judges no trial stale until the storage has answered for this many
heartbeat intervals: every live worker has beaten again by then."""


@contextlib.contextmanager
def _heartbeat(ctx: StudyContext, number: int, guard: StorageGuard) -> Iterator[None]:
    """Record the trial's heartbeat every ``heartbeat_interval`` seconds while it runs. A beat
    the storage does not take is noted by ``guard`` and the trial goes on; once the guard has
    given up, the beat stops this thread where it waits (its engine): the worker stops."""
    interval = ctx.storage.get_heartbeat_interval()
    if interval is None:
        yield
        return
    tid = guard.call(f"starting trial {number}", lambda: trial_id(ctx.storage, ctx.study.study_name, number),
                     stoppable=True)
    owner = threading.get_ident()
    stopping: list[bool] = []

    def beat() -> None:
        try:
            ctx.storage.record_heartbeat(tid)
        except Exception as e:
            if not guard.failed(e):
                _logger.warning("heartbeat of trial %d not recorded: %s", number, e)
        else:
            guard.succeeded()
        if not stopping and guard.expired(f"measuring trial {number}") is not None:
            stopping.append(True)
            STOPS.stop_thread(owner)

    with every(interval, beat, f"spectune-heartbeat-{number}"):
        yield


@dataclass
class _Claim:
    trial: optuna.Trial
    spec: SpecConfig
    knobs: dict[str, Any]
    """The values of the engine knobs the space tunes ({} without)."""
    progress: tuple[int, int]


class _Worker:
    """The loop of one worker process: each slot asks, claims, measures and tells."""

    def __init__(self, ctx: StudyContext, strategy: SearchStrategy, run: TrialFunction, slots: list[Slot],
                 poll: float | None, guard: StorageGuard) -> None:
        self.ctx = ctx
        self.strategy = strategy
        self.run = run
        self.slots = slots
        self.poll = poll if poll is not None else float(min(POLL_SECONDS, ctx.config.heartbeat_interval))
        self.guard = guard
        self.hold_off = HOLD_OFF_BEATS * ctx.config.heartbeat_interval
        self.host = socket.gethostname()
        self.handed_back: list[int] = []
        """Trials told FAIL as interrupted by a polite stop, for another worker to measure."""
        self.lost: dict[Slot, str] = {}
        """Slots taken out of the study, each with the last of its faults (:data:`SLOT_FAULTS_OUT`)."""

    def _fail_stale(self) -> None:
        """Fail the RUNNING trials whose heartbeat stopped (Optuna queues each again), unless the
        storage came back from an outage too recently for every live worker to have beaten."""
        import optuna

        if not self.guard.settled(self.hold_off):
            _logger.info("no trial judged stale yet: the storage is back from an outage")
            return
        optuna.storages.fail_stale_trials(self.ctx.study)

    def fail_stale(self) -> None:
        """:meth:`_fail_stale` under the study's lock, like every change to the queue."""
        import optuna

        def attempt() -> None:
            with study_lock(self.ctx.url, self.ctx.study.study_name), warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                self._fail_stale()

        self.guard.call("looking for stale trials", attempt, stoppable=True)

    def claim(self, slot: Slot) -> _Claim | Wait | Stop:
        """Under the study's lock: fail stale trials, then take a waiting trial or the search's
        decision, and start it (RUNNING) with its candidate and placement as attributes.

        Tried again while the storage is unreachable (:attr:`guard`), so that it may run more
        than once: a trial it asked for before it was cut off is taken up again, where no other
        worker has taken it meanwhile; a trial whose claim was cut off (RUNNING, without a
        placement) is taken up by the next claim."""
        import optuna

        study = self.ctx.study
        mine: list[optuna.Trial] = []  # the trial this claim started, across its tries
        progress: list[tuple[int, int] | None] = [None]
        placement = Placement(host=self.host, gpus=slot.label, pid=os.getpid())

        def attempt() -> _Claim | Wait | Stop:
            with study_lock(self.ctx.url, study.study_name), warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed")
                self._fail_stale()
                trials = snapshots(study)
                if mine and not _still_mine(study, mine[0], placement):
                    mine.clear()
                if not mine:
                    trial = _cut_off_claim(study)
                    if trial is None:
                        if not any(t.state == "WAITING" for t in trials):
                            with self.strategy.locked():  # no replay starts under the lock
                                decision = self.strategy.decide(study)
                            if not isinstance(decision, Run):
                                return decision
                            _logger.info("next trial: %s", decision.why)
                            if decision.params is not None:
                                study.enqueue_trial(decision.params, user_attrs=decision.record.attrs())
                            progress[0] = decision.progress
                        trial = study.ask()  # the oldest waiting trial: the one just enqueued, or a retried one
                    else:
                        _logger.info("trial %d: its claim was cut off; taken up", trial.number)
                    mine.append(trial)
                    # a heartbeat at once: should this worker stop before measuring it, the trial goes stale
                    if study._storage.get_heartbeat_interval() is not None:  # noqa: SLF001
                        study._storage.record_heartbeat(trial._trial_id)  # noqa: SLF001
                trial = mine[0]
                space = self.ctx.current_space()  # as guided search widened it, on any worker
                spec = space.suggest(trial)
                knobs = space.suggest_engine(trial)  # the study's sampler draws those not enqueued
                key = candidate_key(spec.to_vllm(), knobs)
                rec = TrialRecord.of(trial)
                earlier = None if rec.measured_again else _same_candidate(trials, key, trial.number)
                write_fields(trial, record_version=RECORD_VERSION, config=candidate_label(spec, knobs),
                             spec=spec.to_vllm() or {"method": "none"}, spec_key=key, engine=knobs or None,
                             placement=placement, duplicate_of=earlier)  # a duplicate is answered from the earlier trial
                return _Claim(trial, spec, knobs, progress[0] or _progress_of(trials, rec, self.ctx.config.trials))

        # the offline replays the decision would like, outside the lock: no other slot or worker waits on them
        self.guard.call("preparing the search", lambda: self.strategy.prepare(study), stoppable=True)
        return self.guard.call("claiming a trial", attempt, stoppable=True)

    def loop(self, slot: Slot) -> None:
        """Ask, measure and tell until the search says stop (or a sampler keeps repeating itself).

        Raises:
            StorageUnreachableError: the storage stayed unreachable past the limit (also when
                the heartbeat stopped this thread's engine for it).
        """
        try:
            self._loop(slot)
        except Stopped:
            if self.guard.gave_up is not None:  # stopped by the heartbeat for the outage, not by a signal
                raise self.guard.gave_up from None
            raise
        except StorageUnreachableError:
            with contextlib.suppress(Stopped):
                STOPS.check()  # the heartbeat's stop of this thread for the outage, should it not have landed
            raise

    def _loop(self, slot: Slot) -> None:
        attempts, faults = 0, 0
        limit = MAX_ATTEMPTS_PER_TRIAL * self.ctx.config.trials
        waited_on: tuple[tuple[int, str], ...] | None = None
        study = self.ctx.study
        while attempts < limit:
            STOPS.check()
            fingerprint = self.guard.call("reading the study", lambda: tuple(
                (t.number, t.state.name) for t in study.get_trials(deepcopy=False)), stoppable=True)
            if fingerprint == waited_on:  # nothing finished since the last answer was to wait
                self.pause()
                self.fail_stale()  # a dead worker's trial, queued again, changes the fingerprint
                continue
            claimed = self.claim(slot)
            if isinstance(claimed, Stop):
                if claimed.failed:
                    raise BaselineFailedError(claimed.why)
                _logger.info("worker stops: %s", claimed.why)
                return
            if isinstance(claimed, Wait):
                _logger.info("worker waits: %s", claimed.why)
                waited_on = fingerprint
                self.pause()
                continue
            waited_on = None
            attempts += 1
            fault = self.measure(claimed, slot)
            faults = faults + 1 if fault is not None else 0
            if faults >= SLOT_FAULTS_OUT:
                self.lost[slot] = str(fault)
                _logger.warning("%s is taken out of the study: %d engines in a row failed for reasons of the slot, "
                                "not of their configurations (%s: %s); its trials go to other slots and workers",
                                slot.name, faults, fault.cause if fault else "", fault)
                return
        _logger.warning("worker stops after %d trials: the sampler keeps suggesting measured candidates", attempts)

    def pause(self) -> None:
        """Wait :attr:`poll` seconds before asking the study again (a stop may land here)."""
        with STOPS.waiting():
            time.sleep(self.poll)

    def measure(self, claimed: _Claim, slot: Slot) -> EngineSlotError | None:
        """Run the trial with its heartbeat and tell Optuna how it ended; KeyboardInterrupt and
        other errors are told as FAIL, then go on up (a polite stop's trial: :attr:`handed_back`).
        An engine that failed for a reason of the slot is returned (its trial handed back).
        While the storage is unreachable the tell is tried again (:attr:`guard`); a trial another
        worker failed as stale meanwhile is left to the retry Optuna queued for it."""
        import optuna

        trial, study = claimed.trial, self.ctx.study
        FAIL = optuna.trial.TrialState.FAIL  # noqa: N806
        with _heartbeat(self.ctx, trial.number, self.guard):
            try:
                engine = self.ctx.engine.model_copy(update=claimed.knobs) if claimed.knobs else self.ctx.engine
                values = self.run(trial, claimed.spec, claimed.progress, engine=slot.place(engine))
            except EngineError as e:  # data, or the slot's fault: recorded by the trial function
                self.guard.call(f"telling trial {trial.number}",
                                lambda: study.tell(trial, state=FAIL, skip_if_finished=True))
                return e if isinstance(e, EngineSlotError) else None
            except optuna.exceptions.UpdateFinishedTrialError:
                _logger.warning("trial %d was failed as stale by another worker while this one could not reach "
                                "the storage (longer than the grace period, %d s): its result is dropped, and the "
                                "trial is measured again", trial.number, self.ctx.config.grace_period)
                return None
            except BaseException as e:
                if self._hand_back(trial) and isinstance(e, Stopped) and self.guard.gave_up is None:
                    self.handed_back.append(trial.number)
                raise
        self.guard.call(f"telling trial {trial.number}",
                        lambda: study.tell(trial, values if len(values) > 1 else values[0], skip_if_finished=True))
        return None

    def _hand_back(self, trial: optuna.Trial) -> bool:
        """Tell an interrupted trial FAIL as ``interrupted`` (measured again first), trying the
        storage once: True when told. A trial the storage does not take now stays RUNNING and,
        after the grace period, is measured again."""
        import optuna

        def tell() -> None:
            if TrialRecord.of(trial).fail_reason is None:
                write_fields(trial, fail_reason=INTERRUPTED)
            self.ctx.study.tell(trial, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)

        try:
            tell()
        except Exception as e:
            if not self.guard.failed(e) and not isinstance(e, optuna.exceptions.UpdateFinishedTrialError):
                raise
            _logger.warning("trial %d not handed back: the storage is unreachable; it is measured again after "
                            "the grace period", trial.number)
            return False
        self.guard.succeeded()
        return True

    def run_slots(self) -> None:
        """One slot in this thread; several in threads of their own. Ctrl-C or a polite stop
        (in this thread) is raised in every slot's thread too, where it waits, so that each stops
        its engine and marks its trial interrupted."""
        if len(self.slots) == 1:
            self.loop(self.slots[0])
            return
        errors: list[BaseException] = []
        ended: queue.SimpleQueue[Slot] = queue.SimpleQueue()

        def target(slot: Slot) -> None:
            try:
                self.loop(slot)
            except BaseException as e:
                errors.append(e)
            finally:
                ended.put(slot)

        threads = [threading.Thread(target=target, args=(s,), name=f"spectune-slot-{s.label}") for s in self.slots]
        for t in threads:
            t.start()
        try:
            with STOPS.waiting():
                for _ in threads:  # not Thread.join: Python 3.11 takes a thread interrupted there for ended
                    ended.get()
        except KeyboardInterrupt:
            for t in threads:
                if t.is_alive() and t.ident is not None:
                    STOPS.stop_thread(t.ident)
            for t in threads:
                t.join()
            raise
        for t in threads:
            t.join()
        if errors:
            raise errors[0]


def _still_mine(study: optuna.Study, trial: optuna.Trial, placement: Placement) -> bool:
    """Whether ``trial``, started by a claim that was cut off, is still this claim's to finish:
    RUNNING, and taken up by no other claim meanwhile (:func:`_cut_off_claim`)."""
    frozen = study._storage.get_trial(trial._trial_id)  # noqa: SLF001
    taken = TrialRecord.of(frozen).placement
    return frozen.state.name == "RUNNING" and (taken is None or taken == placement)


def _cut_off_claim(study: optuna.Study) -> optuna.Trial | None:
    """A RUNNING trial without a placement: a claim (which writes it last, under the study's
    lock, which is held now) started it and was cut off, by the storage or by the end of its
    worker. The oldest, to be claimed again; None when there is none."""
    import optuna

    for frozen in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        rec = TrialRecord.of(frozen)
        if rec.placement is None and rec.imported is None:
            return optuna.Trial(study, frozen._trial_id)  # noqa: SLF001
    return None


def _progress_of(trials: Sequence[Snapshot], rec: TrialRecord, budget: int) -> tuple[int, int]:
    """(number, of) of a search trial about to run, for the progress line: the search's trials
    count up to the budget (a re-measurement counts no new candidate)."""
    return sum(1 for t in trials if t.finished) + (not rec.measured_again), budget


def _same_candidate(trials: list[Snapshot], key: str, number: int) -> int | None:
    """An earlier trial of candidate ``key`` that completed, failed by its engine, or runs: a
    sampler's repeat is answered from it."""
    for t in trials:
        r = t.rec
        if t.number == number or r.spec_key != key or r.duplicate_of is not None or r.measured_again or r.imported:
            continue
        if t.state in ("COMPLETE", "RUNNING") or t.engine_failed:
            return t.number
    return None


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
    guard = StorageGuard(ctx.url, config.storage_outage_limit)
    with worker_claim(ctx.url), _stopping_on(stop_signals) as stopped:
        guard.call("joining the study", lambda: check_placement(ctx, slots, mixed_gpus=mixed_gpus))
        strategy = strategy or StudyStrategy(
            space=ctx.space, store=ctx.store, url=ctx.url, sampler=config.sampler, objectives=len(config.objectives),
            trials=config.trials, confirm=config.confirm, time_budget=config.time_budget, tolerance=config.tolerance,
            extend=config.extend,
            on_guide_stopped=lambda why: hook(StudyEvent("guide_stop", 0, config.trials, "", reason=why)),
            on_budget_spent=lambda spent: hook(StudyEvent("budget_stop", 0, config.trials, "", done=round(spent),
                                                          of=round(config.time_budget or 0))))
        run = TrialFunction(config=config, study=ctx.study, storage=ctx.storage, store=ctx.store, engine=ctx.engine,
                            prompts=ctx.prompts, measure=measure_fn or measure_engine, hook=hook,
                            trial_progress=trial_progress, guard=guard,
                            load_process=len(slots) > 1)  # engines side by side: clients that share no GIL
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
    with worker_claim(resolve_storage_url(config.storage)):  # a second process on SQLite writes nothing
        return run_worker(create_study(config), slots=slots, progress=progress, trial_progress=trial_progress,
                          measure_fn=measure_fn, stop_signals=stop_signals, mixed_gpus=mixed_gpus)


def replay_on_clock(config: StudyConfig, measure_fn: Callable[..., Measurement],
                    seconds: Callable[[SpecConfig], float], slots: int) -> list[tuple[float, str]]:
    """Study ``config`` worked on by ``slots`` slots of one worker on a virtual clock, without
    engines, threads or sleeping: ``measure_fn`` answers each trial (a landscape's
    :meth:`~spectune.landscape.Landscape.measurer`), which takes ``seconds(spec)`` of the clock
    (called once per trial, in the order they start); a slot told to wait asks again once the
    next trial ends, and free slots ask in turn. The worker's own claim and measure do the rest,
    so that the order is the one real workers would take, in engine seconds. The trials in the
    order they ended, each with the virtual second it ended."""
    import heapq

    from spectune.objective import TrialFunction

    ctx = create_study(config)
    guard = StorageGuard(ctx.url, config.storage_outage_limit)
    strategy = StudyStrategy(space=ctx.space, store=ctx.store, url=ctx.url, sampler=config.sampler,
                             objectives=len(config.objectives), trials=config.trials, confirm=config.confirm,
                             time_budget=config.time_budget, tolerance=config.tolerance, extend=config.extend)
    run = TrialFunction(config=config, study=ctx.study, storage=ctx.storage, store=ctx.store, engine=ctx.engine,
                        prompts=ctx.prompts, measure=measure_fn, hook=lambda e: None, guard=guard)
    worker = _Worker(ctx, strategy, run, [Slot((i,)) for i in range(slots)], 0.0, guard)
    now, asking = 0.0, list(range(slots))
    running: list[tuple[float, int, int, _Claim]] = []
    ended: list[tuple[float, str]] = []
    while True:
        waiting = []
        for i in asking:
            claimed = worker.claim(worker.slots[i])
            if isinstance(claimed, Wait):
                waiting.append(i)
            elif not isinstance(claimed, Stop):
                heapq.heappush(running, (now + seconds(claimed.spec), claimed.trial.number, i, claimed))
        if not running:
            return ended
        now, _, i, claimed = heapq.heappop(running)
        with contextlib.suppress(EngineError):
            worker.measure(claimed, worker.slots[i])
        ended.append((now, claimed.spec.label()))
        asking = sorted({*waiting, i})
