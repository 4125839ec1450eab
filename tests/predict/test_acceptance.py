"""Acceptance: truncation of measured counters, Leviathan's formulas, and the suffix and draft replays' counting."""

from __future__ import annotations

import random

import pytest
from synthetic import (
    request_sample,
)

from spectune.counters import SpecCounters
from spectune.predict import (
    AcceptanceProfile,
    acceptance_rate_at,
    conditional_acceptance,
    expected_tokens_per_step,
    leviathan_expected_tokens,
    leviathan_improvement,
    replay_suffix,
    suffix_available,
)


def test_truncation_is_exact_on_recorded_counters() -> None:
    drafts, per_pos = 200, (170, 121, 80, 33, 9)  # drafts whose first i+1 tokens were accepted
    big_k = len(per_pos)
    full = SpecCounters(num_drafts=drafts, num_draft_tokens=drafts * big_k, num_accepted_tokens=sum(per_pos),
                        accepted_per_pos=per_pos).acceptance()
    assert full is not None
    profile = AcceptanceProfile(tuple(full.per_position))
    assert expected_tokens_per_step(full.per_position, big_k) == pytest.approx(full.mean_acceptance_length)
    assert expected_tokens_per_step(full.per_position, 0) == 1.0
    for k in range(1, big_k + 1):
        # what vLLM would have counted had the proposer drafted only the first k tokens of each draft
        cut = SpecCounters(num_drafts=drafts, num_draft_tokens=drafts * k, num_accepted_tokens=sum(per_pos[:k]),
                           accepted_per_pos=per_pos[:k]).acceptance()
        assert cut is not None
        assert expected_tokens_per_step(full.per_position, k) == pytest.approx(1 + cut.num_accepted_tokens / cut.num_drafts)
        assert expected_tokens_per_step(full.per_position, k) == pytest.approx(cut.mean_acceptance_length)
        assert acceptance_rate_at(full.per_position, k) == pytest.approx(cut.acceptance_rate)
        assert profile.truncated(k).tokens_per_step == pytest.approx(cut.mean_acceptance_length)
        assert profile.truncated(k).acceptance_rate == pytest.approx(cut.acceptance_rate)
    with pytest.raises(ValueError, match="truncation only shortens"):
        expected_tokens_per_step(full.per_position, big_k + 1)
    cond = conditional_acceptance(full.per_position)
    assert cond == pytest.approx([170 / 200, 121 / 170, 80 / 121, 33 / 80, 9 / 33])
    assert conditional_acceptance([0.5, 0.0, 0.0]) == [0.5, 0.0, 0.0]


def test_leviathan_formulas() -> None:
    assert leviathan_expected_tokens(0.5, 1) == pytest.approx(1.5)
    assert leviathan_expected_tokens(0.5, 3) == pytest.approx(1.875)
    assert leviathan_expected_tokens(0.8, 5) == pytest.approx((1 - 0.8**6) / 0.2)  # 3.68928
    assert leviathan_expected_tokens(0.0, 4) == 1.0
    # alpha -> 1: every drafted token accepted, k + 1 tokens a step, continuously
    for k in (1, 3, 7):
        assert leviathan_expected_tokens(1.0, k) == k + 1
        assert leviathan_expected_tokens(1 - 1e-9, k) == pytest.approx(k + 1, rel=1e-6)
        assert leviathan_improvement(1.0, k, 0.1) == pytest.approx((k + 1) / (0.1 * k + 1))
    # constant alpha is the special case per_position[i] = alpha^(i+1)
    assert expected_tokens_per_step(AcceptanceProfile.leviathan(0.7, 4).per_position, 4) == pytest.approx(
        leviathan_expected_tokens(0.7, 4))
    assert leviathan_improvement(0.8, 5, 0.05) == pytest.approx(3.68928 / 1.25)
    assert leviathan_improvement(0.8, 0, 0.3) == 1.0  # no speculation, no change
    # a dear proposer makes speculation slower than none
    assert leviathan_improvement(0.5, 3, 1.0) < 1.0
    assert leviathan_improvement(0.9, 8, 2.0) < 1.0
    with pytest.raises(ValueError):
        leviathan_expected_tokens(1.2, 3)


@pytest.mark.skipif(not suffix_available(), reason="arctic_inference is not installed")
def test_suffix_replay_learns_from_earlier_responses() -> None:
    rng = random.Random(0)
    prompt = [rng.randrange(1000, 30000) for _ in range(40)]
    output = [rng.randrange(1000, 30000) for _ in range(60)]  # no repetition inside, none with the prompt
    one = replay_suffix([request_sample(prompt, output)], 4)
    twice = replay_suffix([request_sample(prompt, output), request_sample(prompt, output)], 4)
    no_cache = replay_suffix([request_sample(prompt, output), request_sample(prompt, output)], 4, max_cached_requests=0)
    for r in (one, twice, no_cache):  # bookkeeping: every output token but the first from a decode step
        assert r.num_decode_tokens == r.num_requests * (len(output) - 1)
        # a step yields its accepted tokens and one more, unless the output ends with the accepted ones
        assert 0 <= r.num_steps - (r.num_decode_tokens - r.num_accepted_tokens) <= r.num_requests
        assert list(r.accepted_per_pos) == sorted(r.accepted_per_pos, reverse=True)
        assert sum(r.accepted_per_pos) == r.num_accepted_tokens and r.num_drafts <= r.num_steps
    assert one.num_accepted_tokens == 0
    # the second, identical request is drafted from the first one's response in the global tree
    assert twice.num_accepted_tokens > 0.5 * (len(output) - 1)
    assert twice.acceptance_rate > 0.9
    assert one.num_steps == len(output) - 1
    assert twice.num_steps - one.num_steps < (len(output) - 1) / 3  # the second request in few steps
    assert twice.profile().tokens_per_step == pytest.approx(twice.num_decode_tokens / twice.num_steps, rel=0.02)
    # without the global cache it is on its own again
    assert no_cache.num_accepted_tokens == 0
    acc = twice.acceptance()
    assert acc is not None and acc.mean_acceptance_length == pytest.approx(twice.mean_acceptance_length)


def test_draft_replay_counts_steps_as_the_engine_and_expects_what_max_tokens_cut_off() -> None:
    from spectune.predict import DraftGuesses, replay_draft

    # guess[n]: the draft's argmax after prompt + output[:n]; the last one looks past the output
    wrong_at_3 = (2, (10, 11, 12, 13, 14, 15), (10, 11, 12, 99, 14, 15, 77))
    all_right = (1, (20, 21, 22, 23, 24, 25, 26, 27), (20, 21, 22, 23, 24, 25, 26, 27, 5))
    one = replay_draft(DraftGuesses((wrong_at_3,)), 1)
    # n=1 draft [11] accepted -> n=3; [99] against 13 rejected -> n=4; [14] accepted -> n=6, the end
    assert (one.num_drafts, one.num_accepted_tokens, one.num_steps, one.num_truncated_drafts) == (3, 2, 3, 0)
    three = replay_draft(DraftGuesses((wrong_at_3, all_right)), 3)
    # first request: [11, 12, 99] two accepted -> n=4; [14, 15, 77] where the output ends after 15: cut
    # second: [21, 22, 23] and [25, 26, 27], all accepted
    assert (three.num_drafts, three.num_draft_tokens, three.num_accepted_tokens) == (4, 12, 10)
    assert three.accepted_per_pos == (4, 4, 2) and three.truncated_per_pos == (0, 0, 1)
    assert three.num_decode_tokens == 5 + 7 and three.num_steps == 4
    # the cut position counts with the acceptance of the third position in the drafts not cut: 2 of 3
    assert three.expected_per_pos == pytest.approx((4, 4, 2 + 2 / 3))
    assert three.mean_acceptance_length == 3.5  # the engine's counters lie between the two
    assert three.profile().mean_acceptance_length == pytest.approx(1 + (10 + 2 / 3) / 4)
    # the draft runs in transformers, not in the engine: its replay carries an interval, vLLM's own
    # n-gram code replayed does not
    from spectune.predict import DRAFT_REPLAY_SPREAD, replay_ngram

    assert three.spread == DRAFT_REPLAY_SPREAD > 0
    assert replay_ngram([request_sample([5, 6, 7], [5, 6, 7, 5, 6])], 2, 1, 3).spread == 0.0
    # near max_model_len the scheduler drafts only up to max_model_len - 1 tokens in all: with 2
    # prompt tokens and a limit of 6, n=1 drafts [11, 12] (both accepted) -> n=4 drafts nothing
    near = replay_draft(DraftGuesses((wrong_at_3,)), 3, max_model_len=6)
    assert (near.num_drafts, near.num_draft_tokens, near.num_accepted_tokens, near.num_steps) == (1, 2, 2, 3)
    with pytest.raises(ValueError, match="k must be >= 1"):
        replay_draft(DraftGuesses((wrong_at_3,)), 0)
