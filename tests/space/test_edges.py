"""The edges of a space: which ranges guided search may widen past an edge its pick sits on, by
how much, within which bounds, and the one-line error a bad ``hard``/``bounds`` gives."""

from __future__ import annotations

from pathlib import Path

import pytest
from space_files import one_line_error, space_of, write_space

from spectune.config import SpecConfig
from spectune.errors import ConfigError
from spectune.space import IntDomain, load_space

K = "num_speculative_tokens"


def ngram(k: int, hi: int, lo: int = 1) -> SpecConfig:
    return SpecConfig(method="ngram", num_speculative_tokens=k, prompt_lookup_max=hi, prompt_lookup_min=lo)


def test_a_range_grows_by_its_own_width_up_to_four_times_its_high_or_the_fields_limit() -> None:
    d = IntDomain.model_validate({"low": 1, "high": 6})
    grown = []
    while (d := d.widened(K, "high")) is not None:
        grown.append((d.low, d.high))
    assert grown == [(1, 12), (1, 24)]  # four times 6 at most
    big = IntDomain.model_validate({"low": 20, "high": 40}).widened(K, "high")
    assert big is not None and big.high == 61 and big.widened(K, "high") is not None
    assert big.widened(K, "high").high == 64  # vLLM's SpecConfig limit: k <= 64  # type: ignore[union-attr]
    stepped = IntDomain.model_validate({"low": 2, "high": 6, "step": 2, "bounds": [2, 16]})
    first = stepped.widened(K, "high")
    assert first is not None and (first.high, first.bounds) == (12, (2, 16))
    assert first.values() == [2, 4, 6, 8, 10, 12]
    assert first.widened(K, "high").high == 16  # type: ignore[union-attr]
    low = IntDomain.model_validate({"low": 3, "high": 5}).widened("prompt_lookup_max", "low")
    assert low is not None and (low.low, low.high) == (1, 5)  # down to the field's own lower limit
    assert IntDomain.model_validate({"low": 1, "high": 5}).widened("prompt_lookup_max", "low") is None
    for fixed in ({"low": 4, "high": 4}, [1, 2, 3], {"low": 1, "high": 6, "hard": True}):
        assert IntDomain.model_validate(fixed).widened(K, "high") is None


def test_edges_are_those_of_tuned_ranges_that_can_grow() -> None:
    space = load_space("default").resolve("org/model")
    assert space.edges(ngram(6, 5)) == [(f"ngram.{K}", "high"), ("ngram.prompt_lookup_max", "high")]
    assert space.edges(ngram(3, 2, 2)) == [("ngram.prompt_lookup_max", "low"), ("ngram.prompt_lookup_min", "high")]
    assert space.edges(ngram(3, 4)) == []
    assert space.edges(SpecConfig(method="suffix", num_speculative_tokens=32)) == []  # a list is kept as given
    hard = space_of({"methods": {"none": {}, "ngram": {K: {"low": 1, "high": 6, "hard": True},
                                                      "prompt_lookup_max": 4, "prompt_lookup_min": 1}}})
    assert hard.edges(ngram(6, 4)) == [] and hard.widened(f"ngram.{K}", "high") is None
    # the n-gram window keeps min <= max: a wider range that adds no candidate is no edge
    mins = space_of({"methods": {"none": {}, "ngram": {K: 2, "prompt_lookup_min": {"low": 1, "high": 3},
                                                      "prompt_lookup_max": 3}}})
    assert mins.edges(ngram(2, 3, 3)) == []
    maxs = space_of({"methods": {"none": {}, "ngram": {K: 2, "prompt_lookup_min": 3,
                                                      "prompt_lookup_max": {"low": 3, "high": 6}}}})
    assert maxs.edges(ngram(2, 3, 3)) == [] and maxs.edges(ngram(2, 6, 3)) == [("ngram.prompt_lookup_max", "high")]


def test_a_widened_space_holds_the_values_past_the_edge_and_is_stored_and_applied_again() -> None:
    space = load_space("ngram").for_platform("cpu").resolve("org/model")  # n-gram lookup alone
    wider = space.widened(f"ngram.{K}", "high")
    assert wider is not None
    with pytest.raises(ConfigError, match="is not in methods.ngram"):
        space.params_of(ngram(12, 4))
    assert wider.params_of(ngram(12, 4))[f"ngram.{K}"] == 12
    assert wider.holds(ngram(12, 4)) and not space.holds(ngram(12, 4)) and space.holds(ngram(8, 4))
    assert len(wider.enumerate()) == 2 * len(space.enumerate()) - 1  # k 1..16 against 1..8, and the baseline
    widening = {"param": f"ngram.{K}", "was": space.domain(f"ngram.{K}").model_dump(mode="json"),  # type: ignore[union-attr]
                "range": wider.domain(f"ngram.{K}").model_dump(mode="json")}  # type: ignore[union-attr]
    again = space.extended([widening])
    assert again.enumerate() == wider.enumerate()
    assert again.domain(f"ngram.{K}").bounds == (1, 32)  # type: ignore[union-attr]  # the first range's limits
    assert space.extended([{**widening, "param": "suffix.num_speculative_tokens"}]) == space  # no such method here
    # a range given otherwise since the widening (the space edited, made hard) keeps what it is now
    edited = space.with_domain(f"ngram.{K}", IntDomain.model_validate({"low": 1, "high": 8, "hard": True}))
    assert edited.extended([widening]) == edited


def test_hard_and_bounds_are_read_from_a_space_file_and_kept_in_its_dump(tmp_path: Path) -> None:
    path = write_space(tmp_path, """\
        methods:
          none: {}
          ngram:
            num_speculative_tokens: {low: 1, high: 4, bounds: [1, 10]}
            prompt_lookup_max: {low: 2, high: 5, hard: true}
            prompt_lookup_min: 1
        """)
    space = load_space(path).resolve("org/model")
    dumped = space.model_dump(mode="json", exclude_unset=True)["methods"]["ngram"]
    assert dumped[K] == {"low": 1, "high": 4, "bounds": [1, 10]}
    assert dumped["prompt_lookup_max"] == {"low": 2, "high": 5, "hard": True}
    assert space.edges(ngram(4, 5)) == [(f"ngram.{K}", "high")]
    wider = space.widened(f"ngram.{K}", "high")
    assert wider is not None and wider.domain(f"ngram.{K}").high == 8  # type: ignore[union-attr]
    assert wider.widened(f"ngram.{K}", "high").domain(f"ngram.{K}").high == 10  # type: ignore[union-attr]


@pytest.mark.parametrize(("domain", "error"), [
    ("[1, 2, 3]", None),
    ("{choices: [1, 2], hard: true}", "hard and bounds apply to a range {low, high}: a list of choices is kept as given"),
    ("{low: 1, high: 6, hard: true, bounds: [1, 8]}", "give hard or bounds, not both"),
    ("{low: 1, high: 6, bounds: [2, 8]}", "bounds [2, 8] must hold the range 1..6"),
    ("{low: 1, high: 6, bounds: [1]}", "bounds must be [low, high], two integers, got [1]"),
    ("{low: 1, high: 6, bounds: 8}", "bounds must be [low, high], two integers, got 8"),
    ("{low: 1, high: 6, bounds: [1, 100]}", "100 is out of range: input should be less than or equal to 64"),
    ("{low: 1, high: 6, bounds: [0, 8]}", "0 is out of range: input should be greater than or equal to 1"),
    ("{low: 1, high: 6, hard: 1}", "hard"),
])
def test_bad_hard_or_bounds_is_one_line_naming_the_key(tmp_path: Path, domain: str, error: str | None) -> None:
    path = write_space(tmp_path, f"methods:\n  none: {{}}\n  ngram:\n    {K}: {domain}\n    prompt_lookup_max: 4\n")
    if error is None:
        assert load_space(path).edges(ngram(3, 4)) == []
        return
    message = one_line_error(path)
    assert error in message and f"ngram.{K}" in message, message


def test_hard_and_bounds_only_where_guided_search_widens(tmp_path: Path) -> None:
    path = write_space(tmp_path, "methods:\n  none: {}\n  suffix:\n    num_speculative_tokens: 8\n"
                                 "    suffix_decoding_max_cached_requests: {low: 1, high: 9, hard: true}\n")
    assert "hard and bounds apply to the ranges guided search may widen" in one_line_error(path)
    path = write_space(tmp_path, "methods:\n  none: {}\nengine:\n  max_num_seqs: {low: 8, high: 64, bounds: [8, 128]}\n")
    assert "engine.max_num_seqs: hard and bounds apply to speculative parameters" in one_line_error(path)
