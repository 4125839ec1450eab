"""The study's trial function: one Optuna trial -> one engine run (or the reuse of an earlier
one), its figures as trial attributes and its Measurement in spectune's table.

A failed engine is data: the trial's ``fail_reason`` and the table say why, and
:class:`~spectune.errors.EngineError` is raised for the worker to tell Optuna FAIL. An engine
that failed for a reason of its slot (:class:`~spectune.errors.EngineSlotError`) says nothing
about its candidate: the trial is marked handed back, measured again and not counted. Ctrl-C or a
polite stop (SIGTERM) goes through as KeyboardInterrupt, for the worker to mark the trial
``interrupted`` (measured again later); a polite stop lands only while the engine runs, never
while the result is recorded.

Every storage call goes through the worker's :class:`~spectune.storage.StorageGuard`: a trial
starts its engine only once the storage has answered, and a measurement finished while the
storage is unreachable is kept in memory and written when it answers again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from spectune._util import STOPS
from spectune.answers import ANSWERS, AnswerRule, Fidelity, compare
from spectune.errors import ConfigError, EngineError, EngineSlotError
from spectune.measurement import relative_noise, spec_key, speedup
from spectune.records import TrialRecord, handed_back, write_fields, write_study_fields
from spectune.storage import StorageGuard
from spectune.study import StudyContext, StudyEvent, StudyHook, features_with_outputs

if TYPE_CHECKING:
    import optuna

    from spectune.config import EngineArgs, SpecConfig
    from spectune.measurement import Measurement
    from spectune.space import SearchSpace
    from spectune.trial import TrialHook

__all__ = ["TrialFunction", "headline", "trial_id"]

_logger = logging.getLogger(__name__)


def step_tokens(space: SearchSpace) -> list[int]:
    """The new tokens per request the baseline's step-cost curve is timed at: up to one more than
    the most drafts a candidate of ``space`` makes (:func:`~spectune.stepcost.probe_tokens`); none
    where no candidate speculates."""
    from spectune.predict import effective_k
    from spectune.stepcost import probe_tokens

    try:
        candidates = space.enumerate_candidates(limit=STEP_COST_CANDIDATES)
    except ConfigError:  # too many to list
        return probe_tokens(UNLISTED_K)
    ks = [effective_k(spec) or UNLISTED_K for spec, _ in candidates if not spec.is_baseline]
    return probe_tokens(max(ks)) if ks else []


UNLISTED_K = 8
"""Drafts per step assumed for the step-cost points where the space cannot be listed, or a proposer's
own configuration decides (MTP, Medusa)."""

STEP_COST_CANDIDATES = 10_000
"""A space of more candidates than this is not listed for its largest ``k``."""


def headline(m: Measurement) -> TrialRecord:
    """The figures of a measurement a person reads in the dashboard, as record fields."""
    acc = m.acceptance
    return TrialRecord(
        output_throughput=round(m.output_throughput, 3), tpot_median_ms=m.tpot_ms.median,
        ttft_p99_ms=m.ttft_ms.p99, e2el_median_ms=m.e2el_ms.median,
        acceptance_rate=acc.acceptance_rate if acc else None,
        mean_acceptance_length=acc.mean_acceptance_length if acc else None,
        per_position_acceptance=acc.per_position if acc else None,
        startup_seconds=round(m.startup_seconds, 2), failed_requests=m.num_failed,
        peak_memory_bytes=m.peak_memory_bytes, memory_kind=m.memory_kind, kv_cache_tokens=m.kv_cache_tokens,
        bursty_delivery=m.bursty_delivery,
        step_cost=[p.model_dump(exclude_none=True) for p in m.step_cost.points] if m.step_cost else None,
        step_cost_seconds=round(m.step_cost.seconds, 2) if m.step_cost else None,
    )


def trial_id(storage: optuna.storages.BaseStorage, study_name: str, number: int) -> int:
    """A trial's id in the storage (what spectune's table and heartbeats are keyed by)."""
    return storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(study_name), number)


@dataclass
class TrialFunction:
    """Measures a study's trials: the engine arguments, workload and objectives of one study,
    all read from its context ``ctx`` (:class:`~spectune.study.StudyContext`).

    Thread-safe: the workers of one process (one per GPU group) share it; each call runs its own
    engine. ``measure`` is :func:`spectune.trial.measure` or a stand-in with its arguments (a
    recorded landscape's :meth:`~spectune.landscape.Landscape.measurer`). ``guard``: the worker's
    (default: :meth:`StudyContext.guard <spectune.study.StudyContext.guard>`).
    """

    ctx: StudyContext
    measure: Callable[..., Measurement]
    hook: StudyHook
    trial_progress: Callable[[str], TrialHook | None] | None = None
    guard: StorageGuard = field(default=None)  # type: ignore[assignment]
    load_process: bool = False
    """Each trial's requests from a process of its own (several engines measured at once)."""

    def __post_init__(self) -> None:
        self.counts = {"measured": 0, "failed": 0, "reused": 0}
        if self.guard is None:
            self.guard = self.ctx.guard()
        self.step_tokens = step_tokens(self.ctx.space) if self.ctx.config.step_cost else []
        """New tokens per request at which the baseline's engine times its steps (none: not asked)."""

    def __call__(self, trial: optuna.Trial, spec: SpecConfig, progress: tuple[int, int],
                 engine: EngineArgs | None = None) -> list[float]:
        """Measure ``trial`` (its candidate ``spec``, already set as its attributes), numbered
        ``progress`` = (number, of) for the progress hook, on ``engine`` (the study's engine
        arguments placed on a GPU group; default: the study's). The objective values.

        Raises:
            EngineError: the engine failed (recorded).
            StorageUnreachableError: the storage stayed unreachable past the guard's limit.
            optuna.exceptions.UpdateFinishedTrialError: the trial was finished meanwhile by another
                worker (failed as stale): nothing was recorded.
        """
        number, of = progress
        rec = TrialRecord.of(trial)
        name = rec.config or spec.label()  # with the engine knobs' values where the space tunes some
        label = name if rec.confirms is None else f"{name} (again, as #{rec.confirms})"
        self.hook(StudyEvent("trial_start", number, of, label, trial=trial.number))
        if rec.duplicate_of is not None:
            return self._reuse(trial, name, rec.duplicate_of, progress)
        phase_hook = self.trial_progress(name) if self.trial_progress else None
        key = rec.spec_key or spec_key(spec.to_vllm())
        # the storage answers before an engine starts (a stop may land while it does not)
        tid = self.guard.call(f"starting trial {trial.number}",
                              lambda: trial_id(self.ctx.storage, self.ctx.study.study_name, trial.number),
                              stoppable=True)
        cfg = self.ctx.config
        try:
            with STOPS.waiting():  # a polite stop lands here, never while the result is recorded
                m = self.measure(engine or self.ctx.engine, spec, cfg.workload, self.ctx.prompts, log_dir=cfg.log_dir,
                                 startup_timeout=cfg.startup_timeout, window_timeout=cfg.window_timeout,
                                 progress=phase_hook, repeats=cfg.repeats,
                                 answer_margins=cfg.answers is not AnswerRule.OFF,  # off: no answers to classify
                                 **({"load_process": True} if self.load_process else {}),
                                 **({"step_cost": self.step_tokens} if spec.is_baseline and self.step_tokens else {}))
            values = [o.of(m) for o in cfg.objectives]
        except EngineSlotError as e:  # the slot's fault, not the candidate's: handed back, uncounted
            reason = handed_back(e.cause, str(e))
            self.guard.call(f"recording trial {trial.number}'s hand-back", lambda: write_fields(trial, fail_reason=reason))
            self._end(number, of, name, "HANDED BACK", None, f"{e.cause}: {e}", trial=trial.number)
            raise
        except EngineError as e:
            self.counts["failed"] += 1
            error = str(e)

            def record_failure() -> None:
                write_fields(trial, fail_reason=error)
                self.ctx.store.record(study_name=self.ctx.study.study_name, trial_id=tid, trial_number=trial.number,
                                      spec_key=key, error=error)

            self.guard.call(f"recording trial {trial.number}'s failure", record_failure)
            self._end(number, of, name, "FAIL", None, str(e), trial=trial.number)
            raise
        self.counts["measured"] += 1
        # kept here until written: tried again while the storage is unreachable
        self.guard.call(f"recording trial {trial.number}'s measurement",
                        lambda: self._record(trial, rec, tid, spec, m, values))
        self._end(number, of, name, "COMPLETE", values, None, finishing=(trial.number, values), trial=trial.number)
        return values

    def _record(self, trial: optuna.Trial, rec: TrialRecord, tid: int, spec: SpecConfig, m: Measurement,
                values: list[float]) -> None:
        """Write the measurement: the trial's attributes and constraints, spectune's row. Each
        write replaces, so that a second run after a failed one leaves what one run would."""
        primary = self.ctx.config.objectives[0]
        first_baseline = spec.is_baseline and rec.confirms is None
        base_trial = None if first_baseline else self._baseline_trial()
        base = values[0] if first_baseline else base_trial.values[0] if base_trial is not None else None
        constraints = self.ctx.config.slo.violations(m)
        fidelity = self._fidelity(base_trial, m)
        if fidelity is not None and not spec.is_baseline and self.ctx.config.answers is not AnswerRule.OFF:
            constraints[ANSWERS] = float(fidelity.broken(self.ctx.config.answers))
            if (line := fidelity.refusal(rec.config or spec.label(), self.ctx.config.answers)) is not None:
                _logger.warning("%s: ruled out (--answers %s)", line, self.ctx.config.answers.value)
        for slo_name, value in constraints.items():
            trial.set_constraint(slo_name, value)
        levels = primary.of_levels(m)
        headline(m).model_copy(update={
            "level_values": {f"{c:g}": round(v, 4) for c, v in levels.items()} if levels else None,
            "speedup": round(speedup(primary.maximize, values[0], base), 4) if base is not None else None,
            "noise": relative_noise(primary, m), "constraints": constraints,
            "fidelity": fidelity.model_dump(mode="json") if fidelity is not None else None,
            "feasible": all(c <= 0 for c in constraints.values()),
        }).write(trial)
        self.ctx.store.record(study_name=self.ctx.study.study_name, trial_id=tid, trial_number=trial.number,
                              spec_key=rec.spec_key or spec_key(spec.to_vllm()), measurement=m)
        if spec.is_baseline and rec.confirms is None:  # the target's own outputs: repetition features
            features = features_with_outputs(self.ctx.prompts, m)
            write_study_fields(self.ctx.study, workload_features=features.model_dump(mode="json"))

    def _reuse(self, trial: optuna.Trial, name: str, dup: int, progress: tuple[int, int]) -> list[float]:
        """A candidate the sampler chose again: answered from trial ``dup`` (waited for while it
        runs on another worker), no engine started."""
        previous = self._wait_finished(dup)
        before = TrialRecord.of(previous)

        def copy() -> None:
            before.model_copy(update={"role": None, "retry_of": None, "duplicate_of": None, "placement": None}).write(trial)
            for slo_name, value in (before.constraints or {}).items():
                trial.set_constraint(slo_name, value)

        self.guard.call(f"recording trial {trial.number}", copy)
        self.counts["reused"] += 1
        if previous.state.name != "COMPLETE":
            reason = f"same candidate as trial {previous.number}: {before.fail_reason or 'failed'}"
            self.guard.call(f"recording trial {trial.number}", lambda: write_fields(trial, fail_reason=reason))
            self._end(*progress, name, "FAIL", None, reason, trial=trial.number)
            raise EngineError(reason)
        values = list(previous.values)
        self._end(*progress, name, "REUSED", values, None, trial=trial.number)
        return values

    def _wait_finished(self, number: int, poll: float = 2.0) -> optuna.trial.FrozenTrial:
        while True:
            t = self.guard.call(f"waiting for trial {number}",
                                lambda: self.ctx.study.get_trials(deepcopy=False)[number], stoppable=True)
            if t.state.is_finished():
                return t
            with STOPS.waiting():
                time.sleep(poll)

    def _baseline_trial(self) -> optuna.trial.FrozenTrial | None:
        """The study's first completed baseline trial (not a re-measurement)."""
        for t in self.ctx.study.get_trials(deepcopy=False):
            rec = TrialRecord.of(t)
            if t.state.name == "COMPLETE" and rec.spec in (None, {"method": "none"}) and rec.confirms is None \
                    and rec.duplicate_of is None:
                return t
        return None

    def _fidelity(self, base_trial: optuna.trial.FrozenTrial | None, m: Measurement) -> Fidelity | None:
        """``m``'s answers against the baseline's (None: no check, no baseline measured yet, or
        nothing to compare: :func:`spectune.answers.compare`). A trial that finished before the
        baseline is compared where the study is read (:class:`spectune.results.StudyView`)."""
        cfg = self.ctx.config
        if cfg.answers is AnswerRule.OFF or base_trial is None or cfg.workload.sampling.temperature > 0:
            return None
        base_m = self.ctx.store.measurement(trial_id(self.ctx.storage, self.ctx.study.study_name, base_trial.number))
        return compare(base_m, m) if base_m is not None else None

    def _end(self, number: int, of: int, name: str, state: str, values: list[float] | None,
             reason: str | None, finishing: tuple[int, list[float]] | None = None, *, trial: int | None = None) -> None:
        label, gain = self.guard.call("reading the best so far", lambda: self.best_so_far(finishing))
        self.hook(StudyEvent("trial_end", number, of, name, state=state, values=values, reason=reason,
                             best_label=label, best_speedup=gain, trial=trial))

    def best_so_far(self, finishing: tuple[int, list[float]] | None = None) -> tuple[str | None, float | None]:
        """The best feasible configuration so far and its speedup, among the configurations
        ``show`` and ``export`` would choose from (:meth:`StudyView.contenders`: each at its mean
        over the engines that measured it; once the study confirms, the confirmed ones), the
        trial ``finishing`` now with its values too (it is not COMPLETE until it is told)."""
        from spectune.measurement import speedup
        from spectune.results import StudyView

        view = StudyView(self.ctx.study, self.ctx.store, self.ctx.store.url)
        on_front: list[int] = []
        if finishing is not None:
            number, values = finishing
            view.rows = [replace(r, state="COMPLETE", values=values) if r.number == number else r for r in view.rows]
            on_front = [number]
        base, candidates, _ = view.contenders(on_front=on_front)
        best: tuple[str | None, float | None] = (None, None)
        for c in candidates if base is not None else ():
            s = speedup(self.ctx.config.objectives[0].maximize, c.value, base.value)
            if best[1] is None or s > best[1]:
                best = (c.row.label, s)
        return best
