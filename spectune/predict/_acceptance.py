"""Acceptance arithmetic: what per-position acceptance says about tokens per step.

vLLM counts, per draft, the accepted tokens at each position only while every earlier one was
accepted; ``per_position[i]`` is therefore P(the first ``i + 1`` drafted tokens are all
accepted) and never increases with ``i``. Measured once at ``k = K``, it gives every ``k <= K``
by truncation (Leviathan et al. 2023, with measured positions in place of a constant alpha):
the first ``k`` tokens a proposer drafts do not depend on how many more it would have drafted,
and whether position ``i`` is accepted depends only on positions ``1..i``. What truncation cannot
see is that a different ``k`` moves the steps to other places of the text; over many drafts
that averages out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "AcceptanceProfile",
    "acceptance_rate_at",
    "conditional_acceptance",
    "expected_tokens_per_step",
    "leviathan_expected_tokens",
    "leviathan_improvement",
]


def _check(per_position: Sequence[float], k: int) -> None:
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if k > len(per_position):
        raise ValueError(f"k={k} exceeds the {len(per_position)} measured positions; truncation only shortens")


def expected_tokens_per_step(per_position: Sequence[float], k: int) -> float:
    """Tokens a drafted step yields at ``k``: ``1 + sum(per_position[:k])`` (the bonus token plus
    the expected accepted ones). Equals vLLM's mean acceptance length of the truncated counters.

    Raises:
        ValueError: ``k < 0`` or more positions than measured.
    """
    _check(per_position, k)
    return 1.0 + math.fsum(per_position[:k])


def acceptance_rate_at(per_position: Sequence[float], k: int) -> float:
    """Accepted over drafted tokens at ``k``, when every draft has ``k`` tokens (model drafts do;
    n-gram drafts can be shorter, see :mod:`spectune.predict` replay for those).

    Raises:
        ValueError: ``k < 1`` or more positions than measured.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    _check(per_position, k)
    return math.fsum(per_position[:k]) / k


def conditional_acceptance(per_position: Sequence[float]) -> list[float]:
    """P(token ``i`` accepted | the ones before it were): ``per_position[i] / per_position[i-1]``.

    A position after one that was never accepted gets 0.
    """
    out: list[float] = []
    prev = 1.0
    for p in per_position:
        out.append(p / prev if prev > 0 else 0.0)
        prev = p
    return out


def leviathan_expected_tokens(alpha: float, k: int) -> float:
    """Expected tokens per step with a constant acceptance ``alpha``: ``(1 - alpha^(k+1)) / (1 - alpha)``
    (Leviathan et al. 2023, eq. 1); ``k + 1`` at ``alpha = 1``."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def leviathan_improvement(alpha: float, k: int, c: float) -> float:
    """Walltime improvement over no speculation: ``(1 - alpha^(k+1)) / ((1 - alpha)(k c + 1))``,
    where ``c`` is the cost of one proposer token relative to one target step (Leviathan et al.
    2023, theorem 3.8). Below 1 means speculation slows decoding down."""
    if c < 0:
        raise ValueError(f"c must be >= 0, got {c}")
    return leviathan_expected_tokens(alpha, k) / (k * c + 1.0)


@dataclass(frozen=True)
class AcceptanceProfile:
    """Acceptance of one candidate as the cost model needs it.

    ``per_position`` as vLLM counts it (per draft, ``len == k``); ``draft_share`` is the share
    of decode steps that carried a draft (1 for model drafts; n-gram lookup finds no match on
    some steps, which then yield one token); ``mean_draft_length`` the drafted tokens per draft
    (``k`` unless drafts can be shorter).
    """

    per_position: tuple[float, ...]
    draft_share: float = 1.0
    mean_draft_length: float | None = None

    @property
    def k(self) -> int:
        return len(self.per_position)

    @property
    def mean_acceptance_length(self) -> float:
        """vLLM's figure: 1 + accepted tokens per draft."""
        return 1.0 + math.fsum(self.per_position)

    @property
    def acceptance_rate(self) -> float:
        """Accepted over drafted tokens."""
        length = self.mean_draft_length if self.mean_draft_length is not None else self.k
        return math.fsum(self.per_position) / length if length > 0 else 0.0

    @property
    def drafted_per_step(self) -> float:
        """Drafted tokens per decode step over all steps: what verification (and a model draft)
        costs. ``k`` for model drafts; fewer for n-gram and suffix drafts, which skip steps with
        no match and can be shorter than ``k``."""
        length = self.mean_draft_length if self.mean_draft_length is not None else float(self.k)
        return self.draft_share * length

    @property
    def tokens_per_step(self) -> float:
        """Output tokens per decode step over all steps, drafted or not: what divides step time."""
        return 1.0 + self.draft_share * math.fsum(self.per_position)

    def truncated(self, k: int) -> AcceptanceProfile:
        """The profile at a smaller ``k`` (see the module docstring for why this is sound)."""
        _check(self.per_position, k)
        length = None if self.mean_draft_length is None else min(self.mean_draft_length, float(k))
        return AcceptanceProfile(tuple(self.per_position[:k]), self.draft_share, length)

    @classmethod
    def leviathan(cls, alpha: float, k: int) -> AcceptanceProfile:
        """Constant acceptance ``alpha`` at every position: ``per_position[i] = alpha^(i+1)``."""
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        return cls(tuple(alpha ** (i + 1) for i in range(k)))
