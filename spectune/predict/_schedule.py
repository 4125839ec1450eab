"""A ``num_speculative_tokens_per_batch_size`` schedule for vLLM, derived from the cost model.

vLLM (``SpeculativeConfig.num_speculative_tokens_per_batch_size``) takes a list of inclusive
batch-size ranges ``[range_start, range_end, k]`` and drafts ``k`` tokens (0: none) when the
running batch has that many requests; ``num_speculative_tokens`` stays the upper limit.

The study measures ``c``, the cost of one drafted token relative to a target step, at one
concurrency ``b1``. A decode step costs a fixed part ``A`` (reading the weights) plus a part
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

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from spectune.predict._acceptance import AcceptanceProfile

__all__ = ["BatchSchedule", "batch_cost", "derive_schedule"]

_C_MIN, _C_MAX = 1e-6, 0.999


def batch_cost(c1: float, b1: int, b: int) -> float:
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
    measured_concurrency: int
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
    measured_concurrency: int,
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
