"""Where guided search stands against its pick, and its stopping rule: the configuration the
study would choose, how uncertain its mean is, the tolerance (the larger of 2 % and the engine
spread), and each rival's chance of beating it by more than that."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spectune.predict import DEFAULT_MARGIN, DEFAULT_STOP_CHANCE, chance_to_beat, prediction_sd

if TYPE_CHECKING:
    from spectune.predict import Prediction
    from spectune.results import Engines, StudyView
    from spectune.search._base import Snapshot

__all__ = ["STOP_CHANCE", "Standing", "beyond_edge", "best_measured", "standing_of", "stop_reason", "study_tolerance"]


STOP_CHANCE = DEFAULT_STOP_CHANCE
"""Guided search stops once no candidate, unmeasured or measured on one engine, has more than
this chance of beating the pick by more than the tolerance."""


def beyond_edge(outside: Sequence[Prediction], standing: Standing,
                 edges: Sequence[tuple[str, Engines]]) -> dict[str, object]:
    """What a study kept to its space predicts past the ``edges`` its leaders sit on: how many
    candidates, the best of them and its chance of beating the pick by more than the tolerance."""
    best = max(outside, key=lambda p: p.value.value if standing.maximize else -p.value.value)
    chance = chance_to_beat(best.value.value, prediction_sd(best, maximize=standing.maximize), standing.pick,
                            standing.pick_sd, tolerance=standing.tolerance, maximize=standing.maximize)
    return {"candidates": len(outside), "best": best.label, "predicted": best.value.value, "chance": chance,
            "edges": [{"param": param, "at": f"{leader.row.label} (trial {leader.row.number})"}
                      for param, leader in edges]}


def study_tolerance(tolerance: float | None, spread: float | None) -> float:
    """The tolerance of the stopping rule: the study's setting, else the larger of
    :data:`~spectune.predict.DEFAULT_MARGIN` (2 %) and the engines' measured spread."""
    if tolerance is not None:
        return tolerance
    return max(DEFAULT_MARGIN, spread or 0.0)


def stop_reason(skipped: int, chance: float, tolerance: float, pick: str | None, number: int | None,
                losing: int = 0) -> str:
    """Why guided search stopped, in one line (the log, ``show`` and the report say it); ``losing``
    of the ``skipped`` are predicted to lose to the baseline itself at this load."""
    where = f"{pick} (trial {number})" if pick is not None else "the pick"
    lose = f", {losing} of them predicted to lose to the baseline at this load" if losing else ""
    return (f"no candidate left has more than a {STOP_CHANCE:.0%} chance of beating {where} by more than "
            f"{tolerance:.1%} (the highest: {chance:.1%}; {skipped} unmeasured{lose})")


@dataclass(frozen=True)
class Standing:
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


def standing_of(view: StudyView, maximize: bool, tolerance: float | None) -> Standing:
    engines = view.engines(confirmations=False)
    found = view.spread(confirmations=False)
    spread = found.measured
    feasible = [c for c in engines if c.feasible]
    sign = 1.0 if maximize else -1.0
    top = max(feasible, key=lambda c: sign * c.value) if feasible else None
    one = found.value
    if top is None:
        return Standing(None, -sign * math.inf, 0.0, study_tolerance(tolerance, spread), one, [], maximize)
    pick_sd = abs(top.value) * max(top.noise, one) / math.sqrt(len(top.values))
    return Standing(top, top.value, pick_sd, study_tolerance(tolerance, spread), one,
                     [c for c in feasible if c is not top], maximize)


def best_measured(view: StudyView, maximize: bool) -> tuple[float, Engines | None]:
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
