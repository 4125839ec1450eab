"""Spaces of the methods and fields the installed vLLM takes beyond those spectune knows:
methods such as dflash and ngram_gpu, fields such as parallel_drafting, tuned like the others."""

from __future__ import annotations

import logging

import pytest
from optuna.trial import FixedTrial
from space_files import space_of

from spectune._speculative import installed_schema
from spectune.config import Method, SpecConfig
from spectune.errors import ConfigError
from spectune.space import SearchSpace

pytestmark = pytest.mark.skipif(installed_schema() is None, reason="no vLLM installed")

SPACE = {"methods": {
    "none": {},
    "dflash": {"models": ["${draft}"], "num_speculative_tokens": [4, 8], "parallel_drafting": [True, False]},
    "ngram_gpu": {"num_speculative_tokens": 3, "prompt_lookup_max": [2, 3], "prompt_lookup_min": 1},
    "eagle3": {"models": ["${draft}"], "num_speculative_tokens": 2, "rejection_sample_method": "block"},
}}


def test_the_engines_methods_and_fields_are_candidates_like_the_others() -> None:
    space = space_of(SPACE).resolve("org/target", draft="org/head")
    candidates = space.enumerate()
    assert [c.to_vllm() for c in candidates[1:5]] == [
        {"method": "dflash", "model": "org/head", "num_speculative_tokens": k, "parallel_drafting": p}
        for k in (4, 8) for p in (True, False)]
    assert {c.method for c in candidates} == {Method.NONE, Method("dflash"), Method("ngram_gpu"), Method.EAGLE3}
    assert candidates[-1].to_vllm() == {"method": "eagle3", "model": "org/head", "num_speculative_tokens": 2,
                                        "rejection_sample_method": "block"}
    for spec in candidates:  # each one's Optuna parameters draw it again
        params = space.params_of(spec)
        assert space.suggest(FixedTrial(params)) == spec
    assert space.params_of(candidates[2]) == {"method": "dflash", "dflash.num_speculative_tokens": 4,
                                              "dflash.parallel_drafting": False}
    assert space.engine_fields(Method("dflash")) == ["parallel_drafting"]
    again = SearchSpace.model_validate(space.model_dump(mode="json", exclude_unset=True))
    assert again.enumerate() == candidates


def test_a_candidate_outside_the_engine_fields_domain_is_not_in_the_space() -> None:
    space = space_of(SPACE).resolve("org/target", draft="org/head")
    spec = SpecConfig(method="eagle3", model="org/head", num_speculative_tokens=2, rejection_sample_method="standard")
    with pytest.raises(ConfigError, match=r"rejection_sample_method='standard' is not in methods.eagle3"):
        space.params_of(spec)
    bare = SpecConfig(method="eagle3", model="org/head", num_speculative_tokens=2)
    with pytest.raises(ConfigError, match="rejection_sample_method=None is not in methods.eagle3"):
        space.params_of(bare)


def test_an_engine_method_whose_models_need_a_draft_is_left_out_without_one(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="spectune.space"):
        space = space_of(SPACE).resolve("org/target")
    assert list(space.methods) == [Method.NONE, Method("ngram_gpu")]
    assert "method dflash left out" in caplog.text


@pytest.mark.parametrize(("methods", "needle"), [
    ({"dflsh": {}}, "test: methods: unknown method 'dflsh': vLLM "),
    ({"dflash": {"models": ["m"], "bogus": 1}},
     "test: methods.dflash.bogus: unknown key (vLLM "),
    ({"dflash": {"models": ["m"], "parallel_drafting": ["yes please"]}},
     "test: methods.dflash.parallel_drafting: 'yes please' is refused by vLLM "),
    ({"dflash": {"models": ["m"], "parallel_drafting": {"low": 0, "high": 1}}},
     "test: methods.dflash.parallel_drafting: takes a list of choices, not a range"),
    ({"none": {"parallel_drafting": True}}, "test: methods.none.parallel_drafting: does not apply to method none"),
    ({"dflash": {"model": "m"}}, "test: methods.dflash.model: give the checkpoints to try as models: [...]"),
    ({"dflash": {"models": ["m"], "draft_model_config": {"x": 1}}}, "methods.dflash.draft_model_config: unknown key"),
    ({"dflash": {"models": ["m"], "suffix_decoding_max_tree_depth": 8}},
     "methods.dflash.suffix_decoding_max_tree_depth: does not apply to method dflash"),
])
def test_what_the_engine_does_not_take_is_one_line_naming_the_key(methods: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        space_of({"methods": {"none": {}, **methods}})
    assert needle in str(info.value) and "\n" not in str(info.value)
