"""Workload features: length distributions and n-gram repetition, inputs of the acceptance model.

Pure functions over prompts and (optionally) outputs and token ids; no I/O, no tokenizer. Words
are whitespace-separated pieces of text (``str.split``); tokens are the engine's token ids when
the caller has them.

Repetition, for n = 1..4, pooled over all requests (so long requests weigh more, as they do in
the count of drafted tokens):

- ``prompt_self_repetition``: the share of a prompt's n-grams that already occurred earlier in
  the same prompt. Known before anything is generated.
- ``output_in_prompt``: the share of an output's n-grams that occur anywhere in its prompt;
  what prompt-lookup (n-gram) proposers can copy.
- ``output_in_context``: the share of an output's n-grams that occur in its prompt or earlier in
  the output itself; what an n-gram proposer matching over the whole context can copy.

A share is None when no sequence is at least n long.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any

from spectune._util import StrictModel
from spectune.config import Prompt
from spectune.errors import ConfigError

__all__ = ["NGRAM_SIZES", "LengthStats", "NgramShares", "WorkloadFeatures", "compute_features"]

NGRAM_SIZES: tuple[int, ...] = (1, 2, 3, 4)


class LengthStats(StrictModel):
    """Distribution of one length over requests."""

    count: int
    mean: float
    p50: float
    p90: float
    min: float
    max: float


class NgramShares(StrictModel):
    """A share in [0, 1] per n-gram size; None when no sequence has an n-gram of that size."""

    n1: float | None
    n2: float | None
    n3: float | None
    n4: float | None

    def get(self, n: int) -> float | None:
        """The share for n-grams of size ``n`` (1..4)."""
        if n not in NGRAM_SIZES:
            raise ValueError(f"n must be one of {NGRAM_SIZES}, got {n}")
        return getattr(self, f"n{n}")


class WorkloadFeatures(StrictModel):
    """Features of a set of prompts and, when known, of the outputs generated for them."""

    num_prompts: int
    prompt_chars: LengthStats
    prompt_words: LengthStats
    prompt_tokens: LengthStats | None = None
    prompt_self_repetition_words: NgramShares
    prompt_self_repetition_tokens: NgramShares | None = None

    num_outputs: int = 0
    output_chars: LengthStats | None = None
    output_words: LengthStats | None = None
    output_tokens: LengthStats | None = None
    output_in_prompt_words: NgramShares | None = None
    output_in_prompt_tokens: NgramShares | None = None
    output_in_context_words: NgramShares | None = None
    output_in_context_tokens: NgramShares | None = None

    def flat(self) -> dict[str, float]:
        """Every known number as ``{"group.stat": value}`` (e.g. ``output_in_prompt_words.n3``),
        a fixed-name feature vector for a regression model; unknown values are left out."""
        out: dict[str, float] = {}
        for key, value in self.model_dump().items():
            if isinstance(value, dict):
                out.update({f"{key}.{k}": float(v) for k, v in value.items() if v is not None})
            elif value is not None:
                out[key] = float(value)
        return out


# -- pure helpers ----------------------------------------------------------------------------


def _quantile(sorted_xs: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) of non-empty sorted data."""
    pos = (len(sorted_xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return float(sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo))


def length_stats(lengths: Sequence[float]) -> LengthStats:
    """Count, mean, median, p90, min and max of ``lengths`` (non-empty)."""
    xs = sorted(lengths)
    if not xs:
        raise ConfigError("no lengths to describe")
    return LengthStats(
        count=len(xs), mean=sum(xs) / len(xs), p50=_quantile(xs, 0.5), p90=_quantile(xs, 0.9),
        min=float(xs[0]), max=float(xs[-1]),
    )


def _ngrams(seq: Sequence[Hashable], n: int) -> list[tuple[Hashable, ...]]:
    return [tuple(seq[i : i + n]) for i in range(len(seq) - n + 1)]


def _shares(hits: dict[int, int], totals: dict[int, int]) -> NgramShares:
    return NgramShares(**{f"n{n}": (hits[n] / totals[n] if totals[n] else None) for n in NGRAM_SIZES})


def self_repetition(seqs: Sequence[Sequence[Hashable]]) -> NgramShares:
    """Share of n-grams that already occurred earlier in the same sequence, pooled over ``seqs``."""
    hits = dict.fromkeys(NGRAM_SIZES, 0)
    totals = dict.fromkeys(NGRAM_SIZES, 0)
    for seq in seqs:
        for n in NGRAM_SIZES:
            seen: set[tuple[Hashable, ...]] = set()
            for g in _ngrams(seq, n):
                hits[n] += g in seen
                seen.add(g)
                totals[n] += 1
    return _shares(hits, totals)


def copy_share(
    contexts: Sequence[Sequence[Hashable]], outputs: Sequence[Sequence[Hashable]], *, include_output: bool = False
) -> NgramShares:
    """Share of each output's n-grams found in its context, pooled over the pairs.

    With ``include_output``, n-grams that occurred earlier in the same output count as found.
    """
    hits = dict.fromkeys(NGRAM_SIZES, 0)
    totals = dict.fromkeys(NGRAM_SIZES, 0)
    for ctx, out in zip(contexts, outputs, strict=True):
        for n in NGRAM_SIZES:
            known = set(_ngrams(ctx, n))
            for g in _ngrams(out, n):
                hits[n] += g in known
                totals[n] += 1
                if include_output:
                    known.add(g)
    return _shares(hits, totals)


def _check_len(name: str, values: Sequence[Any] | None, expected: int) -> None:
    if values is not None and len(values) != expected:
        raise ConfigError(f"{name}: {len(values)} given for {expected} prompts")


def compute_features(
    prompts: Sequence[Prompt | str],
    outputs: Sequence[str] | None = None,
    *,
    prompt_token_ids: Sequence[Sequence[int]] | None = None,
    output_token_ids: Sequence[Sequence[int]] | None = None,
) -> WorkloadFeatures:
    """Features of ``prompts`` and, when given, of ``outputs`` (``outputs[i]`` answers ``prompts[i]``).

    Chat prompts count as their messages joined by newlines (:meth:`Prompt.as_text`). Token-id
    features appear for whatever token ids are given; output-in-prompt over tokens needs both.

    Raises:
        ConfigError: no prompts, or a list whose length differs from the number of prompts.
    """
    if not prompts:
        raise ConfigError("no prompts to describe")
    texts = [p if isinstance(p, str) else p.as_text() for p in prompts]
    _check_len("outputs", outputs, len(texts))
    _check_len("prompt_token_ids", prompt_token_ids, len(texts))
    _check_len("output_token_ids", output_token_ids, len(texts))

    prompt_words = [t.split() for t in texts]
    features: dict[str, Any] = {
        "num_prompts": len(texts),
        "prompt_chars": length_stats([len(t) for t in texts]),
        "prompt_words": length_stats([len(w) for w in prompt_words]),
        "prompt_self_repetition_words": self_repetition(prompt_words),
    }
    if prompt_token_ids is not None:
        features["prompt_tokens"] = length_stats([len(t) for t in prompt_token_ids])
        features["prompt_self_repetition_tokens"] = self_repetition(prompt_token_ids)
    if outputs is not None:
        output_words = [o.split() for o in outputs]
        features.update(
            num_outputs=len(outputs),
            output_chars=length_stats([len(o) for o in outputs]),
            output_words=length_stats([len(w) for w in output_words]),
            output_in_prompt_words=copy_share(prompt_words, output_words),
            output_in_context_words=copy_share(prompt_words, output_words, include_output=True),
        )
    if output_token_ids is not None:
        features["num_outputs"] = len(output_token_ids)
        features["output_tokens"] = length_stats([len(t) for t in output_token_ids])
        if prompt_token_ids is not None:
            features["output_in_prompt_tokens"] = copy_share(prompt_token_ids, output_token_ids)
            features["output_in_context_tokens"] = copy_share(
                prompt_token_ids, output_token_ids, include_output=True
            )
    return WorkloadFeatures(**features)
