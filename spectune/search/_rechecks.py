"""What guided search measures again on a fresh engine, and why: the baseline where no engine
spread is known, a pick far from its prediction, the best and its rivals before the search stops,
the baseline and the best while the gain lies within the band; and ``confirm``'s confirmations
after the search. Each is a re-measurement (``confirms``): it spends no budget."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from spectune.config import SpecConfig
from spectune.measurement import spec_key
from spectune.records import (
    KNOBS_BY_SAMPLER,
    RECHECK_BASELINE,
    RECHECK_BEST,
    RECHECK_CONTENDER,
    RECHECK_SPREAD,
    RECHECK_SURPRISE,
    TrialRecord,
)
from spectune.search._base import Decision, Run, Snapshot
from spectune.search._standing import STOP_CHANCE, Standing, best_measured

if TYPE_CHECKING:
    import optuna

    from spectune.results import StudyView
    from spectune.space import SearchSpace
    from spectune.storage import MeasurementStore

__all__ = ["LEARN_SPREAD_MIN_CANDIDATES", "SETTLE_STARTS", "Rechecks", "measured_again"]

_logger = logging.getLogger(__name__)


SETTLE_STARTS = 3
"""A choice of the baseline because the best gain lies within the band is settled by measuring the
two again, the one on fewer engines first, up to this many engines each."""

LEARN_SPREAD_MIN_CANDIDATES = 4
"""Guided search measures the baseline twice first (:data:`RECHECK_SPREAD`) only in a space of at
least this many speculative candidates: in a smaller one, measuring them all costs about as much."""


def measured_again(trials: Sequence[Snapshot]) -> set[int]:
    """The trials whose configuration is measured again on a fresh engine (``confirms``), queued,
    running or done: completed, or failed by its engine (that is data, not retried on resume).
    One interrupted by Ctrl-C, or abandoned by a dead worker, does not count."""
    return {t.rec.confirms for t in trials if t.rec.confirms is not None
            and (t.state in ("WAITING", "RUNNING", "COMPLETE") or t.engine_failed)}


def _again(trials: Sequence[Snapshot], number: int, why: str) -> Run:
    """Trial ``number``'s configuration measured again on a fresh engine, for guided search's
    reason ``why`` (a RECHECK_* of :mod:`spectune.records`)."""
    first = next(t for t in trials if t.number == number)
    return Run(first.params, TrialRecord(confirms=number, recheck=why), why=f"{why}, again on a fresh engine")


class Rechecks:
    """The re-measurements of :class:`spectune.search.StudyStrategy`, which holds these fields."""

    space: SearchSpace
    store: MeasurementStore
    url: str
    confirm: int

    def _learn_spread(self, view: StudyView, trials: Sequence[Snapshot]) -> Run | None:
        """The baseline again on a fresh engine before the first guided pick, where nothing on this
        machine was measured twice (the spread is its prior alone) and the space holds at least
        :data:`LEARN_SPREAD_MIN_CANDIDATES`: one more start buys the figure that lets the stopping
        rule rule candidates out, and the band its measured width. None otherwise."""
        base = view.baseline()
        if base is None or view.spread(confirmations=False).source != "prior" \
                or base.number in measured_again(trials) or any(t.rec.guided for t in trials) \
                or sum(1 for s in self.space.enumerate() if not s.is_baseline) < LEARN_SPREAD_MIN_CANDIDATES:
            return None
        _logger.info("no engine spread is known on this machine: measuring the baseline again first")
        return _again(trials, base.number, RECHECK_SPREAD)

    def _last_measurements(self, view: StudyView, trials: Sequence[Snapshot], standing: Standing,
                           unmeasured: float) -> Run | None:
        """What to measure again before the search stops (the best on a second engine, a rival
        that could still beat it, the baseline, the engine knobs), or None."""
        top = standing.top
        again = measured_again(trials)  # measured again already (a failed engine is data: not again)
        contenders = [(c, p) for c, p in standing.contenders() if c.row.number not in again]
        if top is not None and len(top.values) == 1 and top.row.number not in again \
                and (contenders or unmeasured > STOP_CHANCE or standing.chance(settled=True) > STOP_CHANCE):
            _logger.info("guided search would stop; first measuring its best, %s, on a second engine", top.row.label)
            return _again(trials, top.row.number, RECHECK_BEST)
        if contenders:  # a rival measured once could still beat the pick: once more
            rival, chance = contenders[0]
            _logger.info("guided search would stop; first measuring %s again (a %.0f %% chance of beating %s by "
                         "more than %.1f %%)", rival.row.label, 100 * chance, top.row.label if top else "-",
                         100 * standing.tolerance)
            return _again(trials, rival.row.number, RECHECK_CONTENDER)
        if (base_again := self._recheck_baseline(view, trials)) is not None:
            return base_again
        return self._explore_knobs(view, trials)

    def _recheck_baseline(self, view: StudyView, trials: Sequence[Snapshot]) -> Run | None:
        """Where the search would stop with the baseline chosen because the best speculative
        configuration's gain lies within the band: the one of the two tried on fewer engines (the
        baseline first) on one more, until each was tried on :data:`SETTLE_STARTS`. Each start
        narrows the band's engine part (:func:`spectune.results.paired_band`). None otherwise."""
        choice = view.best()
        if not choice.within_band:
            return None
        base, competing, _ = view.contenders()
        sign = 1.0 if view.maximize else -1.0
        rival = max((c for c in competing if not c.row.is_baseline), key=lambda c: sign * c.value, default=None)
        if base is None or rival is None:
            return None

        def tried(number: int) -> int:  # its first engine, and each again queued, running, done or failed by its engine
            return 1 + sum(1 for t in trials if t.rec.confirms == number
                           and (t.state in ("WAITING", "RUNNING", "COMPLETE") or t.engine_failed))

        for c, why in sorted(((base, RECHECK_BASELINE), (rival, RECHECK_CONTENDER)), key=lambda cw: tried(cw[0].row.number)):
            if tried(c.row.number) < SETTLE_STARTS:
                _logger.info("guided search would stop; first measuring %s again (%s)", c.row.label, choice.reason)
                return _again(trials, c.row.number, why)
        return None

    def _recheck_surprise(self, trials: Sequence[Snapshot], standing: Standing | None = None) -> Run | None:
        """A fresh-engine measurement of a guided pick measured outside its predicted interval
        (:func:`spectune.predict.surprising`) and not measured again yet. With the search's
        ``standing``, only a pick that still matters: its measurement leaves it more than
        :data:`STOP_CHANCE` of beating the pick by more than the tolerance (a surprise far below
        the pick moves nothing the decision needs)."""
        from spectune.predict import surprising

        again = measured_again(trials)
        for t in trials:
            r = t.rec
            if t.state == "COMPLETE" and r.guided and r.duplicate_of is None and not r.measured_again \
                    and t.number not in again and t.values and r.predicted_low is not None \
                    and r.predicted_high is not None and surprising(r.predicted_low, r.predicted_high, t.values[0]) \
                    and (standing is None or standing.matters(t)):
                _logger.info("trial %d measured %.4g, outside its predicted interval [%.4g, %.4g]: measuring it again",
                             t.number, t.values[0], r.predicted_low, r.predicted_high)
                return Run(t.params, TrialRecord(confirms=t.number, recheck=RECHECK_SURPRISE),
                           why=f"trial {t.number} {RECHECK_SURPRISE}")
        return None

    def _confirmations(self, study: optuna.Study, trials: Sequence[Snapshot]) -> Decision | None:
        """A fresh-engine measurement of the baseline or of one of the ``confirm`` best feasible
        configurations by the first objective, each measured on one engine only so far (a
        resumed study does not confirm twice; more searching, or a larger ``confirm``,
        confirms the new best)."""
        if not self.confirm:
            return None
        from spectune.results import StudyView

        view = StudyView(study, self.store, self.url)
        configs = view.engines()
        sign = 1.0 if view.directions[0] == "maximize" else -1.0
        # ranked by their first engine, as the search met them: a resumed study confirms the same ones
        # (a configuration guided search already measured twice takes its place without a third)
        ranked = sorted((c for c in configs if c.feasible and not c.row.is_baseline), key=lambda c: -sign * c.values[0])
        if len(view.directions) > 1:  # two objectives: the configurations of the Pareto front
            front = {t.number for t in study.best_trials}
            ranked = [c for c in ranked if front.intersection(c.numbers)]
        chosen = [c for c in configs if c.row.is_baseline] + ranked[: self.confirm]
        by_number = {t.number: t for t in trials}
        done = measured_again(trials)
        todo = [c for c in chosen if len(c.values) == 1 and c.row.number not in done]
        if not todo:
            return None
        # numbered after the search: the confirmations run or done, this one, those left
        finished = sum(1 for t in trials if t.finished)
        confirmed = sum(1 for t in trials if t.rec.measured_again and t.rec.recheck is None
                        and (t.state in ("RUNNING", "COMPLETE") or t.engine_failed))
        first = todo[0].row.number
        return Run(by_number[first].params, TrialRecord(confirms=first), why=f"confirming trial {first} on a fresh engine",
                   progress=(finished + confirmed + 1, finished + confirmed + len(todo)))

    def _explore_knobs(self, view: StudyView, trials: Sequence[Snapshot]) -> Run | None:
        """Once its models have nothing left to measure: the best speculative configuration
        again, at engine knobs the study's Optuna sampler chooses, until each setting of the knobs
        has had its turn (spectune has no model of the knobs: :data:`KNOBS_BY_SAMPLER`)."""
        if not self.space.knobs:
            return None
        top = best_measured(view, view.maximize)[1]
        if top is None or not top.row.spec:
            return None
        key = spec_key(top.row.spec)
        tried = [t for t in trials if t.rec.spec and spec_key(t.rec.spec) == key
                 and (t.rec.guide_reason == KNOBS_BY_SAMPLER or t.number == top.row.number)]
        if len(tried) >= len(self.space.knob_settings()):
            return None
        return Run(self.space.params_of(SpecConfig.model_validate(top.row.spec)),
                   TrialRecord(guide_reason=KNOBS_BY_SAMPLER),
                   why=f"the best speculative configuration, {top.row.label}, at engine knobs "
                       f"({', '.join(self.space.knobs)}) Optuna's sampler chooses: spectune has no model of them")
