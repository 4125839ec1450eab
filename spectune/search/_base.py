"""The search contract: what any worker asks for its next trial, from what the storage holds."""

from __future__ import annotations

import abc
import contextlib
import datetime
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spectune.records import TrialRecord

if TYPE_CHECKING:
    import optuna

__all__ = ["Decision", "Run", "SearchStrategy", "Snapshot", "Stop", "Wait", "snapshots"]


@dataclass(frozen=True)
class Snapshot:
    """One trial of a study as the search reads it: Optuna's state, parameters and values, and
    spectune's record."""

    number: int
    state: str
    """Optuna's state by name: WAITING, RUNNING, COMPLETE, FAIL or PRUNED."""
    params: dict[str, Any]
    values: list[float] | None
    rec: TrialRecord
    seconds: float | None = None
    """How long it has run: from its start to its end, or until now while it runs (None: not started)."""

    @classmethod
    def of(cls, t: optuna.trial.FrozenTrial) -> Snapshot:
        start, end = t.datetime_start, t.datetime_complete
        seconds = None if start is None else ((end or datetime.datetime.now()) - start).total_seconds()
        return cls(t.number, t.state.name, dict(t.params), list(t.values) if t.values is not None else None,
                   TrialRecord.of(t), seconds)

    @property
    def in_flight(self) -> bool:
        return self.state in ("RUNNING", "WAITING")

    @property
    def engine_failed(self) -> bool:
        """Failed for a reason of its engine (data), not by Ctrl-C nor by a dead worker's heartbeat."""
        return self.state == "FAIL" and self.rec.fail_reason is not None and not self.rec.interrupted

    @property
    def finished(self) -> bool:
        """Whether it spends the study's budget: completed or failed by its engine, not a
        candidate answered from an earlier trial, not a re-measurement."""
        return (self.rec.duplicate_of is None and not self.rec.measured_again
                and (self.state == "COMPLETE" or self.engine_failed))


def snapshots(study: optuna.Study) -> list[Snapshot]:
    """Every trial of ``study``, in number order, read once."""
    return [Snapshot.of(t) for t in study.get_trials(deepcopy=False)]


@dataclass(frozen=True)
class Run:
    """Measure a trial now.

    ``params``: the candidate's parameters (the space's names), enqueued with ``record`` as the
    trial's record; None lets the study's Optuna sampler choose (TPE, random, NSGA-II).
    """

    params: dict[str, Any] | None
    record: TrialRecord = field(default_factory=TrialRecord)
    """Why it runs (its record's fields so far: role, retry_of, confirms, recheck, prediction)."""
    why: str = ""
    progress: tuple[int, int] | None = None
    """(number, of) for the progress line when the strategy numbers it (confirmations)."""


@dataclass(frozen=True)
class Wait:
    """Nothing worth measuring can be chosen while the trials now running are unfinished: ask again
    once one of them has finished (or was failed by its heartbeat)."""

    why: str


@dataclass(frozen=True)
class Stop:
    """The study needs no more trials: the search and its confirmations are done, or (``failed``)
    it cannot go on (its baseline failed)."""

    why: str
    failed: bool = False


Decision = Run | Wait | Stop


class SearchStrategy(abc.ABC):
    """Chooses a study's next trial from what its storage holds, for any number of workers.

    Contract:
        :meth:`decide` reads the study's trials (every state: RUNNING ones are other workers'
        trials, and are never chosen again) and spectune's measurements, and returns a
        decision. It keeps no state of its own between calls: two workers, or a worker
        started tomorrow, that ask the same storage get the same answer. It writes nothing
        that a decision reads (a study attribute for the dashboard at most).

        A worker calls :meth:`decide` only while it holds the study's lock
        (:func:`spectune.storage.study_lock`) and turns a :class:`Run` into a RUNNING trial
        before it lets go, so no two workers are given the same candidate. Where the study
        holds WAITING trials (Optuna's re-queued copies of trials failed by their heartbeat), a
        worker runs those first and does not ask.

    Thread-safety: one instance may be shared by the threads of a worker (it holds no state).

        Work that takes long and writes nothing (offline replays of drafts and heads) goes in
        :meth:`prepare`, which a worker calls before it takes the lock, so that no slot or
        worker waits on it: under the lock (:meth:`locked`) a decision uses what is ready.
    """

    def prepare(self, study: optuna.Study) -> None:  # noqa: B027 - optional: nothing to prepare by default
        """Before the lock: run what the next decision would like to know and takes long."""

    def locked(self) -> contextlib.AbstractContextManager[None]:
        """Around :meth:`decide` under the study's lock: nothing slow may start there."""
        return contextlib.nullcontext()

    @abc.abstractmethod
    def decide(self, study: optuna.Study) -> Decision:
        """The next trial to run, a reason to wait, or the end of the study.

        Raises:
            StorageError: the storage cannot be read.
        """
