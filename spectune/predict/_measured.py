"""Reading what the modelling needs out of a stored Measurement (pure functions)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel

from spectune.config import Method, SpecConfig
from spectune.predict._acceptance import AcceptanceProfile

if TYPE_CHECKING:
    from spectune.measurement import Measurement

# vLLM's own defaults (vllm/config/speculative.py), where a candidate leaves them unset.
NGRAM_DEFAULT_LOOKUP = 5
SUFFIX_DEFAULTS = {
    "suffix_decoding_max_tree_depth": 24,
    "suffix_decoding_max_cached_requests": 10000,
    "suffix_decoding_max_spec_factor": 1.0,
    "suffix_decoding_min_token_prob": 0.1,
}


def lookup_window(spec: SpecConfig) -> tuple[int, int]:
    """n-gram ``(prompt_lookup_min, prompt_lookup_max)`` as vLLM completes them (5..5 when unset,
    the given one for both when one is unset)."""
    lo, hi = spec.prompt_lookup_min, spec.prompt_lookup_max
    if lo is None and hi is None:
        return NGRAM_DEFAULT_LOOKUP, NGRAM_DEFAULT_LOOKUP
    return (lo if lo is not None else hi), (hi if hi is not None else lo)  # type: ignore[return-value]


def suffix_params(spec: SpecConfig) -> dict[str, float | int]:
    """Suffix-decoding parameters with vLLM's defaults filled in."""
    return {key: (getattr(spec, key) if getattr(spec, key) is not None else default)
            for key, default in SUFFIX_DEFAULTS.items()}


def effective_k(spec: SpecConfig) -> int | None:
    """Drafted tokens per step at most: ``num_speculative_tokens``, or for suffix decoding vLLM's
    default (the tree depth); None when the proposer's own config decides (MTP, Medusa...)."""
    if spec.num_speculative_tokens is not None:
        return spec.num_speculative_tokens
    if spec.method is Method.SUFFIX:
        return int(suffix_params(spec)["suffix_decoding_max_tree_depth"])
    return None


def proposer_of(spec: SpecConfig) -> SpecConfig:
    """The candidate without its ``k``: candidates with the same proposer share acceptance by truncation."""
    return spec.model_copy(update={"num_speculative_tokens": None})


def measured_profile(m: Measurement) -> AcceptanceProfile | None:
    """Acceptance of a measured trial, with the share of decode steps that carried a draft.

    Decode steps: every output token but each request's first comes from a decode step, and a
    step yields one token plus the accepted ones, so ``steps = decode tokens - accepted``.
    """
    acc = m.acceptance
    if acc is None or acc.num_drafts <= 0:
        return None
    ok = [r for r in m.requests if r.ok and (r.output_tokens or 0) > 0]
    decode_tokens = sum((r.output_tokens or 0) - 1 for r in ok)
    steps = decode_tokens - acc.num_accepted_tokens
    share = min(1.0, acc.num_drafts / steps) if steps > 0 else 1.0
    return AcceptanceProfile(tuple(acc.per_position), draft_share=share,
                             mean_draft_length=acc.num_draft_tokens / acc.num_drafts)


def accepted_sd(profile: AcceptanceProfile, num_drafts: int) -> float:
    """Standard error of the mean accepted tokens per draft, from ``num_drafts`` drafts.

    Accepted tokens per draft are ``A = sum_i I_i`` with nested indicators (``I_i = 1`` implies
    ``I_j = 1`` for ``j < i``), so ``E[A^2] = sum_i (2i + 1) p_i`` (0-based ``i``) exactly.
    """
    if num_drafts <= 0:
        return 0.0
    pp = profile.per_position
    mean = math.fsum(pp)
    second = math.fsum((2 * i + 1) * p for i, p in enumerate(pp))
    return math.sqrt(max(second - mean * mean, 0.0) / num_drafts)


def mean_over_engines(engines: Sequence[Measurement]) -> Measurement:
    """One configuration measured on several engines, as the figures predictions and objectives
    read: the first engine's Measurement (its outputs and counters, for replay and acceptance)
    with every measured figure replaced by its mean over the engines: throughputs, latency
    statistics, each window (the i-th of every engine; the first engine's windows when the
    engines ran different numbers) and each level of a sweep (where every engine measured it).
    A figure one engine lacks stays None. One engine: itself."""
    first = engines[0]
    if len(engines) == 1:
        return first
    windows = first.windows
    if all(len(m.windows) == len(windows) for m in engines):
        windows = [_mean_figures(list(each)) for each in zip(*(m.windows for m in engines), strict=True)]
    levels = []
    for level in first.levels:
        same = [lv for m in engines if m.levels and (lv := m.level_at(level.key)) is not None]
        # the rate is the level's key: kept as it is, not averaged into a float that no longer matches
        levels.append(_mean_figures(same).model_copy(update={"request_rate": level.request_rate})
                      if len(same) == len(engines) else level)
    figures = _mean_figures(engines)
    return figures.model_copy(update={
        **{k: _mean_figures([getattr(m, k) for m in engines]) for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")},
        "windows": windows, "levels": levels,
    })


_M = TypeVar("_M", bound=BaseModel)


def _mean_figures(models: Sequence[_M]) -> _M:
    """The first of ``models`` with each of its float fields the mean over all of them (None
    where one lacks it); other fields (counts, nested models) the first's."""
    update: dict[str, float | None] = {}
    for name, value in models[0]:
        if isinstance(value, float) or (value is None and any(isinstance(getattr(m, name), float) for m in models)):
            values = [getattr(m, name) for m in models]
            update[name] = None if None in values else statistics.fmean(values)
    return models[0].model_copy(update=update)
