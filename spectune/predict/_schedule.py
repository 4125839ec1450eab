"""A ``num_speculative_tokens_per_batch_size`` schedule for vLLM: from what a concurrency sweep
measured at each level (:func:`level_costs`, :func:`measured_schedule`), else from the cost
model at one concurrency and the roofline's shape (:func:`derive_schedule`).

vLLM (``SpeculativeConfig.num_speculative_tokens_per_batch_size``) takes a list of inclusive
batch-size ranges ``[range_start, range_end, k]`` and drafts ``k`` tokens (0: none) when the
running batch has that many requests; ``num_speculative_tokens`` stays the upper limit.

Without a sweep, the study measures ``c``, the cost of one drafted token relative to a target
step, at one concurrency ``b1``. A decode step costs a fixed part ``A`` (reading the weights) plus a part
``B`` per token the batch processes; speculation makes each of the ``b`` requests process
``k + 1`` tokens, so::

    t(b, k) / t(b, 0) = 1 + c(b) k,   c(b) = B b / (A + B b),   B / A = c1 / (b1 (1 - c1))

Memory-bound small batches draft cheaply, compute-bound large ones do not. For each batch size
the schedule takes the ``k`` (0 included) maximising ``E(k) / (1 + c(b) k)``, with ``E(k)`` the
tokens per step from the proposer's per-position acceptance cut to ``k``
(:class:`~spectune.predict.AcceptanceProfile`). The model is the roofline's first-order shape,
fitted on one concurrency. A study that swept several (``concurrency_levels``) measures ``c(b)``
instead: :class:`~spectune.predict.ConcurrencyModel` scales ``c1`` by how the proposer's
speculative part grew with the batch there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spectune.predict._acceptance import AcceptanceProfile

if TYPE_CHECKING:
    from spectune.measurement import LevelStats, Measurement

__all__ = ["BatchSchedule", "LevelCost", "batch_cost", "derive_schedule", "level_costs", "level_profile",
           "measured_schedule"]

_C_MIN, _C_MAX = 1e-6, 0.999


def batch_cost(c1: float, b1: float, b: float) -> float:
    """``c(b)`` from ``c1`` measured at concurrency ``b1`` (see the module docstring)."""
    if b1 < 1 or b < 1:
        raise ValueError(f"batch sizes must be >= 1, got b1={b1}, b={b}")
    c1 = min(max(c1, _C_MIN), _C_MAX)
    ratio = c1 / (b1 * (1.0 - c1))  # B / A
    return ratio * b / (1.0 + ratio * b)


@dataclass(frozen=True)
class BatchSchedule:
    """The schedule and what it rests on."""

    ranges: list[tuple[int, int, int]]
    """``[range_start, range_end, k]``, inclusive, from 1 to ``max_batch``: vLLM's format."""
    c1: float
    measured_concurrency: float
    max_k: int

    def to_vllm(self) -> list[list[int]]:
        return [list(r) for r in self.ranges]

    def k_at(self, batch: int) -> int:
        for lo, hi, k in self.ranges:
            if lo <= batch <= hi:
                return k
        return self.ranges[-1][2]


def _best_k(profile: AcceptanceProfile, c: float, max_k: int) -> int:
    gains = [1.0] + [profile.truncated(k).tokens_per_step / (1.0 + c * k) for k in range(1, max_k + 1)]
    best = max(range(len(gains)), key=lambda k: (gains[k], -k))  # ties: the smaller k
    return best


def derive_schedule(
    profile: AcceptanceProfile | Sequence[float],
    *,
    c1: float,
    measured_concurrency: float,
    max_batch: int = 256,
    max_k: int | None = None,
    cost_at: Callable[[int], float] | None = None,
) -> BatchSchedule:
    """The batch-size schedule of one proposer (see the module docstring).

    ``profile`` is the proposer's measured per-position acceptance (or an AcceptanceProfile);
    ``max_k`` (default: its length) the ``num_speculative_tokens`` exported with it.
    ``cost_at`` gives ``c(b)`` where a sweep measured how cost grows with the batch
    (:class:`~spectune.predict.ConcurrencyModel`); without it, :func:`batch_cost`.

    Raises:
        ValueError: an empty profile, ``max_k`` beyond it, or batch sizes < 1.
    """
    if not isinstance(profile, AcceptanceProfile):
        profile = AcceptanceProfile(tuple(profile))
    if not profile.per_position:
        raise ValueError("the proposer has no measured per-position acceptance")
    max_k = len(profile.per_position) if max_k is None else max_k
    if not 1 <= max_k <= len(profile.per_position):
        raise ValueError(f"max_k must be in 1..{len(profile.per_position)}, got {max_k}")
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    ranges: list[tuple[int, int, int]] = []
    for b in range(1, max_batch + 1):
        c = cost_at(b) if cost_at is not None else batch_cost(c1, measured_concurrency, b)
        k = _best_k(profile, c, max_k)
        if ranges and ranges[-1][2] == k:
            ranges[-1] = (ranges[-1][0], b, k)
        else:
            ranges.append((b, b, k))
    return BatchSchedule(ranges=ranges, c1=c1, measured_concurrency=measured_concurrency, max_k=max_k)


# -- from what a sweep measured ------------------------------------------------------------------


@dataclass(frozen=True)
class LevelCost:
    """One proposer's step cost at one measured batch size: ``t(b, k) / t(b, 0) = 1 + overhead +
    c d`` with ``d`` the drafted tokens per step, fitted over the proposer's trials (several ``k``
    give both parts; one gives ``c`` alone), and its acceptance there."""

    batch: float
    overhead: float
    c: float
    profile: AcceptanceProfile
    """Acceptance at this level, from the level's own counters (the largest ``k`` measured)."""
    source: str
    """Where the step times come from: ``throughput`` (the client's output throughput),
    ``engine`` (the engine core's own time per output token) or ``client_tpot`` (the client's)."""
    ks: tuple[int, ...]

    def gain(self, k: int, overhead: float | None = None, c: float | None = None) -> float:
        """Tokens per unit of baseline step time at ``k`` (0: 1, no speculation)."""
        if k == 0:
            return 1.0
        p = self.profile.truncated(k)
        o = self.overhead if overhead is None else overhead
        return p.tokens_per_step / (1.0 + o + (self.c if c is None else c) * p.drafted_per_step)

    def record(self) -> dict[str, object]:
        return {"batch": self.batch, "overhead": self.overhead, "c": self.c, "source": self.source,
                "ks": list(self.ks), "mean_acceptance_length": self.profile.mean_acceptance_length}


def level_profile(level: LevelStats) -> AcceptanceProfile | None:
    """Acceptance at one level of a sweep, with the share of its decode steps that drafted
    (as :func:`~spectune.predict._measured.measured_profile`, from the level's own counts)."""
    acc = level.acceptance
    if acc is None or acc.num_drafts <= 0:
        return None
    ok = level.num_requests - level.num_failed
    decode_tokens = level.output_throughput * level.duration_seconds - ok
    steps = decode_tokens - acc.num_accepted_tokens
    share = min(1.0, acc.num_drafts / steps) if steps > 0 else 1.0
    return AcceptanceProfile(tuple(acc.per_position), draft_share=share,
                             mean_draft_length=acc.num_draft_tokens / acc.num_drafts)


def _step_ratio(level: LevelStats, base: LevelStats, e: float, source: str) -> float | None:
    """``t(b, k) / t(b, 0)``: tokens per step times the ratio of times per token, by ``source``
    (:attr:`LevelCost.source`)."""
    if source == "throughput":
        return e * base.output_throughput / level.output_throughput if level.output_throughput > 0 else None
    if source == "engine":
        tk = level.engine_timing.tpot_ms if level.engine_timing else None
        t0 = base.engine_timing.tpot_ms if base.engine_timing else None
    else:
        tk, t0 = level.tpot_median_ms, base.tpot_median_ms
    return e * tk / t0 if tk and t0 else None


def _fit_line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """``(overhead, c)`` of ``x = overhead + c d`` by least squares, neither below 0 (a single
    ``d``, or a line falling with ``d``: through the origin)."""
    ds = {d for d, _ in points}
    if len(ds) >= 2:
        md = sum(d for d, _ in points) / len(points)
        mx = sum(x for _, x in points) / len(points)
        c = sum((d - md) * (x - mx) for d, x in points) / sum((d - md) ** 2 for d, _ in points)
        o = mx - c * md
        if c >= 0 and o >= 0:
            return o, c
    c = sum(d * x for d, x in points) / sum(d * d for d, _ in points)
    return 0.0, max(c, 0.0)


def level_costs(baseline: Measurement, engines: Sequence[Measurement], *, basis: str = "throughput") -> list[LevelCost]:
    """The step cost of one proposer (``engines``: its measurements, any ``k``) at each level both
    it and the baseline measured, in batch order (a level at a request rate at the batch the
    baseline ran there, :attr:`~spectune.measurement.LevelStats.batch`).

    ``basis`` ``throughput``: step times from the output throughput the client measured, which
    carries what speculation does to the prefills sharing the steps (what a throughput objective
    is). ``tpot``: from the engine core's own time per output token where the baseline and every
    trial at that level report it, else from the client's median TPOT (a latency objective)."""
    out = []
    for base in baseline.levels or []:
        pairs = [(lv, p) for m in engines if (lv := m.level_at(base.key)) is not None
                 and (p := level_profile(lv)) is not None]
        if not pairs or base.output_throughput <= 0:
            continue
        source = "throughput" if basis == "throughput" else "engine" if all(
            lv.engine_timing is not None and lv.engine_timing.tpot_ms for lv in [base, *(lv for lv, _ in pairs)]) \
            else "client_tpot"
        points = [(p.drafted_per_step, r - 1.0) for lv, p in pairs
                  if (r := _step_ratio(lv, base, p.tokens_per_step, source)) is not None]
        if not points:
            continue
        o, c = _fit_line(points)
        longest = max(pairs, key=lambda pair: pair[1].k)[1]
        out.append(LevelCost(base.batch, o, c, longest, source, tuple(sorted({p.k for _, p in pairs}))))
    return out


def measured_schedule(costs: Sequence[LevelCost], *, max_k: int, max_batch: int = 256,
                      scale: Callable[[int], float] | None = None) -> BatchSchedule:
    """The batch-size schedule from the step costs a sweep measured (:func:`level_costs`).

    At a measured batch size, the ``k`` (0 included) with the most tokens per unit of baseline
    step time; between two, each ``k``'s gain interpolated geometrically in ``log b``; beyond the
    measured ones, the nearest level's cost moved by ``scale(b) / scale(edge)`` (the sweep model's
    growth with the batch, :class:`ConcurrencyModel`), or held.

    Raises:
        ValueError: no level measured, ``max_k`` beyond the measured profiles, or ``max_batch`` < 1.
    """
    if not costs:
        raise ValueError("no level of the sweep measured this proposer and the baseline")
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    costs = sorted(costs, key=lambda lc: lc.batch)
    if not 1 <= max_k <= min(lc.profile.k for lc in costs):
        raise ValueError(f"max_k must be in 1..{min(lc.profile.k for lc in costs)}, got {max_k}")

    def k_at(b: int) -> int:
        lo = max((lc for lc in costs if lc.batch <= b), key=lambda lc: lc.batch, default=None)
        hi = min((lc for lc in costs if lc.batch >= b), key=lambda lc: lc.batch, default=None)
        if lo is None or hi is None:  # beyond the measured levels
            edge = hi or lo
            assert edge is not None
            g = scale(b) / scale(edge.batch) if scale is not None and scale(edge.batch) > 0 else 1.0
            gains = [edge.gain(k, edge.overhead * g, edge.c * g) for k in range(max_k + 1)]
        elif lo is hi:
            gains = [lo.gain(k) for k in range(max_k + 1)]
        else:  # each k's gain, interpolated in log b between the two levels
            w = (math.log(b) - math.log(lo.batch)) / (math.log(hi.batch) - math.log(lo.batch))
            gains = [lo.gain(k) ** (1.0 - w) * hi.gain(k) ** w for k in range(max_k + 1)]
        return max(range(max_k + 1), key=lambda k: (gains[k], -k))  # ties: the smaller k

    ranges: list[tuple[int, int, int]] = []
    for b in range(1, max_batch + 1):
        k = k_at(b)
        if ranges and ranges[-1][2] == k:
            ranges[-1] = (ranges[-1][0], b, k)
        else:
            ranges.append((b, b, k))
    first = costs[0]
    return BatchSchedule(ranges=ranges, c1=first.c, measured_concurrency=first.batch, max_k=max_k)
