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
import statistics
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from spectune.config import SpecConfig
from spectune.errors import ConfigError
from spectune.measurement import spec_key
from spectune.predict import DraftReplays, warm_replays
from spectune.records import RECHECK_BEST, StudyRecord, TrialRecord, write_study_fields
from spectune.search._base import Decision, Run, SearchStrategy, Snapshot, Stop, Wait, snapshots
from spectune.search._inputs import study_inputs
from spectune.search._rechecks import Rechecks, measured_again
from spectune.search._standing import STOP_CHANCE, Standing, beyond_edge, standing_of, stop_reason
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


def count_candidates(space: SearchSpace) -> int | None:
    """How many distinct candidates (speculative configuration and engine knobs) a space has, or
    None when it is too large to list."""
    try:
        return len(space.enumerate_candidates())
    except ConfigError:
        return None


class StudyStrategy(Rechecks, SearchStrategy):
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
        self._losing_reported: set[str] = set()
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

    def _past_edges(self, study: optuna.Study, standing: Standing) -> SearchSpace | None:
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
        self._past_edges(study, standing_of(view, view.maximize, self.tolerance))
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
        standing = standing_of(view, maximize, self.tolerance)
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
        guide["losing"] = self._losing(view, plan.skipped, maximize)
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

    def _losing(self, view: StudyView, skipped: Sequence[Prediction], maximize: bool) -> list[str]:
        """The skipped candidates whose optimistic end does not reach the baseline's value: predicted
        to lose to it at this load, not measured. Said once each, in one line per decision that adds some."""
        base = view.baseline()
        if base is None or not base.values:
            return []
        value = base.values[0]
        losing = [p for p in skipped if (p.value.high < value if maximize else p.value.low > value)]
        new = [p for p in losing if p.label not in self._losing_reported]
        if new:
            self._losing_reported.update(p.label for p in new)
            sources = sorted({p.cost_source for p in new})
            _logger.info("not measured, predicted to lose to the baseline at this load (cost from %s): %s",
                         ", ".join(sources), ", ".join(p.label for p in new))
        return [p.label for p in losing]

    def _guide_record(self, study: optuna.Study, standing: Standing, inputs: Any, plan: Any, running: list[Prediction],
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
            "beyond_edge": beyond_edge(outside, standing, self._edges_kept) if outside else None,
            "skipped": [{"config": p.label, f"predicted_{p.objective}": p.value.value,
                         "optimistic": p.value.high if maximize else p.value.low, "source": p.source,
                         "chance": plan.chances.get(p.label)}
                        for p in plan.skipped],
        }

    def _before_stopping(self, study: optuna.Study, view: StudyView, trials: Sequence[Snapshot], standing: Standing,
                         plan: Any, guide: dict[str, Any], *, busy: bool, unmeasured: float) -> Decision | None:
        """Where the plan has no pick: wait for the trials running, measure the best, a rival or
        the baseline again, let the sampler try the engine knobs, or stop (None), saying why."""
        decision = Wait("guided search would stop; the trials running may change its plan") if busy \
            else self._last_measurements(view, trials, standing, unmeasured)
        top = standing.top
        if decision is None:
            guide["stop_reason"] = stop_reason(len(plan.skipped), guide["chance"], standing.tolerance,
                                               top.row.label if top is not None else None,
                                               top.row.number if top is not None else None,
                                               losing=len(guide.get("losing") or []))
        write_study_fields(study, guide=guide)
        if decision is None and not self._stop_reported:
            _logger.info("guided search stops: %s", guide["stop_reason"])
            self._stop_reported = True
            if self.on_guide_stop is not None:
                self.on_guide_stop(len(plan.skipped))
            if self.on_guide_stopped is not None:
                self.on_guide_stopped(guide["stop_reason"])
        return decision


WIDEN_MAX_CANDIDATES = 1000
"""A range is not widened where the space would then hold more candidates than this: each is
predicted (its acceptance replayed once) at every decision."""
