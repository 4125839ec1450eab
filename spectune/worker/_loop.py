"""The worker's loop: claim a trial under the study's lock, measure it on a slot with a heartbeat,
record it; hand it back when stopped or when the slot is at fault (:class:`_Worker`)."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import socket
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spectune._util import STOPS, Stopped, every
from spectune.config import candidate_label
from spectune.errors import BaselineFailedError, EngineError, EngineSlotError, StorageUnreachableError
from spectune.measurement import candidate_key
from spectune.objective import TrialFunction, trial_id
from spectune.records import INTERRUPTED, RECORD_VERSION, Placement, TrialRecord, write_fields
from spectune.search import Run, SearchStrategy, Snapshot, Stop, Wait, snapshots
from spectune.slots import Slot
from spectune.storage import StorageGuard, study_lock
from spectune.study import StudyContext

if TYPE_CHECKING:
    import optuna

    from spectune.config import SpecConfig

_logger = logging.getLogger("spectune.worker")

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


