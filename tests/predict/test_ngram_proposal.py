"""The proposers' replays against vLLM's own proposers: spectune's n-gram proposer drafts what
vLLM's does, token for token (vLLM's function is read here, in the test, and nowhere else)."""

from __future__ import annotations

import numpy as np
import pytest

from spectune.predict import DraftReplays, ngram_proposal


def _vllm_ngram():  # noqa: ANN202
    from vllm.v1.spec_decode.ngram_proposer import (
        _find_longest_matched_ngram_and_propose_tokens,
    )

    return _find_longest_matched_ngram_and_propose_tokens


@pytest.mark.parametrize("vocab", [2, 3, 8, 50])
def test_the_ngram_proposal_is_vllms_on_random_token_streams(vocab: int) -> None:
    """Random streams over small vocabularies are full of repeated n-grams of every length, ties
    between positions and overlaps with the suffix itself: every case of vLLM's KMP search."""
    vllm_propose = _vllm_ngram()
    rng = np.random.default_rng(vocab)
    cases = 0
    for _ in range(400):
        tokens = rng.integers(0, vocab, size=int(rng.integers(1, 60)), dtype=np.int32)
        lo = int(rng.integers(1, 4))
        hi = lo + int(rng.integers(0, 4))
        k = int(rng.integers(1, 8))
        max_len = len(tokens) + int(rng.integers(0, 10))  # at, and past, the model's length
        ours = ngram_proposal(tokens, lo, hi, max_len, k)
        theirs = vllm_propose(tokens, lo, hi, max_len, k)
        assert ours.tolist() == theirs.tolist(), (tokens.tolist(), lo, hi, max_len, k)
        cases += bool(len(theirs))
    assert cases > 30  # many cases draft something


def test_the_ngram_proposal_of_a_code_like_stream() -> None:
    tokens = np.array([7, 1, 2, 3, 9, 1, 2, 3, 4, 5, 1, 2, 3], dtype=np.int32)
    # the suffix 1 2 3 first occurs after 7: it drafts what followed there
    assert ngram_proposal(tokens, 1, 3, 1000, 3).tolist() == [9, 1, 2]
    assert ngram_proposal(tokens, 4, 5, 1000, 3).tolist() == []  # no match of 4 tokens or more
    assert ngram_proposal(tokens, 1, 3, 14, 3).tolist() == [9]  # one token left before max_model_len


def test_draft_replays_are_kept_by_their_owner_and_a_missing_draft_is_asked_again(tmp_path) -> None:  # noqa: ANN001
    replays = DraftReplays()
    assert replays.guesses([], str(tmp_path / "nowhere")) is None
    assert replays.guesses([], str(tmp_path / "nowhere")) is None  # not remembered as refused: asked again
    broken = tmp_path / "broken"
    broken.mkdir()
    assert replays.guesses([], str(broken)) is None  # on the machine but no checkpoint: refused, once
    assert DraftReplays().guesses([], str(broken)) is None  # another owner asks for itself
