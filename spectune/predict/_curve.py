"""The step-cost curve as the cost model reads it: what a verification step over ``B(1 + d)``
tokens costs against a decode step over ``B``, on the baseline's own engine and load.

A model-free proposer (n-gram lookup, suffix decoding) proposes on the CPU from the text: what a
speculative step costs beyond a decode step is the target's forward over the drafted tokens,
which the curve measured (:mod:`spectune.stepcost`). Before such a proposer has trials, its
time per token is ``t0 * r(d) / E``, ``r`` the curve's ratio at ``d`` drafted tokens per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spectune.measurement import StepCost

__all__ = ["CURVE_NOISE", "StepCurve"]

CURVE_NOISE = 0.1
"""How far a step's cost is believed from the curve's, either way: the probe's forwards read a
cached context and sample one token, a verification step reads a growing one and also proposes
and rejection-samples (an assumption, checked in ``benchmarks/RESULTS.md``)."""


@dataclass(frozen=True)
class StepCurve:
    """Time per forward (ms) against new tokens per forward at ``batch`` sequences in flight."""

    batch: int
    points: tuple[tuple[float, float], ...]
    """(tokens per step, ms), by tokens."""

    @classmethod
    def of(cls, step_cost: StepCost | None, batch: float) -> StepCurve | None:
        """The curve measured at the load nearest ``batch`` (by ratio); None without two points there."""
        if step_cost is None or not step_cost.points:
            return None
        near = min({p.batch for p in step_cost.points}, key=lambda b: abs(math.log(b / max(batch, 1e-9))))
        pts = tuple((p.tokens, p.ms) for p in step_cost.at(near) if p.tokens > 0 and p.ms > 0)
        return cls(near, pts) if len(pts) >= 2 else None

    def ms(self, tokens: float) -> float:
        """The time of a forward over ``tokens``: linear between the points, and past the last
        along the last segment (never below the last point's, nor below the first's before it)."""
        pts = self.points
        if tokens <= pts[0][0]:
            return pts[0][1]
        for (x0, y0), (x1, y1) in zip(pts, pts[1:], strict=False):
            if tokens <= x1:
                return y0 + (y1 - y0) * (tokens - x0) / (x1 - x0) if x1 > x0 else y1
        (x0, y0), (x1, y1) = pts[-2], pts[-1]
        slope = max((y1 - y0) / (x1 - x0), 0.0) if x1 > x0 else 0.0
        return y1 + slope * (tokens - x1)

    def ratio(self, drafted: float) -> float:
        """A step verifying ``drafted`` tokens per sequence against a decode step, at this batch."""
        return self.ms(self.batch * (1.0 + drafted)) / self.ms(float(self.batch))
