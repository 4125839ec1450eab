"""Workload features: how much outputs repeat their prompts and themselves, lengths, token ids."""

from __future__ import annotations

import pytest

from spectune.config import Prompt, WorkloadSpec
from spectune.errors import ConfigError
from spectune.workloads import (
    compute_features,
    load_prompts,
)

PROMPT = "the quick brown fox jumps over the lazy dog while a cat sleeps in the sun"


def test_features_copied_output_repeats_fully() -> None:
    f = compute_features([PROMPT], [PROMPT])
    assert f.output_in_prompt_words is not None and f.output_in_context_words is not None
    for n in (1, 2, 3, 4):
        assert f.output_in_prompt_words.get(n) == 1.0
        assert f.output_in_context_words.get(n) == 1.0


def test_features_disjoint_output_repeats_nothing() -> None:
    f = compute_features([PROMPT], ["alpha beta gamma delta epsilon zeta"])
    assert f.output_in_prompt_words is not None
    assert [f.output_in_prompt_words.get(n) for n in (1, 2, 3, 4)] == [0.0, 0.0, 0.0, 0.0]


def test_features_repetition_grows_with_the_copied_share() -> None:
    words = PROMPT.split()
    fresh = [f"new{i}" for i in range(len(words))]
    shares = []
    for k in range(0, len(words) + 1, 4):
        output = " ".join(words[:k] + fresh[k:])
        f = compute_features([PROMPT], [output])
        assert f.output_in_prompt_words is not None
        shares.append([f.output_in_prompt_words.get(n) for n in (1, 2, 3, 4)])
    for n in range(4):
        col = [s[n] for s in shares]
        assert col == sorted(col), col
        assert col[0] == 0.0 and col[-1] == 1.0
    # longer n-grams are never matched more often than shorter ones
    assert all(s[0] >= s[1] >= s[2] >= s[3] for s in shares)


def test_features_self_repetition_and_context() -> None:
    f = compute_features(["a b a b", "x y z"])
    rep = f.prompt_self_repetition_words
    # "a b a b": unigrams a,b,a,b -> 2 of 4 seen before; "x y z" -> 0 of 3
    assert rep.n1 == pytest.approx(2 / 7)
    assert rep.n2 == pytest.approx(1 / 5)  # (a b),(b a),(a b) + (x y),(y z)
    assert rep.n3 == 0.0 and rep.n4 == 0.0
    assert compute_features(["a b"]).prompt_self_repetition_words.n3 is None  # too short for 3-grams
    assert f.output_in_prompt_words is None and f.num_outputs == 0
    # an output repeating itself is found in the context, not in the prompt
    g = compute_features(["p q r"], ["s t s t s t"])
    assert g.output_in_prompt_words is not None and g.output_in_context_words is not None
    assert g.output_in_prompt_words.n1 == 0.0
    assert g.output_in_context_words.n1 == pytest.approx(4 / 6)


def test_features_token_ids() -> None:
    f = compute_features(
        ["one two", "three"], ["x", "y"],
        prompt_token_ids=[[1, 2, 3, 4], [5, 6]], output_token_ids=[[1, 2, 3], [7, 8, 9]],
    )
    assert f.prompt_tokens is not None and f.prompt_tokens.mean == 3.0
    assert f.output_tokens is not None and f.output_tokens.max == 3.0
    assert f.output_in_prompt_tokens is not None
    assert f.output_in_prompt_tokens.n1 == pytest.approx(3 / 6)
    assert f.output_in_prompt_tokens.n3 == pytest.approx(1 / 2)
    assert f.output_in_prompt_tokens.n4 is None
    # output ids alone give lengths but no copy share
    h = compute_features(["a"], output_token_ids=[[1, 2]])
    assert h.output_tokens is not None and h.output_in_prompt_tokens is None and h.num_outputs == 1


def test_features_length_distribution_and_chat_prompts() -> None:
    import numpy as np

    texts = ["w " * k for k in (1, 2, 3, 10, 50)]
    f = compute_features([*texts[:-1], Prompt(id="c", messages=[{"role": "user", "content": texts[-1]}])])
    lengths = [1, 2, 3, 10, 50]
    assert f.prompt_words.mean == pytest.approx(np.mean(lengths))
    assert f.prompt_words.p50 == pytest.approx(np.percentile(lengths, 50))
    assert f.prompt_words.p90 == pytest.approx(np.percentile(lengths, 90))
    assert f.prompt_chars.max == 100 and f.prompt_words.min == 1
    flat = f.flat()
    assert flat["prompt_words.p50"] == 3.0 and "output_words.mean" not in flat


def test_features_reject_mismatched_inputs() -> None:
    with pytest.raises(ConfigError, match="no prompts"):
        compute_features([])
    with pytest.raises(ConfigError, match="outputs: 1 given for 2 prompts"):
        compute_features(["a", "b"], ["x"])
    with pytest.raises(ConfigError, match="prompt_token_ids"):
        compute_features(["a"], prompt_token_ids=[[1], [2]])


def test_features_of_a_shipped_set() -> None:
    ps = load_prompts(WorkloadSpec(source="humaneval", num_prompts=20))
    f = compute_features(ps, [p.as_text() for p in ps])  # outputs copying their prompts
    assert f.num_prompts == 20 and f.output_in_prompt_words is not None
    assert f.output_in_prompt_words.n4 == 1.0
    assert 0.0 < (f.prompt_self_repetition_words.n1 or 0.0) < 1.0
