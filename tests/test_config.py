"""Candidate and engine configuration: validation and translation to vLLM's form."""

from __future__ import annotations

import json

import pytest

from spectune._util import validate
from spectune.config import EngineArgs, Method, SpecConfig, parse_spec
from spectune.engines import build_command, resolve_engine_args
from spectune.engines._platform import Platform
from spectune.errors import ConfigError

CPU = Platform(name="cpu", serve_command=("py", "-m", "api", "--model"),
               engine_defaults={"enforce_eager": True, "kv_cache_memory_bytes": 1024})
GPU = Platform(name="gpu", serve_command=("vllm", "serve"))


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('{"method": "ngram", "model": "x", "num_speculative_tokens": 3}', "takes no model"),
        ('{"method": "draft_model", "num_speculative_tokens": 3}', "needs a model"),
        ('{"method": "ngram", "num_speculative_tokens": 0}', "num_speculative_tokens"),
        ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2}',
         "prompt_lookup_min (4) > prompt_lookup_max (2)"),
        ('{"method": "ngram"}', "needs num_speculative_tokens"),
        ('{"method": "ngram_gpu", "prompt_lookup_max": 3}', "needs num_speculative_tokens"),
        ('{"method": "telepathy", "num_speculative_tokens": 2}', "method"),
        ('{"method": "ngram", "num_speculative_tokens": 2, "k": 3}', "k: unknown key"),
        ('{"method": "suffix", "prompt_lookup_max": 3}', "applies to methods ngram and ngram_gpu only"),
        ('{"method": "ngram", "num_speculative_tokens": 2, "suffix_decoding_max_tree_depth": 8}',
         "applies to method suffix only"),
        ("[1, 2]", "expected a JSON object"),
        ("{not json", "not JSON"),
    ],
)
def test_impossible_candidates_are_refused_with_one_line(text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_spec(text)
    message = str(info.value)
    assert needle in message
    assert "\n" not in message
    assert message.startswith("--spec")


def test_model_without_method_is_a_draft_model_as_in_vllm() -> None:
    spec = parse_spec('{"model": "/m/draft", "num_speculative_tokens": 4}')
    assert spec.method is Method.DRAFT_MODEL
    assert spec.to_vllm() == {"method": "draft_model", "model": "/m/draft", "num_speculative_tokens": 4}


def test_none_is_the_baseline_and_has_no_vllm_config() -> None:
    assert parse_spec("none").is_baseline
    assert parse_spec("none").to_vllm() is None
    with pytest.raises(ConfigError, match="takes no other keys"):
        validate(SpecConfig, {"method": "none", "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="takes no other keys"):
        SpecConfig(method=Method.NONE, num_speculative_tokens=2)


def test_vllm_mapping_keeps_only_set_keys() -> None:
    spec = SpecConfig(method=Method.NGRAM, num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=4)
    assert spec.to_vllm() == {"method": "ngram", "num_speculative_tokens": 3,
                              "prompt_lookup_min": 1, "prompt_lookup_max": 4}
    assert spec.label() == "ngram k=3 lookup=1..4"


def test_platform_defaults_fill_only_what_the_user_left_unset() -> None:
    args = EngineArgs(model="m", enforce_eager=False)
    cpu = resolve_engine_args(args, CPU)
    assert cpu.enforce_eager is False  # the user's choice wins
    assert cpu.kv_cache_memory_bytes == 1024
    gpu = resolve_engine_args(args, GPU)
    assert gpu.kv_cache_memory_bytes is None  # no CPU setting leaks into a GPU run


def test_command_line_for_gpu_and_cpu_entry_points() -> None:
    args = EngineArgs(model="org/target", dtype="float16", tensor_parallel_size=2,
                      extra_args={"enable_prefix_caching": True, "max-num-batched-tokens": 4096})
    spec = SpecConfig(method=Method.DRAFT_MODEL, model="org/draft", num_speculative_tokens=4)
    gpu = build_command(resolve_engine_args(args, GPU), spec, 8123, GPU)
    assert gpu[:3] == ["vllm", "serve", "org/target"]
    assert gpu[gpu.index("--tensor-parallel-size") + 1] == "2"
    assert "--enable-prefix-caching" in gpu
    assert gpu[gpu.index("--max-num-batched-tokens") + 1] == "4096"
    assert json.loads(gpu[gpu.index("--speculative-config") + 1])["model"] == "org/draft"
    assert gpu[gpu.index("--host") + 1] == "127.0.0.1"
    cpu = build_command(resolve_engine_args(args, CPU), SpecConfig(), 8123, CPU)
    assert cpu[:5] == ["py", "-m", "api", "--model", "org/target"]
    assert "--enforce-eager" in cpu and "--speculative-config" not in cpu
    false_flag = build_command(EngineArgs(model="m", enforce_eager=False), SpecConfig(), 1, GPU)
    assert "--no-enforce-eager" in false_flag


def test_engine_args_refuse_what_spectune_sets_itself() -> None:
    with pytest.raises(ValueError, match="set by spectune"):
        EngineArgs(model="m", extra_args={"speculative_config": "{}"})
    with pytest.raises(ValueError, match="unknown key|Extra inputs"):
        EngineArgs.model_validate({"model": "m", "gpu_util": 0.9})


@pytest.mark.parametrize(("flags", "dtype"), [({"avx2", "avx512f", "avx512_bf16"}, "bfloat16"),
                                              ({"avx2", "amx_tile", "amx_bf16"}, "bfloat16"),
                                              ({"avx2", "avx512f"}, "float32"), ({"avx2"}, "float32"), (set(), "float32")])
def test_a_cpu_engine_runs_bfloat16_only_where_the_processor_computes_it_natively(flags: set[str], dtype: str) -> None:
    from spectune.engines import cpu_dtype

    chosen, why = cpu_dtype(frozenset(flags))
    assert chosen == dtype and why.startswith(f"{dtype}: ")
    assert ("natively" in why) == (dtype == "bfloat16")


def test_the_platform_defaults_applied_are_recorded_with_why_and_the_users_choice_wins() -> None:
    from spectune.engines import applied_defaults

    cpu = Platform(name="cpu", serve_command=("py",), engine_defaults={"dtype": "float32", "enforce_eager": True},
                   default_reasons={"dtype": "float32: no native bfloat16 here"})
    assert applied_defaults(EngineArgs(model="m"), cpu) == {"dtype": "float32: no native bfloat16 here",
                                                           "enforce_eager": "True: the cpu build's default"}
    assert applied_defaults(EngineArgs(model="m", dtype="bfloat16"), cpu) == {"enforce_eager": "True: the cpu build's default"}
    assert resolve_engine_args(EngineArgs(model="m", dtype="bfloat16"), cpu).dtype == "bfloat16"
    assert applied_defaults(EngineArgs(model="m"), GPU) == {}
