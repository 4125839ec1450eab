"""A space's candidates: Optuna parameters and back, enumeration, the proposers, the engine section."""

from __future__ import annotations

import warnings
from pathlib import Path

import optuna
import pytest
from optuna.trial import FixedTrial
from space_files import SHIPPED, space_of, write_space

from spectune.config import EngineArgs, Method, SpecConfig
from spectune.errors import ConfigError
from spectune.space import SearchSpace, load_space

ROUND_TRIP = {
    "methods": {
        "none": {},
        "ngram": {  # min is a choice list, max a stepped range: max gets the dynamic range
            "num_speculative_tokens": [1, 3],
            "prompt_lookup_min": [1, 3, 5],
            "prompt_lookup_max": {"low": 2, "high": 6, "step": 2},
        },
        "draft_model": {"models": ["${target}", "${draft}"], "num_speculative_tokens": {"low": 1, "high": 3},
                        "draft_tensor_parallel_size": 1},
        "suffix": {
            "num_speculative_tokens": 16,
            "suffix_decoding_max_spec_factor": {"low": 0.5, "high": 2.0, "step": 0.25},
            "suffix_decoding_min_token_prob": [0.05, 0.1],
            "suffix_decoding_max_tree_depth": {"low": 8, "high": 8},
        },
        "mtp": {"num_speculative_tokens": {"low": 1, "high": 2}},
    },
}


def round_trip_spaces() -> list[tuple[str, SearchSpace]]:
    spaces = [(name, load_space(name).resolve("org/target", draft="org/draft")) for name in SHIPPED]
    spaces.append(("hand-made", space_of(ROUND_TRIP).resolve("org/target", draft="org/draft")))
    return spaces


@pytest.mark.parametrize(("name", "space"), round_trip_spaces(), ids=lambda v: v if isinstance(v, str) else "")
def test_params_of_round_trips_through_suggest(name: str, space: SearchSpace) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a FixedTrial value outside its distribution warns
        for spec in space.enumerate():
            params = space.params_of(spec)
            trial = FixedTrial(params)
            assert space.suggest(trial) == spec
            assert trial.params == params  # exactly the parameters suggest draws, no more
            assert all(key == "method" or key.startswith(f"{spec.method.value}.") for key in params)


def test_enumerate_keeps_the_ngram_window_ordered_and_complete() -> None:
    space = space_of(ROUND_TRIP).resolve("org/target", draft="org/draft")
    ngram = [s for s in space.enumerate() if s.method is Method.NGRAM]
    pairs = {(s.prompt_lookup_min, s.prompt_lookup_max) for s in ngram}
    assert pairs == {(lo, hi) for lo in (1, 3, 5) for hi in (2, 4, 6) if lo <= hi}
    assert len(ngram) == 2 * len(pairs)
    suffix = [s for s in space.enumerate() if s.method is Method.SUFFIX]
    # a stepped float range gives low, its midpoint on the grid, high
    assert sorted({s.suffix_decoding_max_spec_factor for s in suffix}) == [0.5, 1.25, 2.0]
    assert {s.suffix_decoding_max_tree_depth for s in suffix} == {8}


def test_fixed_values_are_no_optuna_parameters() -> None:
    space = space_of(ROUND_TRIP).resolve("org/target", draft="org/draft")
    spec = SpecConfig(method=Method.SUFFIX, num_speculative_tokens=16, suffix_decoding_max_spec_factor=1.25,
                      suffix_decoding_min_token_prob=0.1, suffix_decoding_max_tree_depth=8)
    assert space.params_of(spec) == {"method": "suffix", "suffix.suffix_decoding_max_spec_factor": 1.25,
                                     "suffix.suffix_decoding_min_token_prob": 0.1}
    single = space_of({"methods": {"ngram": {"num_speculative_tokens": [2, 4]}}})
    assert single.params_of(SpecConfig(method=Method.NGRAM, num_speculative_tokens=4)) == {"ngram.num_speculative_tokens": 4}


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        (SpecConfig(method=Method.EAGLE, model="h", num_speculative_tokens=2), "method eagle is not in this space"),
        (SpecConfig(method=Method.NGRAM, num_speculative_tokens=2, prompt_lookup_min=1, prompt_lookup_max=2),
         "num_speculative_tokens=2 is not in methods.ngram"),
        (SpecConfig(method=Method.DRAFT_MODEL, model="other", num_speculative_tokens=2, draft_tensor_parallel_size=1),
         "model='other' is not in"),
        (SpecConfig(method=Method.DRAFT_MODEL, model="org/draft", num_speculative_tokens=2), "draft_tensor_parallel_size=None"),
        (SpecConfig(method=Method.MTP, num_speculative_tokens=1, model="m"), "model is set but methods.mtp has no model"),
    ],
)
def test_params_of_refuses_a_spec_outside_the_space(spec: SpecConfig, needle: str) -> None:
    space = space_of(ROUND_TRIP).resolve("org/target", draft="org/draft")
    with pytest.raises(ConfigError, match=None) as info:
        space.params_of(spec)
    assert needle in str(info.value)


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_a_real_study_over_the_ngram_space_only_draws_valid_candidates(sampler: str) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = load_space("ngram").for_platform("cpu").resolve("org/target")  # as a CPU engine searches it
    seen: list[SpecConfig] = []

    def objective(trial: optuna.Trial) -> float:
        spec = space.suggest(trial)
        seen.append(spec)
        if spec.method is Method.NGRAM:
            assert 1 <= spec.prompt_lookup_min <= spec.prompt_lookup_max <= 6
            assert spec.prompt_lookup_min <= 4
            assert 1 <= spec.num_speculative_tokens <= 8
        return float(spec.num_speculative_tokens or 0)

    if sampler == "random":
        chosen: optuna.samplers.BaseSampler = optuna.samplers.RandomSampler(seed=0)
    else:  # as spectune.study configures it: conditional parameters in groups
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            chosen = optuna.samplers.TPESampler(seed=0, n_startup_trials=4, multivariate=True, group=True)
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage(), sampler=chosen)
    baseline = SpecConfig()
    study.enqueue_trial(space.params_of(baseline))
    study.optimize(objective, n_trials=30)
    assert seen[0] == baseline
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    assert {s.method for s in seen} == {Method.NONE, Method.NGRAM}
    assert len({(s.prompt_lookup_min, s.prompt_lookup_max) for s in seen if s.method is Method.NGRAM}) > 3
    assert all(k == "method" or k.startswith("ngram.") for t in study.trials for k in t.params)


def test_proposers_lists_each_method_and_model_once() -> None:
    space = space_of(ROUND_TRIP).resolve("org/target", draft=["d1", "d2"])
    assert space.proposers() == [(Method.DRAFT_MODEL, "org/target"), (Method.DRAFT_MODEL, "d1"),
                                 (Method.DRAFT_MODEL, "d2")]
    pairs = {(s.method, s.model) for s in space.enumerate() if s.model}
    assert pairs == set(space.proposers())


def test_enumerate_refuses_a_huge_space() -> None:
    space = space_of({"methods": {"suffix": {"suffix_decoding_max_cached_requests": {"low": 0, "high": 200000}}}})
    with pytest.raises(ConfigError, match="more than 10000 candidates"):
        space.enumerate()
    small = space_of({"methods": {"suffix": {"suffix_decoding_max_cached_requests": {"low": 0, "high": 300}}}})
    with pytest.raises(ConfigError, match="more than 100 candidates"):
        small.enumerate(limit=100)
    assert len(small.enumerate(limit=None)) == 301


def test_engine_section_becomes_engine_args(tmp_path: Path) -> None:
    path = write_space(tmp_path, """\
        methods:
          none: {}
        engine:
          max_num_seqs: 32
          extra_args: {enable-prefix-caching: true}
    """)
    args = load_space(path).engine_args("org/target")
    assert isinstance(args, EngineArgs)
    assert args.model == "org/target"
    assert args.max_num_seqs == 32
    assert args.to_vllm_options() == {"max-num-seqs": 32, "enable-prefix-caching": True}
