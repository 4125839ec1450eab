"""The contract every proposer replay keeps (n-gram, suffix decoding, a draft model), run against
each on the same recorded outputs: what a replay reports is the engine's counters' shape, it is
deterministic, requests without token ids change nothing, and no draft reaches past
``max_model_len``. How close each comes to its engine is tests/test_predict.py's."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from conftest import REPO

from spectune.landscape import Landscape
from spectune.measurement import RequestSample
from spectune.predict import (
    ReplayAcceptance,
    draft_guesses,
    replay_draft,
    replay_ngram,
    replay_suffix,
)

Replay = Callable[..., ReplayAcceptance]


@pytest.fixture(scope="module")
def recorded() -> list[RequestSample]:
    """The tiny landscape's baseline: a real engine's outputs, with prompt and output token ids."""
    landscape = Landscape.load(REPO / "benchmarks" / "landscapes" / "tiny_one_start.json")
    base = next(p.measurement for p in landscape.points if p.label == "none" and p.measurement is not None)
    return [r for r in base.requests if r.ok][:12]


@pytest.fixture(scope="module", params=["ngram", "suffix", "draft_model"])
def replay(request: pytest.FixtureRequest, tiny_models) -> Replay:  # noqa: ANN001
    """``replay(requests, k, max_model_len=None)`` for each proposer."""
    if request.param == "ngram":
        return lambda reqs, k, **kw: replay_ngram(reqs, k, 1, 3, **kw)
    if request.param == "suffix":
        return lambda reqs, k, **kw: replay_suffix(reqs, k, **kw)

    def draft(reqs: list[RequestSample], k: int, **kw: object) -> ReplayAcceptance:
        return replay_draft(draft_guesses(reqs, str(tiny_models.draft), dtype="float32"), k, **kw)

    return draft


def test_a_replay_counts_as_the_engines_counters_do(replay: Replay, recorded: list[RequestSample]) -> None:
    rep = replay(recorded, 4)
    assert rep.num_requests == len(recorded) and rep.num_drafts > 0
    assert len(rep.accepted_per_pos) == 4
    assert sum(rep.accepted_per_pos) == rep.num_accepted_tokens <= rep.num_draft_tokens <= 4 * rep.num_drafts
    per = rep.per_position
    assert all(1.0 >= a >= b >= 0.0 for a, b in zip(per, per[1:], strict=False))  # the first i+1 all accepted
    assert rep.mean_acceptance_length == pytest.approx(1 + rep.num_accepted_tokens / rep.num_drafts)


def test_a_replay_is_deterministic_and_skips_requests_without_ids(replay: Replay, recorded: list[RequestSample]) -> None:
    first = replay(recorded, 3)
    blind = [r.model_copy(update={"token_ids": None}) for r in recorded[:3]]
    failed = [r.model_copy(update={"ok": False}) for r in recorded[:3]]
    again = replay([*blind, *recorded, *failed], 3)
    assert again.accepted_per_pos == first.accepted_per_pos and again.num_drafts == first.num_drafts


def test_no_replayed_draft_reaches_past_max_model_len(replay: Replay, recorded: list[RequestSample]) -> None:
    full = replay(recorded, 4)
    longest = max(len(r.prompt_token_ids or []) + len(r.token_ids or []) for r in recorded)
    cut = replay(recorded, 4, max_model_len=longest - 8)
    assert cut.num_draft_tokens < full.num_draft_tokens  # the last positions of the longest requests draft less
