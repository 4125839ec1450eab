"""Engine knobs in a space: the ``engine:`` entries tuned beside speculation, as Optuna parameters."""

from __future__ import annotations

import pytest
from optuna.trial import FixedTrial
from space_files import space_of

from spectune.config import SpecConfig, candidate_label
from spectune.errors import ConfigError
from spectune.measurement import candidate_key, spec_key

KNOBS = {
    "methods": {"none": {}, "ngram": {"num_speculative_tokens": [2, 4], "prompt_lookup_max": 3}},
    "engine": {"max_num_seqs": [8, 32], "enable_prefix_caching": [True, False], "dtype": "float32",
               "max_num_batched_tokens": {"low": 2048, "high": 4096, "step": 2048}, "max_model_len": 512},
}


def test_lists_and_ranges_of_engine_arguments_are_tuned_and_single_values_stay_fixed() -> None:
    space = space_of(KNOBS).resolve("org/target")
    assert list(space.knobs) == ["max_num_seqs", "enable_prefix_caching", "max_num_batched_tokens"]
    assert space.engine_args("org/target").dtype == "float32" and space.engine_args("org/target").max_model_len == 512
    assert space.default_knobs() == {"max_num_seqs": 8, "enable_prefix_caching": True, "max_num_batched_tokens": 2048}
    pairs = space.enumerate_candidates()
    assert len(pairs) == 3 * 2 * 2 * 2 and pairs[0] == (SpecConfig(), space.default_knobs())
    assert len({candidate_key(s.to_vllm(), k) for s, k in pairs}) == len(pairs)  # each pair its own candidate
    one = space_of({**KNOBS, "engine": {"max_num_seqs": [16]}}).resolve("org/target")
    assert one.knobs == {} and one.engine_args("t").max_num_seqs == 16  # a list of one: fixed


def test_knob_values_go_to_optuna_and_come_back() -> None:
    space = space_of(KNOBS).resolve("org/target")
    spec = SpecConfig(method="ngram", num_speculative_tokens=4, prompt_lookup_max=3)
    knobs = {"max_num_seqs": 32, "enable_prefix_caching": False, "max_num_batched_tokens": 4096}
    params = {**space.params_of(spec), **space.engine_params_of(knobs)}
    assert params["engine.max_num_seqs"] == 32 and space.spec_params(params) == space.params_of(spec)
    trial = FixedTrial(params)
    assert space.suggest(trial) == spec and space.suggest_engine(trial) == knobs
    assert candidate_label(spec, knobs) == ("ngram k=4 lookup=?..3, max_num_seqs=32, enable_prefix_caching=False, "
                                            "max_num_batched_tokens=4096")
    assert candidate_key(spec.to_vllm(), {}) == spec_key(spec.to_vllm())  # no knobs: the key it always had
    with pytest.raises(ConfigError, match=r"engine.max_num_seqs=12 is not in this space"):
        space.engine_params_of({"max_num_seqs": 12})
    with pytest.raises(ConfigError, match=r"engine.block_size=16 is not in this space"):
        space.engine_params_of({"block_size": 16})


@pytest.mark.parametrize(("engine", "message"), [
    ({"max_num_seqs": [0, 8]}, r"engine.max_num_seqs: 0: input should be greater than or equal to 1"),
    ({"dtype": {"low": 1, "high": 2}}, r"engine.dtype: takes a list of choices, not a range"),
    ({"enable_prefix_caching": ["yes", "no"]}, r"engine.enable_prefix_caching: 'yes': input should be a valid boolean"),
    ({"max_model_len": [512, 1024]}, r"engine.max_model_len: spectune does not tune it \(it tunes max_num_seqs, "),
    ({"gpu_memory_utilization": [0.5, 1.2]}, r"engine.gpu_memory_utilization: 1.2: input should be less than"),
])
def test_an_impossible_knob_is_one_line_naming_it(engine: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        space_of({"methods": {"none": {}}, "engine": engine})
    assert "\n" not in str(info.value)
