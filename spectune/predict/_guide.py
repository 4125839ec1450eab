"""Model-guided search: which candidate to measure next, and when the rest is not worth measuring.

After the baseline, every unmeasured candidate of the space is predicted
(:func:`~spectune.predict.predict_candidates`) with an interval. The plan:

- a candidate is *clearly worse* when even its optimistic bound does not beat the best value
  measured so far by more than ``margin`` (the noise band of one measurement): it is skipped;
- of the rest, the next to measure alternates between the *most promising* (best predicted
  value) and the *most uncertain* (widest interval, relative to its value), the promising
  first: the predicted winner measured early gives the strongest best-so-far to skip against
  (and the best configuration to a study stopped early), and it calibrates the cost model
  where it matters. A proposer not measured yet has prior-wide intervals, so the uncertain
  picks measure each proposer once (at its most uncertain ``k``, usually the largest, whose
  counters then predict every smaller ``k`` by truncation), and the promising picks confirm
  the predicted winners;
- when nothing is left that could beat the best, the search stops, whatever its trial budget,
  but first measures the configuration it would choose once more on a fresh engine, if it was
  measured once (its lead may be its engine's); the configurations measured twice give the
  spread between engines (:func:`spectune.results.engine_spread`), and "the best so far" is
  then each configuration measured once at the low end of that spread, so a machine whose
  engines differ by more than the configurations do keeps the search going, and its next pick
  is the most promising (the lead is contested, and that candidate is likeliest to take it);
- a pick whose measurement falls outside its predicted interval by more than ``margin``
  (:func:`surprising`) is measured once more on a fresh engine before the next pick: on a
  machine where two engine starts of one configuration differ by more than the configurations
  do, one slow engine would otherwise fit its proposer's cost on that engine alone and skip
  every other setting of the proposer (one fast engine, everything else). The configuration
  then counts with its mean, its noise with the spread between its engines;
- with several workers, the candidates running on the others count as if they had measured
  what they are predicted to (a "kriging believer"): a candidate is worth starting only while
  it could beat the pick *and* them (:func:`chance_to_beat_all`), so that no worker starts one
  the running trials will likely make pointless; the uncertain pick passes over a proposer
  that one of them is measuring already (its measurement calibrates the proposer's cost), and a
  candidate whose acceptance a running one will give by truncation waits for it. Nothing is
  committed: the plan is made again when one of them finishes.

Pure functions of measurements: :func:`spectune.study.run_study` enqueues the picks as Optuna
trials (with the prediction stored beside the measurement), and the search-efficiency
benchmark replays the same plan on a recorded landscape.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from spectune.predict._measured import effective_k, proposer_of
from spectune.predict._prediction import Prediction

__all__ = ["DEFAULT_MARGIN", "DEFAULT_STOP_CHANCE", "GuidePlan", "chance_to_beat", "chance_to_beat_all",
           "plan_next", "prediction_sd", "surprising"]

DEFAULT_MARGIN = 0.02
"""A candidate must be able to beat the best measured value by this much (relative) to be
measured: the noise of one measurement (as :data:`spectune.results.NOISE_FLOOR`); the least
tolerance of the stopping rule."""

DEFAULT_STOP_CHANCE = 0.05
"""The search stops once no candidate left has more than this chance of beating the pick by more
than the tolerance."""

Reason = Literal["promising", "uncertain"]


@dataclass(frozen=True)
class GuidePlan:
    """The next candidate to measure (None: stop, or wait for the running trials), why, and what the
    plan skipped."""

    pick: Prediction | None
    reason: Reason | None
    candidates: list[Prediction]
    """Candidates that could still beat the best, best predicted first."""
    skipped: list[Prediction]
    """Candidates predicted clearly worse than the best measured value."""
    chances: dict[str, float] = field(default_factory=dict)
    """Each candidate's chance (by label) of beating the pick by more than the tolerance
    (:func:`chance_to_beat`); empty for a plan made against a bare best value."""

    def __bool__(self) -> bool:
        return self.pick is not None


def could_beat(p: Prediction, best: float, *, maximize: bool, margin: float = DEFAULT_MARGIN) -> bool:
    """Whether the optimistic end of ``p``'s interval beats ``best`` by more than ``margin``."""
    if maximize:
        return p.value.high > best * (1.0 + margin)
    return p.value.low < best * (1.0 - margin)


def chance_to_beat(mean: float, sd: float, pick: float, pick_sd: float, *, tolerance: float,
                   maximize: bool = True) -> float:
    """The chance that a candidate whose true value is believed normal(``mean``, ``sd``) beats
    the pick, believed normal(``pick``, ``pick_sd``), by more than ``tolerance`` (relative to the
    pick): above ``pick * (1 + tolerance)`` when maximising, below ``pick * (1 - tolerance)``
    when minimising. 1 against a pick that is not finite (nothing feasible measured)."""
    if not math.isfinite(pick):
        return 1.0
    scale = 1.0 + tolerance if maximize else 1.0 - tolerance
    gap = (mean - pick * scale) if maximize else (pick * scale - mean)
    sd_total = math.hypot(sd, scale * pick_sd)
    if not math.isfinite(gap) or not math.isfinite(sd_total):
        return 1.0
    if sd_total <= 0.0:
        return 1.0 if gap > 0.0 else 0.0
    return 0.5 * math.erfc(-gap / (sd_total * math.sqrt(2.0)))


def chance_to_beat_all(mean: float, sd: float, rivals: Sequence[tuple[float, float]], *, tolerance: float,
                       maximize: bool = True) -> float:
    """The chance that a candidate believed normal(``mean``, ``sd``) beats every one of ``rivals``
    ((mean, sd) each, independent normals) by more than ``tolerance``: :func:`chance_to_beat`
    against the best of them, integrated over the candidate's belief (Gauss-Hermite, 40 nodes).
    A rival whose mean or spread is not finite is beaten with chance 1, as there."""
    rivals = [(m, s) for m, s in rivals if math.isfinite(m) and math.isfinite(s)]
    if len(rivals) <= 1:
        m, s = rivals[0] if rivals else (math.inf, 0.0)
        return chance_to_beat(mean, sd, m, s, tolerance=tolerance, maximize=maximize)
    if not math.isfinite(mean) or not math.isfinite(sd):
        return 1.0
    import numpy as np

    scale = 1.0 + tolerance if maximize else 1.0 - tolerance
    nodes, weights = np.polynomial.hermite_e.hermegauss(40)
    xs = mean + sd * nodes  # the candidate's value at each node; it beats rival j when rival j < x / scale
    inside = np.ones_like(xs)
    for m, s in rivals:
        z = (xs / scale - m) / s if s > 0 else np.where(xs / scale > m, np.inf, -np.inf)
        below = 0.5 * np.array([math.erfc(-v / math.sqrt(2.0)) for v in z])  # P(rival < x / scale)
        inside *= below if maximize else 1.0 - below
    return float(np.clip(np.dot(weights, inside) / math.sqrt(2.0 * math.pi), 0.0, 1.0))


def prediction_sd(p: Prediction, *, maximize: bool = True) -> float:
    """The standard deviation a prediction's interval stands for on the side that could beat
    the pick: its optimistic end taken as two standard deviations from its value."""
    side = (p.value.high - p.value.value) if maximize else (p.value.value - p.value.low)
    return max(0.0, side) / 2.0 if math.isfinite(side) else math.inf


def surprising(low: float, high: float, measured: float, *, margin: float = DEFAULT_MARGIN) -> bool:
    """Whether ``measured`` falls outside the predicted interval ``[low, high]`` by more than
    ``margin`` (relative) on either side."""
    return measured < low * (1.0 - margin) or measured > high * (1.0 + margin)


def relative_width(p: Prediction) -> float:
    """Width of the prediction's interval relative to its value (0 for an exact one)."""
    width = p.value.high - p.value.low
    scale = abs(p.value.value)
    return width / scale if scale > 0 and math.isfinite(width) else math.inf


def plan_next(
    ranking: Sequence[Prediction],
    *,
    best: float | None = None,
    maximize: bool = True,
    step: int = 0,
    margin: float = DEFAULT_MARGIN,
    contested: bool = False,
    pick: float | None = None,
    pick_sd: float = 0.0,
    stop_chance: float = DEFAULT_STOP_CHANCE,
    running: Sequence[Prediction] = (),
) -> GuidePlan:
    """Plan the next measurement among the unmeasured candidates' predictions ``ranking``
    (best first, as :func:`~spectune.predict.predict_candidates` returns them).

    Against the pick (what guided search runs): ``pick`` is the value of the configuration the
    study would choose now (its mean over its engines) and ``pick_sd`` how uncertain that mean
    is; a candidate stays alive while its chance of beating the pick by more than ``margin``
    (the study's tolerance) exceeds ``stop_chance`` (:func:`chance_to_beat`, the prediction's
    spread from :func:`prediction_sd`). Against a bare ``best`` value (the best measured at the
    low end of its noise): alive while the optimistic end beats it by more than ``margin``
    (:func:`could_beat`). ``step`` counts the guided picks made so far: even steps take the most
    promising candidate, odd ones the most uncertain (see the module docstring). ``contested``:
    the search would have stopped on its best, measured it again on a fresh engine, and goes on;
    its lead is in question, and the candidate likeliest to take it is the most promising,
    whatever the step.

    ``running``: the current predictions of the candidates running on other workers (against the
    pick only). Each counts as a rival measured at its prediction: a candidate stays alive while
    its chance of beating the pick and all of them exceeds ``stop_chance``
    (:func:`chance_to_beat_all`), and the uncertain pick is not of a proposer (method and model)
    one of them has; a candidate whose acceptance a running one will give by truncation (the
    same proposer at a ``k`` as large, none replayed) is not picked: with nothing else alive the
    plan has no pick (wait, where it would stop without ``running``). Without ``running`` the
    plan is the one a single worker makes.

    Raises:
        ValueError: neither ``pick`` nor ``best`` given.
    """
    chances: dict[str, float] = {}
    if pick is not None:
        rivals = [(pick, pick_sd)] + [(r.value.value, prediction_sd(r, maximize=maximize)) for r in running]
        chances = {p.label: chance_to_beat_all(p.value.value, prediction_sd(p, maximize=maximize), rivals,
                                               tolerance=margin, maximize=maximize) for p in ranking}
        alive = [p for p in ranking if chances[p.label] > stop_chance]
    elif best is not None:
        alive = [p for p in ranking if could_beat(p, best, maximize=maximize, margin=margin)]
    else:
        raise ValueError("plan_next needs the pick's value or the best measured value")
    skipped = [p for p in ranking if p not in alive]
    if not alive:
        return GuidePlan(None, None, [], skipped, chances)
    running = running if pick is not None else ()
    free = [p for p in alive if not any(_truncates(r, p) for r in running)]
    if not free:  # each candidate left waits for a running trial's acceptance
        return GuidePlan(None, None, alive, skipped, chances)
    promising = free[0]
    measuring = {_proposer(r) for r in running}
    unexplored = [p for p in free if _proposer(p) not in measuring]
    uncertain = max(unexplored, key=lambda p: (relative_width(p), -free.index(p)), default=None)
    if step % 2 == 1 and not contested and uncertain is not None and relative_width(uncertain) > 2 * margin:
        return GuidePlan(uncertain, "uncertain", alive, skipped, chances)
    return GuidePlan(promising, "promising", alive, skipped, chances)


def _truncates(running: Prediction, p: Prediction) -> bool:
    """Whether ``running``'s measurement will give ``p`` its acceptance by truncation (the same
    proposer at a ``k`` as large), where ``p`` has none replayed: ``p`` then waits for it."""
    if p.source == "replay" or proposer_of(running.spec) != proposer_of(p.spec):
        return False
    k, kr = effective_k(p.spec), effective_k(running.spec)
    return k is not None and kr is not None and kr >= k


def _proposer(p: Prediction) -> tuple[str, str | None]:
    """What a cost is fitted for (:mod:`spectune.predict._cost`): the method and its model."""
    return p.spec.method.value, p.spec.model
