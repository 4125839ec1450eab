"""spectune's search as one strategy over the storage: baseline, search, rechecks, confirmations.

Every decision is computed from the study's trials, in this order:

1. **Baseline** (no speculation) first, once: every result has a speedup. A baseline that
   failed by its engine is data; the search goes on without it (the sampler chooses).
2. **Search** until the study holds ``trials`` finished trials (engine failures count: they are
   data; a trial interrupted by Ctrl-C or abandoned by a dead worker does not, and is measured
   again first, keeping its prediction). Trials running on other workers count against the
   budget while they run. The search is guided (:mod:`spectune.predict`'s plan, the default),
   the grid (every candidate once, in the space's order) or Optuna's sampler (TPE, random,
   NSGA-II for two objectives).
3. **Rechecks** of guided search: a pick measured outside its predicted interval is measured
   again on a fresh engine before anything else, and the best is measured on a second engine
   before the search stops (:data:`RECHECK_SURPRISE`, :data:`RECHECK_BEST`); where no engine
   spread is known on the machine, the baseline is measured on a second engine before the first
   guided pick (:data:`RECHECK_SPREAD`). They do not count against the budget.
4. **Confirmations** (``confirm: N``): the baseline and the N best measured again, each on a
   fresh engine, once the search has ended.

A candidate running on another worker is never chosen again: guided search plans around it,
counting it at what it is predicted to measure (:func:`spectune.predict.plan_next`'s
``running``), and waits (:class:`Wait`) when nothing else is worth measuring until it finishes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spectune.config import SpecConfig
from spectune.errors import ConfigError
from spectune.measurement import spec_key
from spectune.predict import (
    DEFAULT_MARGIN,
    DEFAULT_STOP_CHANCE,
    DraftReplays,
    chance_to_beat,
    prediction_sd,
    warm_replays,
)
from spectune.records import (
    KNOBS_BY_SAMPLER,
    RECHECK_BASELINE,
    RECHECK_BEST,
    RECHECK_CONTENDER,
    RECHECK_SPREAD,
    RECHECK_SURPRISE,
    StudyRecord,
    TrialRecord,
    write_study_fields,
)
from spectune.search._base import (
    Decision,
    Run,
    SearchStrategy,
    Snapshot,
    Stop,
    Wait,
    snapshots,
)
from spectune.search._inputs import study_inputs
from spectune.space import range_text
from spectune.storage import MeasurementStore

if TYPE_CHECKING:
    import optuna

    from spectune.predict import Prediction
    from spectune.results import Engines, StudyView
    from spectune.space import SearchSpace

__all__ = ["StudyStrategy", "count_candidates", "measured_again", "params_key"]

_logger = logging.getLogger(__name__)


def params_key(params: dict[str, object]) -> str:
    """A candidate's parameters as text, to compare."""
    return json.dumps(params, sort_keys=True)


def measured_again(trials: Sequence[Snapshot]) -> set[int]:
    """The trials whose configuration is measured again on a fresh engine (``confirms``), queued,
    running or done: completed, or failed by its engine (that is data, not retried on resume).
    One interrupted by Ctrl-C, or abandoned by a dead worker, does not count."""
    return {t.rec.confirms for t in trials if t.rec.confirms is not None
            and (t.state in ("WAITING", "RUNNING", "COMPLETE") or t.engine_failed)}


def count_candidates(space: SearchSpace) -> int | None:
    """How many distinct candidates (speculative configuration and engine knobs) a space has, or
    None when it is too large to list."""
    try:
        return len(space.enumerate_candidates())
    except ConfigError:
        return None


class StudyStrategy(SearchStrategy):
    """The search a spectune study runs (module docstring), for one study's configuration.

    ``on_guide_stop`` is told, once per instance, how many candidates guided search skipped
    when it stops.
    """

    def __init__(
        self, *, space: SearchSpace, store: MeasurementStore, url: str, sampler: str, objectives: int,
        trials: int, confirm: int, on_guide_stop: Callable[[int], None] | None = None,
        time_budget: float | None = None, on_budget_spent: Callable[[float], None] | None = None,
        tolerance: float | None = None, on_guide_stopped: Callable[[str], None] | None = None, extend: bool = True,
    ) -> None:
        self.space = space
        self.base_space = space  # as given: the study's widened ranges are applied to it (_sync_space)
        self.extend = extend
        self._widenings: list[dict[str, object]] = []
        self._edges_kept: list[tuple[str, Engines]] = []  # extend false: where the leaders sit on an edge
        self._edges_told: set[tuple[str, str]] = set()  # what the log said once
        self.tolerance = tolerance
        self.on_guide_stopped = on_guide_stopped
        self.store = store
        self.url = url
        self.trials = trials
        self.confirm = confirm
        self.time_budget = time_budget
        self.on_budget_spent = on_budget_spent
        self.candidates = count_candidates(space)
        self.guided = sampler == "guided" and objectives == 1 and self.candidates is not None
        self.grid = sampler == "grid"
        self.on_guide_stop = on_guide_stop
        self.drafts = DraftReplays()  # the drafts' offline runs, kept while this search lives
        self._stop_reported = False
        self._budget_reported = False
        if sampler == "guided" and not self.guided:
            _logger.info("guided search needs one objective and a space that can be listed; using %s",
                         "NSGA-II" if objectives > 1 else "TPE")

    def prepare(self, study: optuna.Study) -> None:
        """Run the drafts' and heads' offline replays guided search's next prediction would use,
        before the study's lock (a replay may take minutes on the CPU): another slot asking
        meanwhile decides without them, and finds them ready the next time."""
        from spectune.results import StudyView

        base = StudyView(study, self.store, self.url).baseline() if self.guided else None
        if base is None or (first := self.store.measurement(base.trial_id)) is None:
            return  # nothing to replay along yet
        self._sync_space(study)
        warm_replays(self.drafts, self.space.proposers(), first)

    def locked(self) -> contextlib.AbstractContextManager[None]:
        return self.drafts.cached_only()

    def decide(self, study: optuna.Study) -> Decision:
        self._sync_space(study)
        trials = snapshots(study)
        for phase in (self._baseline, self._search, self._confirmations):
            decision = phase(study, trials)
            if isinstance(decision, Run) and phase != self._baseline:
                spent = self._out_of_time(trials)
                if spent is not None:
                    return self._budget_spent(study, trials, spent)
                if StudyRecord.of(study).stopped:  # a resumed study with a larger budget goes on
                    write_study_fields(study, stopped="")
            if decision is not None:
                return decision
        if any(t.state == "RUNNING" for t in trials):
            return Wait("the last trials are running on other workers")
        return Stop("the search and its confirmations are done")

    def _sync_space(self, study: optuna.Study) -> None:
        """The space as the study stands: with the ranges guided search widened, by this worker
        or another (:attr:`StudyRecord.extensions`)."""
        if not self.guided:
            return
        widenings = StudyRecord.of(study).extensions or []
        if widenings != self._widenings:
            self._widenings = widenings
            self.space = self.base_space.extended(widenings)
            self.candidates = count_candidates(self.space)

    def _past_edges(self, study: optuna.Study, standing: _Standing) -> SearchSpace | None:
        """Where the pick, or a configuration it cannot be told from, sits on the edge of a range
        the space lets grow (:meth:`SearchSpace.edges`): the space with those ranges widened past
        the edges, else None. With ``extend`` the study keeps the wider space (every worker reads
        it from :attr:`StudyRecord.extensions`) and measures what its models find worth measuring
        there; without, the wider space is only predicted and reported."""
        wider, grown = self.space, []
        for leader in standing.leaders():
            spec = SpecConfig.model_validate(leader.row.spec)
            for param, side in self.space.edges(spec):
                if param in {g[0] for g in grown} or (more := wider.widened(param, side)) is None:
                    continue
                size = count_candidates(more)
                if size is None or size > WIDEN_MAX_CANDIDATES:
                    if (param, "size") not in self._edges_told:
                        self._edges_told.add((param, "size"))
                        _logger.info("%s (trial %d) sits on the edge of %s, which is not widened: the space would "
                                     "hold %s candidates, more than %d", leader.row.label, leader.row.number, param,
                                     size or "too many", WIDEN_MAX_CANDIDATES)
                    continue
                grown.append((param, side, leader, wider.domain(param), more.domain(param)))
                wider = more
        if not grown:
            return None
        if not self.extend:
            for param, _, leader, was, _ in grown:
                if (param, "kept") not in self._edges_told:
                    self._edges_told.add((param, "kept"))
                    _logger.info("%s (trial %d) sits on the edge of %s (%s); the study keeps to its space "
                                 "(extend: false): what lies beyond is predicted, not measured",
                                 leader.row.label, leader.row.number, param, range_text(was.model_dump(mode="json")))
            self._edges_kept = [(param, leader) for param, _, leader, _, _ in grown]
            return wider
        events = list(self._widenings)  # read by this decision, under the study's lock
        for param, _, leader, was, now in grown:
            assert now is not None
            _logger.info("%s (trial %d) sits on the edge of %s (%s): guided search widens it to %s "
                         "(--no-extend keeps to the space)", leader.row.label, leader.row.number, param,
                         range_text(was.model_dump(mode="json")), range_text(now.model_dump(mode="json")))
            events.append({"param": param, "range": now.model_dump(mode="json"), "was": was.model_dump(mode="json"),
                           "because": f"{leader.row.label} (trial {leader.row.number}) sits on its edge"})
        write_study_fields(study, extensions=events)
        self._widenings, self.space, self.candidates = events, wider, count_candidates(wider)
        return None

    def _widened_at_end(self, study: optuna.Study) -> bool:
        """Whether the space, every candidate of it measured, grew past an edge its pick sits on."""
        from spectune.results import StudyView

        view = StudyView(study, self.store, self.url)
        if view.baseline() is None:
            return False
        before = self.candidates
        self._past_edges(study, _standing(view, view.maximize, self.tolerance))
        return self.candidates != before

    def _out_of_time(self, trials: Sequence[Snapshot]) -> float | None:
        """The engine time spent, where one more trial would take the study past its
        ``time_budget``; None while it fits. A trial is expected to take as long as the median
        trial measured so far, a running one at least that (answers from earlier trials and imported
        results spent none here)."""
        if self.time_budget is None:
            return None
        ran = [t for t in trials if t.seconds is not None and t.rec.duplicate_of is None and t.rec.imported is None]
        ended = [t.seconds for t in ran if not t.in_flight and t.seconds is not None]
        typical = statistics.median(ended) if ended else 0.0
        spent = sum(max(t.seconds or 0.0, typical) if t.in_flight else t.seconds or 0.0 for t in ran)
        return spent if spent + typical > self.time_budget else None

    def _budget_spent(self, study: optuna.Study, trials: Sequence[Snapshot], spent: float) -> Decision:
        if any(t.in_flight for t in trials):
            return Wait("the time budget leaves no room for another trial; the trials running may end the study")
        write_study_fields(study, stopped=f"the time budget is spent: {spent:.0f} s of engine time of "
                                          f"{self.time_budget:.0f} s")
        if not self._budget_reported:
            _logger.info("the time budget (%.0f s of engine time) is spent: %.0f s; no more trials start",
                         self.time_budget, spent)
            self._budget_reported = True
            if self.on_budget_spent is not None:
                self.on_budget_spent(spent)
        return Stop(f"the time budget is spent ({spent:.0f} s of engine time)")

    # -- phases: each returns a decision, or None when it has nothing (more) to do ------------
    def _baseline(self, study: optuna.Study, trials: Sequence[Snapshot]) -> Decision | None:
        """No speculation, at the engine knobs' first values where the space tunes some."""
        params = self.space.params_of(SpecConfig())
        mine = [t for t in trials if params_key(self.space.spec_params(t.params)) == params_key(params)
                and t.rec.imported is None]  # measured here: predictions replay its outputs
        if any(t.state != "FAIL" for t in mine):
            return None  # measured or running
        if failed := [t for t in mine if t.engine_failed]:  # its own configuration: nothing to compare with
            why = f"the baseline (no speculation) failed, so no candidate can be compared: {failed[-1].rec.fail_reason}"
            write_study_fields(study, stopped=why)
            return Stop(why, failed=True)
        retried = {t.rec.retry_of for t in trials}
        interrupted = [t.number for t in mine if t.rec.interrupted and t.number not in retried]
        return Run({**params, **self.space.engine_params_of(self.space.default_knobs())},
                   TrialRecord(role="baseline", retry_of=interrupted[-1] if interrupted else None), why="the baseline")

    def _search(self, study: optuna.Study, trials: Sequence[Snapshot]) -> Decision | None:
        finished = sum(1 for t in trials if t.finished)
        going = [t for t in trials if t.in_flight and not t.rec.measured_again and t.rec.duplicate_of is None]
        everything = self.candidates is not None and finished >= self.candidates
        if everything and self.guided and self.extend and finished + len(going) < self.trials:
            everything = not self._widened_at_end(study)  # the space measured through: its edges may grow
        if everything:
            _logger.info("every candidate of the space has been measured")
        if finished + len(going) < self.trials and not everything:
            decision = self._retry(trials) or self._pick(study, trials)
            if decision is not None:
                return decision
        if self.guided and (recheck := self._recheck_surprise(trials)) is not None:
            return recheck  # the last pick, past the budget
        if going:
            return Wait("the search's last trials are running on other workers")
        return None

    def _retry(self, trials: Sequence[Snapshot]) -> Decision | None:
        """A search trial interrupted by Ctrl-C, again (a guided pick keeps its prediction)."""
        retried = {t.rec.retry_of for t in trials}
        for t in trials:
            if t.rec.interrupted and t.number not in retried and not t.rec.measured_again:
                record = t.rec.guide().model_copy(update={"retry_of": t.number})
                return Run(t.params, record, why=f"trial {t.number} was interrupted")
        return None

    def _pick(self, study: optuna.Study, trials: Sequence[Snapshot]) -> Decision | None:
        if self.guided:
            return self._guided(study, trials)
        if self.grid:
            taken = {params_key(t.params) for t in trials}
            for spec, knobs in self.space.enumerate_candidates():
                params = {**self.space.params_of(spec), **self.space.engine_params_of(knobs)}
                if params_key(params) not in taken:  # the baseline at other engine knobs too
                    return Run(params, why="the grid's next candidate")
            return Wait("the grid's last candidates are running") if any(t.in_flight for t in trials) else None
        return Run(None, why="the sampler's choice")

    def _guided(self, study: optuna.Study, trials: Sequence[Snapshot]) -> Decision | None:
        """The guided plan's next candidate, with its prediction as trial attributes.

        None when the search should stop: every candidate left is predicted clearly worse than
        the best measured, and that best was measured on two engines (the skipped ones are
        listed in the study attribute ``guide``). A best measured on one engine is measured
        again first (:data:`RECHECK_BEST`): its lead may be its engine's, and the two engines
        tell the study how much engines differ (:func:`spectune.results.engine_spread`), which
        widens the noise of every configuration measured once. Without a measured baseline
        there is nothing to predict from and the sampler chooses.
        """
        from spectune.predict import plan_next
        from spectune.results import StudyView

        view = StudyView(study, self.store, self.url)
        if view.baseline() is None:
            if any(t.in_flight and t.rec.is_baseline for t in trials):
                return Wait("guided search predicts from the baseline, which is running")
            return Run(None, why="no baseline to predict from: the sampler chooses")
        maximize = view.maximize
        standing = _standing(view, maximize, self.tolerance)
        if (recheck := self._recheck_surprise(trials, standing)) is not None:  # before anything is fitted on that engine
            return recheck
        if (learn := self._learn_spread(view, trials)) is not None:
            return learn
        beyond = self._past_edges(study, standing)  # kept to the space: what lies past its edges, predicted only
        # the search plans on its own measurements
        inputs = study_inputs(view, confirmations=False, drafts=self.drafts, space=beyond or self.space)
        busy = {spec_key(t.rec.spec) for t in trials if t.in_flight and t.rec.spec}  # other workers' candidates
        if inputs.candidates and all(spec_key(c.to_vllm()) in busy for c in inputs.candidates):
            return Wait("every candidate left is running on another worker")
        # the running candidates predicted too: the plan counts them at what they will likely measure
        predictions = inputs.predict()
        outside = [p for p in predictions if beyond is not None and not self.space.holds(p.spec)]
        predictions = [p for p in predictions if p not in outside]
        running = [p for p in predictions if spec_key(p.spec.to_vllm()) in busy]
        todo = [p for p in predictions if spec_key(p.spec.to_vllm()) not in busy]
        step = sum(1 for t in trials if t.rec.guided and t.rec.retry_of is None)
        # its best measured again before stopping, and the search goes on: no guided pick since then
        rechecked = max((t.number for t in trials if t.rec.recheck == RECHECK_BEST), default=None)
        contested = rechecked is not None and not any(t.rec.guided and t.number > rechecked for t in trials)
        plan = plan_next(todo, maximize=maximize, step=step, contested=contested,
                         margin=standing.tolerance, pick=standing.pick, pick_sd=standing.pick_sd,
                         stop_chance=STOP_CHANCE, running=running)
        unmeasured = max(plan.chances.values(), default=0.0)
        guide = self._guide_record(study, standing, inputs, plan, running, outside, unmeasured)
        if plan.pick is None:
            return self._before_stopping(study, view, trials, standing, plan, guide, busy=bool(busy),
                                         unmeasured=unmeasured)
        write_study_fields(study, guide=guide)
        p = plan.pick
        return Run(self.space.params_of(p.spec), TrialRecord(
            predicted_objective=p.objective, predicted=p.value.value, predicted_low=p.value.low,
            predicted_high=p.value.high, predicted_acceptance_length=p.mean_acceptance_length,
            prediction_source=p.source, guide_reason=plan.reason, guide_step=step,
        ), why=f"guided search: the most {plan.reason}")

    def _guide_record(self, study: optuna.Study, standing: _Standing, inputs: Any, plan: Any, running: list[Prediction],
                      outside: list[Prediction], unmeasured: float) -> dict[str, Any]:
        """What guided search's plan rests on, for the study attribute ``guide`` (the dashboard and
        ``show``): the best measured, the spread and tolerance, the chances, what it skipped."""
        errors = inputs.errors()
        maximize = standing.maximize
        return {
            "best_measured": standing.pick,
            "engine_spread": inputs.engine_spread,  # over the same trials as best and top
            "tolerance": standing.tolerance,
            "stop_chance": STOP_CHANCE,
            "chance": max(unmeasured, standing.chance()),
            "errors": errors.record() if errors is not None else None,
            "engine_knobs": (f"speculative configurations from guided search's models; engine knobs "
                             f"({', '.join(self.space.knobs)}) from Optuna's {type(study.sampler).__name__}, "
                             "which spectune has no model of") if self.space.knobs else None,
            "candidates_left": len(plan.candidates),
            "running": [p.label for p in running],  # counted at their predictions
            "beyond_edge": _beyond_edge(outside, standing, self._edges_kept) if outside else None,
            "skipped": [{"config": p.label, f"predicted_{p.objective}": p.value.value,
                         "optimistic": p.value.high if maximize else p.value.low, "source": p.source,
                         "chance": plan.chances.get(p.label)}
                        for p in plan.skipped],
        }

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

    def _before_stopping(self, study: optuna.Study, view: StudyView, trials: Sequence[Snapshot], standing: _Standing,
                         plan: Any, guide: dict[str, Any], *, busy: bool, unmeasured: float) -> Decision | None:
        """Where the plan has no pick: wait for the trials running, measure the best, a rival or
        the baseline again, let the sampler try the engine knobs, or stop (None), saying why."""
        decision = Wait("guided search would stop; the trials running may change its plan") if busy \
            else self._last_measurements(view, trials, standing, unmeasured)
        top = standing.top
        if decision is None:
            guide["stop_reason"] = stop_reason(len(plan.skipped), guide["chance"], standing.tolerance,
                                               top.row.label if top is not None else None,
                                               top.row.number if top is not None else None)
        write_study_fields(study, guide=guide)
        if decision is None and not self._stop_reported:
            _logger.info("guided search stops: %s", guide["stop_reason"])
            self._stop_reported = True
            if self.on_guide_stop is not None:
                self.on_guide_stop(len(plan.skipped))
            if self.on_guide_stopped is not None:
                self.on_guide_stopped(guide["stop_reason"])
        return decision

    def _last_measurements(self, view: StudyView, trials: Sequence[Snapshot], standing: _Standing,
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

    def _explore_knobs(self, view: StudyView, trials: Sequence[Snapshot]) -> Run | None:
        """Once its models have nothing left to measure: the best speculative configuration
        again, at engine knobs the study's Optuna sampler chooses, until each setting of the knobs
        has had its turn (spectune has no model of the knobs: :data:`KNOBS_BY_SAMPLER`)."""
        if not self.space.knobs:
            return None
        top = _best_measured(view, view.maximize)[1]
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

    def _recheck_surprise(self, trials: Sequence[Snapshot], standing: _Standing | None = None) -> Run | None:
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


WIDEN_MAX_CANDIDATES = 1000
"""A range is not widened where the space would then hold more candidates than this: each is
predicted (its acceptance replayed once) at every decision."""

SETTLE_STARTS = 3
"""A choice of the baseline because the best gain lies within the band is settled by measuring the
two again, the one on fewer engines first, up to this many engines each."""

LEARN_SPREAD_MIN_CANDIDATES = 4
"""Guided search measures the baseline twice first (:data:`RECHECK_SPREAD`) only in a space of at
least this many speculative candidates: in a smaller one, measuring them all costs about as much."""

STOP_CHANCE = DEFAULT_STOP_CHANCE
"""Guided search stops once no candidate, unmeasured or measured on one engine, has more than
this chance of beating the pick by more than the tolerance."""


def _beyond_edge(outside: Sequence[Prediction], standing: _Standing,
                 edges: Sequence[tuple[str, Engines]]) -> dict[str, object]:
    """What a study kept to its space predicts past the ``edges`` its leaders sit on: how many
    candidates, the best of them and its chance of beating the pick by more than the tolerance."""
    best = max(outside, key=lambda p: p.value.value if standing.maximize else -p.value.value)
    chance = chance_to_beat(best.value.value, prediction_sd(best, maximize=standing.maximize), standing.pick,
                            standing.pick_sd, tolerance=standing.tolerance, maximize=standing.maximize)
    return {"candidates": len(outside), "best": best.label, "predicted": best.value.value, "chance": chance,
            "edges": [{"param": param, "at": f"{leader.row.label} (trial {leader.row.number})"}
                      for param, leader in edges]}


def _again(trials: Sequence[Snapshot], number: int, why: str) -> Run:
    """Trial ``number``'s configuration measured again on a fresh engine, for guided search's
    reason ``why`` (a RECHECK_* of :mod:`spectune.records`)."""
    first = next(t for t in trials if t.number == number)
    return Run(first.params, TrialRecord(confirms=number, recheck=why), why=f"{why}, again on a fresh engine")


def study_tolerance(tolerance: float | None, spread: float | None) -> float:
    """The tolerance of the stopping rule: the study's setting, else the larger of
    :data:`~spectune.predict.DEFAULT_MARGIN` (2 %) and the engines' measured spread."""
    if tolerance is not None:
        return tolerance
    return max(DEFAULT_MARGIN, spread or 0.0)


def stop_reason(skipped: int, chance: float, tolerance: float, pick: str | None, number: int | None) -> str:
    """Why guided search stopped, in one line (the log, ``show`` and the report say it)."""
    where = f"{pick} (trial {number})" if pick is not None else "the pick"
    return (f"no candidate left has more than a {STOP_CHANCE:.0%} chance of beating {where} by more than "
            f"{tolerance:.1%} (the highest: {chance:.1%}; {skipped} unmeasured)")


@dataclass(frozen=True)
class _Standing:
    """Where the search stands against its pick: the configuration the study would choose (by its
    mean over its engines), how uncertain that mean is, the tolerance, and the other measured
    configurations."""

    top: Engines | None
    pick: float
    pick_sd: float
    tolerance: float
    one_start: float
    """The relative spread of one engine start: the study's engine spread, the prior's until measured."""
    rivals: list[Engines]
    maximize: bool

    def sd(self, c: Engines) -> float:
        return abs(c.value) * max(c.noise, self.one_start) / math.sqrt(len(c.values))

    def chance_of(self, c: Engines) -> float:
        return chance_to_beat(c.value, self.sd(c), self.pick, self.pick_sd, tolerance=self.tolerance,
                              maximize=self.maximize)

    def leaders(self) -> list[Engines]:
        """The pick, and the speculative configurations it cannot be told from: within the
        tolerance of it, or more than :data:`STOP_CHANCE` likely to beat it by more."""
        if self.top is None:
            return []
        near = [c for c in self.rivals
                if abs(c.value - self.pick) <= self.tolerance * abs(self.pick) or self.chance_of(c) > STOP_CHANCE]
        return [c for c in (self.top, *near) if not c.row.is_baseline]

    def contenders(self) -> list[tuple[Engines, float]]:
        """Rivals measured on one engine whose chance exceeds :data:`STOP_CHANCE`, likeliest first.
        A configuration measured on two engines is settled: never measured again by the search."""
        found = [(c, self.chance_of(c)) for c in self.rivals if len(c.values) == 1]
        return sorted(((c, p) for c, p in found if p > STOP_CHANCE), key=lambda cp: -cp[1])

    def chance(self, *, settled: bool = False) -> float:
        """The highest chance among the rivals measured on one engine (``settled``: on two or more)."""
        return max((self.chance_of(c) for c in self.rivals if (len(c.values) > 1) == settled), default=0.0)

    def matters(self, t: Snapshot) -> bool:
        """Whether a surprising trial could still beat the pick by its measurement, one engine start
        as uncertain as engines differ (the pick itself always matters). A measurement far below a
        prediction that was far off says more about the prediction than about the engine."""
        if self.top is None or t.number in self.top.numbers:
            return True
        value = (t.values or [math.nan])[0]
        return chance_to_beat(value, abs(value) * self.one_start, self.pick, self.pick_sd,
                              tolerance=self.tolerance, maximize=self.maximize) > STOP_CHANCE


def _standing(view: StudyView, maximize: bool, tolerance: float | None) -> _Standing:
    engines = view.engines(confirmations=False)
    found = view.spread(confirmations=False)
    spread = found.measured
    feasible = [c for c in engines if c.feasible]
    sign = 1.0 if maximize else -1.0
    top = max(feasible, key=lambda c: sign * c.value) if feasible else None
    one = found.value
    if top is None:
        return _Standing(None, -sign * math.inf, 0.0, study_tolerance(tolerance, spread), one, [], maximize)
    pick_sd = abs(top.value) * max(top.noise, one) / math.sqrt(len(top.values))
    return _Standing(top, top.value, pick_sd, study_tolerance(tolerance, spread), one,
                     [c for c in feasible if c is not top], maximize)


def _best_measured(view: StudyView, maximize: bool) -> tuple[float, Engines | None]:
    """What guided search compares its candidates with: the best measured value (mean over its
    engines) at the low end of its noise, so that one lucky window, or one lucky engine once
    engines are known to differ, does not end the search (-inf for a maximised objective while
    nothing is feasible: anything could beat it); and the configuration the study would choose."""
    sign = 1.0 if maximize else -1.0
    engines = view.engines(confirmations=False)  # measured once: noise at least the engines' spread
    feasible = [c for c in engines if c.feasible]
    lows = [c.value * (1.0 - sign * c.noise) for c in feasible]
    best = max(lows, key=lambda v: sign * v) if lows else -sign * math.inf
    top = max(feasible, key=lambda c: sign * c.value) if feasible else None
    return best, top
