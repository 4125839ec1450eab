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
  then counts with its mean, its noise with the spread between its engines.

Pure functions of measurements: :func:`spectune.study.run_study` enqueues the picks as Optuna
trials (with the prediction stored beside the measurement), and the search-efficiency
benchmark replays the same plan on a recorded landscape.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from spectune.predict._prediction import Prediction

__all__ = ["DEFAULT_MARGIN", "GuidePlan", "plan_next", "surprising"]

DEFAULT_MARGIN = 0.02
"""A candidate must be able to beat the best measured value by this much (relative) to be
measured: the noise of one measurement (as :data:`spectune.results.NOISE_FLOOR`)."""

Reason = Literal["promising", "uncertain"]


@dataclass(frozen=True)
class GuidePlan:
    """The next candidate to measure (None: stop), why, and what the plan skipped."""

    pick: Prediction | None
    reason: Reason | None
    candidates: list[Prediction]
    """Candidates that could still beat the best, best predicted first."""
    skipped: list[Prediction]
    """Candidates predicted clearly worse than the best measured value."""

    def __bool__(self) -> bool:
        return self.pick is not None


def could_beat(p: Prediction, best: float, *, maximize: bool, margin: float = DEFAULT_MARGIN) -> bool:
    """Whether the optimistic end of ``p``'s interval beats ``best`` by more than ``margin``."""
    if maximize:
        return p.value.high > best * (1.0 + margin)
    return p.value.low < best * (1.0 - margin)


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
    best: float,
    maximize: bool = True,
    step: int = 0,
    margin: float = DEFAULT_MARGIN,
    contested: bool = False,
) -> GuidePlan:
    """Plan the next measurement among the unmeasured candidates' predictions ``ranking``
    (best first, as :func:`~spectune.predict.predict_candidates` returns them).

    ``best`` is the best (feasible) value measured so far, the baseline's included; ``step``
    counts the guided picks made so far: even steps take the most promising candidate, odd ones
    the most uncertain (see the module docstring). ``contested``: the search would have stopped
    on its best, measured it again on a fresh engine, and goes on; its lead is in question, and
    the candidate likeliest to take it is the most promising, whatever the step.
    """
    alive = [p for p in ranking if could_beat(p, best, maximize=maximize, margin=margin)]
    skipped = [p for p in ranking if p not in alive]
    if not alive:
        return GuidePlan(None, None, [], skipped)
    promising = alive[0]
    uncertain = max(alive, key=lambda p: (relative_width(p), -alive.index(p)))
    if step % 2 == 1 and not contested and relative_width(uncertain) > 2 * margin:
        return GuidePlan(uncertain, "uncertain", alive, skipped)
    return GuidePlan(promising, "promising", alive, skipped)
