"""Offline replay of proposers against recorded target outputs, without an engine.

At temperature 0 the target's output does not depend on speculation (vLLM verifies greedily
and keeps exactly the target's own tokens), so one baseline run with token ids is enough to
know what every n-gram or suffix configuration would have drafted and had accepted, and, with
one forward pass of the draft over each recorded sequence, every ``k`` of a draft model
(:func:`replay_draft`). The replay steps through each request as the engine does:

- the first output token comes from the prefill, with nothing drafted;
- at each later step the context is ``prompt + output[:n]``; the proposer (vLLM's own
  function, or Arctic Inference's cache as vLLM drives it) drafts ``d``; a non-empty ``d`` counts
  as one draft of ``len(d)`` tokens; the accepted tokens are the common prefix of ``d`` and
  ``output[n:n+len(d)]``; position ``i`` is counted when the first ``i + 1`` were accepted;
- the step yields the accepted tokens and one more, so ``n += accepted + 1``.

Where a draft reaches past the recorded output (the request stopped on ``max_tokens``), the
engine compared the tail with tokens that were then cut off; the replay cannot know them and
counts them as rejected; ``num_truncated_drafts`` and ``truncated_per_pos`` say how often that
happened and at which positions, so the engine's own counts lie between ``accepted_per_pos``
and ``accepted_per_pos + truncated_per_pos``. Predictions read ``expected_per_pos``: each cut
position counted with the chance that it would have been accepted, the product of the
conditional acceptance of the positions from the cut on, as the positions compared with real
tokens measured it. With
temperature > 0 the recorded output is one sample among many and the replay is approximate.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from spectune.predict._acceptance import AcceptanceProfile

if TYPE_CHECKING:
    import numpy as np

    from spectune.counters import Acceptance

__all__ = ["UNLIMITED_MODEL_LEN", "ReplayAcceptance", "ReplayRequest", "Tally", "ngram_proposal", "recorded_pairs",
           "replay_ngram", "replay_suffix", "suffix_available"]

logger = logging.getLogger(__name__)

UNLIMITED_MODEL_LEN = 2**31 - 1
"""``max_model_len`` when the engine's is not known: no draft is ever cut by the model length."""


class ReplayRequest(Protocol):
    """What the replay reads of a request (:class:`spectune.trial.RequestSample` has it)."""

    @property
    def prompt_token_ids(self) -> list[int] | None: ...

    @property
    def token_ids(self) -> list[int] | None: ...


@dataclass(frozen=True)
class ReplayAcceptance:
    """Acceptance figures of a replay, in the terms of :class:`spectune.counters.Acceptance`,
    with the step counts the cost model needs.

    ``num_steps`` counts decode steps, drafted or not (the prefill's token excluded);
    ``num_decode_tokens`` the output tokens they produced.
    """

    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_pos: tuple[int, ...]
    num_requests: int
    num_steps: int
    num_decode_tokens: int
    num_truncated_drafts: int
    truncated_per_pos: tuple[int, ...] = ()
    expected_per_pos: tuple[float, ...] = ()
    """``accepted_per_pos`` with the positions cut off counted as likely accepted (see the module
    docstring); ``accepted_per_pos`` itself when nothing was cut."""
    spread: float = 0.0
    """Relative uncertainty of the replayed tokens per step: 0 where the replay runs the
    engine's own proposer code, :data:`DRAFT_REPLAY_SPREAD` for a draft model run elsewhere."""

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def per_position(self) -> list[float]:
        return [x / self.num_drafts if self.num_drafts else 0.0 for x in self.accepted_per_pos]

    @property
    def draft_share(self) -> float:
        """Share of decode steps that carried a draft."""
        return self.num_drafts / self.num_steps if self.num_steps else 0.0

    def acceptance(self) -> Acceptance | None:
        """As :class:`spectune.counters.Acceptance` (None when nothing was drafted, as for counters)."""
        from spectune.counters import SpecCounters

        return SpecCounters(
            num_drafts=self.num_drafts, num_draft_tokens=self.num_draft_tokens,
            num_accepted_tokens=self.num_accepted_tokens,
            accepted_per_pos=tuple(float(x) for x in self.accepted_per_pos),
        ).acceptance()

    def profile(self) -> AcceptanceProfile:
        """As an :class:`~spectune.predict.AcceptanceProfile` for the cost model, the cut
        positions counted as likely accepted (``expected_per_pos``)."""
        expected = self.expected_per_pos or self.accepted_per_pos
        return AcceptanceProfile(
            tuple(x / self.num_drafts if self.num_drafts else 0.0 for x in expected), draft_share=self.draft_share,
            mean_draft_length=self.num_draft_tokens / self.num_drafts if self.num_drafts else None,
        )


class Tally:
    def __init__(self, k: int) -> None:
        self.k = k
        self.drafts = self.draft_tokens = self.accepted = self.requests = 0
        self.steps = self.decode_tokens = self.truncated = 0
        self.per_pos = [0] * k  # accepted at each position
        self.reached = [0] * k  # compared with real tokens at each position: accepted up to it
        self.cuts: list[tuple[int, int]] = []  # (first position cut off, draft length) per cut draft

    def step(self, draft: Sequence[int], output: Sequence[int], n: int) -> int:
        """Count one decode step at ``n`` output tokens; return the tokens it yields."""
        self.steps += 1
        a = 0
        if len(draft):
            self.drafts += 1
            self.draft_tokens += len(draft)
            truth = output[n : n + len(draft)]
            while a < len(truth) and int(draft[a]) == int(truth[a]):
                a += 1
            cut = a == len(truth) < len(draft)  # the rest was compared with tokens cut off
            if cut:
                self.truncated += 1
                self.cuts.append((a, min(len(draft), self.k)))
            for i in range(min(a if cut else a + 1, len(draft), self.k)):
                self.reached[i] += 1
            self.accepted += a
            for i in range(min(a, self.k)):
                self.per_pos[i] += 1
        got = min(a + 1, len(output) - n)
        self.decode_tokens += got
        return got

    def expected(self) -> tuple[float, ...]:
        """``per_pos`` plus, for each cut draft, each cut position's chance of acceptance."""
        cond: list[float] = []
        for w, r in zip(self.per_pos, self.reached, strict=True):  # a position never reached: as the one before
            cond.append(w / r if r else cond[-1] if cond else 0.0)
        out = [float(x) for x in self.per_pos]
        for first, length in self.cuts:
            chance = 1.0
            for i in range(first, length):
                chance *= cond[i]
                out[i] += chance
        return tuple(out)

    def result(self, spread: float = 0.0) -> ReplayAcceptance:
        cut_pos = [0] * self.k
        for first, length in self.cuts:
            for i in range(first, length):
                cut_pos[i] += 1
        return ReplayAcceptance(
            num_drafts=self.drafts, num_draft_tokens=self.draft_tokens, num_accepted_tokens=self.accepted,
            accepted_per_pos=tuple(self.per_pos), num_requests=self.requests, num_steps=self.steps,
            num_decode_tokens=self.decode_tokens, num_truncated_drafts=self.truncated,
            truncated_per_pos=tuple(cut_pos), expected_per_pos=self.expected(), spread=spread,
        )


def recorded_pairs(requests: Iterable[ReplayRequest]) -> list[tuple[list[int], list[int]]]:
    out = []
    for r in requests:
        if getattr(r, "ok", True) is False:
            continue
        if r.prompt_token_ids is None or r.token_ids is None:
            continue
        out.append((list(r.prompt_token_ids), list(r.token_ids)))
    return out


def ngram_proposal(tokens: np.ndarray, min_n: int, max_n: int, max_model_len: int, k: int) -> np.ndarray:
    """What vLLM's n-gram proposer drafts after ``tokens``: the tokens that followed the earliest
    earlier occurrence of the longest suffix of ``tokens`` of ``min_n`` to ``max_n`` tokens, at
    most ``k`` of them (fewer where ``max_model_len`` or the end of ``tokens`` comes first).

    spectune's own implementation of vLLM's rule (``v1/spec_decode/ngram_proposer.py``, a KMP
    search over the reversed tokens); tests/test_replay.py checks that both draft the same."""
    import numpy as np

    total = int(tokens.shape[0])
    k = min(k, max_model_len - total)
    if total < min_n or k <= 0:
        return tokens[:0]
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: total - 1], n)
        found = np.flatnonzero((windows == tokens[total - n :]).all(axis=1))
        if found.size:
            start = int(found[0]) + n
            return tokens[start : start + min(k, total - start)]
    return tokens[:0]


def replay_ngram(
    requests: Iterable[ReplayRequest],
    k: int,
    prompt_lookup_min: int,
    prompt_lookup_max: int,
    *,
    max_model_len: int | None = None,
) -> ReplayAcceptance:
    """What vLLM's n-gram proposer (``method: ngram``) drafts and has accepted on these outputs
    (:func:`ngram_proposal` at every step). Requests without token ids, or failed, are skipped.

    Raises:
        ValueError: ``k < 1`` or an empty or inverted lookup window.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not 1 <= prompt_lookup_min <= prompt_lookup_max:
        raise ValueError(f"need 1 <= prompt_lookup_min <= prompt_lookup_max, got {prompt_lookup_min}..{prompt_lookup_max}")
    import numpy as np

    limit = max_model_len or UNLIMITED_MODEL_LEN
    tally = Tally(k)
    for prompt, output in recorded_pairs(requests):
        tally.requests += 1
        tokens = np.array(prompt + output, dtype=np.int32)
        n = 1 if output else 0
        while n < len(output):
            total = len(prompt) + n
            draft = ngram_proposal(tokens[:total], prompt_lookup_min, prompt_lookup_max, limit, k) if total < limit else ()
            n += tally.step(draft, output, n)
    return tally.result()


def suffix_available() -> bool:
    """Whether Arctic Inference's suffix cache (what vLLM's ``method: suffix`` uses) is importable."""
    import importlib.util

    try:
        return importlib.util.find_spec("arctic_inference.suffix_decoding") is not None
    except (ImportError, ValueError):
        return False


def replay_suffix(
    requests: Iterable[ReplayRequest],
    k: int | None = None,
    *,
    max_tree_depth: int = 24,
    max_cached_requests: int = 10000,
    max_spec_factor: float = 1.0,
    min_token_prob: float = 0.1,
    max_model_len: int | None = None,
) -> ReplayAcceptance:
    """What vLLM's suffix proposer (``method: suffix``) drafts and has accepted on these outputs.

    Drives ``arctic_inference.suffix_decoding.SuffixDecodingCache`` with the calls vLLM's
    ``SuffixDecodingProposer`` makes (defaults are vLLM's; ``k`` None means ``max_tree_depth``,
    as vLLM does). The requests are replayed one after the other in their recorded order, in
    one cache, so earlier responses feed later drafts as on a long-lived server; a run at
    concurrency > 1 interleaved them, which changes what the global tree held at each step.

    Raises:
        ImportError: arctic_inference is not installed (see :func:`suffix_available`).
        ValueError: ``k < 1``.
    """
    k = max_tree_depth if k is None else k
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    import numpy as np
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    limit = max_model_len or UNLIMITED_MODEL_LEN
    cache = SuffixDecodingCache(max_tree_depth=max_tree_depth, max_cached_requests=max_cached_requests)
    tally = Tally(k)
    for index, (prompt, output) in enumerate(recorded_pairs(requests)):
        tally.requests += 1
        if not output:
            continue
        req_id = f"replay-{index}"
        tokens = np.array(prompt + output, dtype=np.int32)
        cache.start_request(req_id, np.array(prompt, dtype=np.int32))
        sampled: Sequence[int] = output[:1]  # the prefill's token
        n = 1
        while True:
            cache.add_active_response(req_id, np.asarray(sampled, dtype=np.int32))
            if n >= len(output):
                break
            total = len(prompt) + n
            draft: Sequence[int] = ()
            if total < limit:
                pattern = tokens[max(0, total - max_tree_depth) : total]
                draft = cache.speculate(
                    req_id, pattern, max_spec_tokens=min(k, limit - total - 1),
                    max_spec_factor=max_spec_factor, min_token_prob=min_token_prob,
                ).token_ids
            got = tally.step(draft, output, n)
            sampled = output[n : n + got]
            n += got
        cache.stop_request(req_id)
    return tally.result()


