"""The installed vLLM's SpeculativeConfig, read from its source: which methods and fields a
candidate may use, and spectune's own list where no vLLM is installed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from spectune import _speculative, config
from spectune._speculative import installed_schema, read_schema
from spectune._util import validate
from spectune.config import RECORDED, Method, SpecConfig, parse_spec
from spectune.errors import ConfigError

needs_vllm = pytest.mark.skipif(installed_schema() is None, reason="no vLLM installed")

SOURCE = '''
from typing import Literal
from pydantic import Field, SkipValidation

MTPTypes = Literal["mtp", "deepseek_mtp"]
Eagle = Literal["eagle", "eagle3", MTPTypes]
Method = Literal["ngram", "draft_model", Eagle]
Sampling = Literal["greedy", "probabilistic"]

@config
class SpeculativeConfig:
    num_speculative_tokens: int = Field(default=None, gt=0)
    model: str | None = None
    method: Method | None = None
    draft_tensor_parallel_size: int | None = Field(default=None, ge=1)
    quantization: me_quant.QuantizationMethods | str | None = None
    parallel_drafting: bool = False
    schedule: list[tuple[int, int, int]] | None = None
    draft_sample_method: Sampling = "greedy"
    target_model_config: SkipValidation[ModelConfig] = None
    _private: int = 0

    def compute_hash(self) -> str:
        local: int = 3
'''


@pytest.fixture
def schema(tmp_path: Path) -> Any:
    path = tmp_path / "speculative.py"
    path.write_text(SOURCE)
    return read_schema(path, "9.9.9")


def test_methods_are_the_literal_that_annotates_method_through_its_aliases(schema: Any) -> None:
    assert schema.methods == {"ngram", "draft_model", "eagle", "eagle3", "mtp", "deepseek_mtp"}
    assert schema.name == "vLLM 9.9.9"


def test_fields_are_what_a_user_may_set_each_checked_against_its_annotation(schema: Any) -> None:
    assert set(schema.fields) == {"num_speculative_tokens", "model", "method", "draft_tensor_parallel_size",
                                  "quantization", "parallel_drafting", "schedule", "draft_sample_method"}
    refused = [
        ("num_speculative_tokens", 0, "greater than 0"),
        ("draft_tensor_parallel_size", 0, "greater than or equal to 1"),
        ("parallel_drafting", "often", "valid boolean"),
        ("draft_sample_method", "best", "'greedy' or 'probabilistic'"),
        ("schedule", [[1, 2]], "field required"),
        ("model", 3, "valid string"),
    ]
    for name, value, needle in refused:
        why = schema.value_error(name, value)
        assert why is not None and why.startswith(f"{value!r} is refused by vLLM 9.9.9: ") and needle in why, why
    for name, value in [("num_speculative_tokens", 4), ("parallel_drafting", True), ("schedule", [[1, 8, 4]]),
                        ("quantization", "anything vLLM names"), ("draft_sample_method", "probabilistic")]:
        assert schema.value_error(name, value) is None


def test_a_source_without_the_class_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "speculative.py"
    path.write_text("class Other:\n    x: int = 0\n")
    with pytest.raises(ValueError, match="no class SpeculativeConfig"):
        read_schema(path, None)


@needs_vllm
def test_the_installed_vllm_takes_its_newer_methods_and_fields() -> None:
    schema = installed_schema()
    assert schema is not None
    assert {"dflash", "dspark", "ngram_gpu", "eagle3", "mlp_speculator", "suffix", "mtp"} <= schema.methods
    assert {"parallel_drafting", "draft_tensor_parallel_size", "suffix_decoding_max_tree_depth",
            "suffix_decoding_max_cached_requests", "suffix_decoding_max_spec_factor",
            "suffix_decoding_min_token_prob", "rejection_sample_method"} <= set(schema.fields)
    assert not {"target_model_config", "draft_model_config", "draft_parallel_config"} & set(schema.fields)
    for text in ['{"method": "dflash", "model": "z-lab/dflash", "num_speculative_tokens": 8, "parallel_drafting": true}',
                 '{"method": "dspark", "model": "d", "draft_tensor_parallel_size": 1}',
                 '{"method": "ngram_gpu", "num_speculative_tokens": 3, "prompt_lookup_max": 4}',
                 '{"method": "suffix", "suffix_decoding_max_tree_depth": 16, "suffix_decoding_min_token_prob": 0.2}']:
        spec = parse_spec(text)
        assert spec.to_vllm() == json.loads(text)
    assert parse_spec('{"method": "ngram_gpu", "num_speculative_tokens": 3}').method.drafts_from_text


@needs_vllm
def test_the_installed_vllm_is_read_without_importing_it() -> None:
    code = ("import sys\nfrom spectune.config import parse_spec\n"
            "parse_spec('{\"method\": \"dflash\", \"model\": \"m\", \"parallel_drafting\": true}')\n"
            "assert 'vllm' not in sys.modules, 'vllm was imported'\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@needs_vllm
@pytest.mark.parametrize(("text", "needle"), [
    ('{"method": "dflsh", "model": "m"}', "unknown method 'dflsh': vLLM "),
    ('{"method": "dflsh", "model": "m"}', "(did you mean dflash?)"),
    ('{"method": "telepathy"}', "_mtp variants)"),
    ('{"method": "dflash", "model": "m", "draft_model_config": {}}', "draft_model_config: unknown key (vLLM "),
    ('{"method": "dflash", "model": "m", "parallel_drafting": "often"}', "parallel_drafting: 'often' is refused by vLLM"),
    ('{"method": "eagle3", "model": "m", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 0}',
     "draft_tensor_parallel_size"),
])
def test_what_the_installed_vllm_does_not_take_is_refused_in_one_line(text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_spec(text)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_without_vllm_spectunes_own_methods_and_fields_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config, "installed_schema", lambda: None)
    spec = parse_spec('{"method": "eagle3", "model": "m", "num_speculative_tokens": 3, "draft_tensor_parallel_size": 1}')
    assert spec.method is Method.EAGLE3
    parse_spec('{"method": "suffix", "suffix_decoding_max_tree_depth": 16}')
    with pytest.raises(ConfigError, match=r"unknown method 'dflash': spectune \(no vLLM is installed here\)"):
        parse_spec('{"method": "dflash", "model": "m"}')
    with pytest.raises(ConfigError, match=r"--spec: parallel_drafting: unknown key \(spectune knows no such field"):
        parse_spec('{"method": "eagle3", "model": "m", "num_speculative_tokens": 3, "parallel_drafting": true}')


def test_a_configuration_read_back_from_storage_is_not_checked_against_the_vllm_here(
        monkeypatch: pytest.MonkeyPatch) -> None:
    data = {"method": "from_a_later_vllm", "model": "m", "a_later_field": 3}
    with pytest.raises(ConfigError, match="unknown method 'from_a_later_vllm'"):
        validate(SpecConfig, data)
    spec = SpecConfig.model_validate(data, context=RECORDED)
    assert spec.to_vllm() == data and spec.extra_fields == {"a_later_field": 3}
    assert spec.method is Method("from_a_later_vllm") and not spec.method.is_known
    monkeypatch.setattr(config, "installed_schema", lambda: None)
    assert SpecConfig.model_validate(data, context=RECORDED) == spec


def test_methods_spectune_knows_nothing_special_about_are_members_made_on_demand() -> None:
    assert Method("dflash") is Method("dflash")
    assert Method("dflash") not in list(Method) and Method.EAGLE3.is_known and not Method("dflash").is_known
    assert str(Method("dflash")) == "dflash" and Method("dflash") == "dflash"
    with pytest.raises(ValueError):
        Method("two words")


def test_the_schema_is_read_once_per_process() -> None:
    assert _speculative.installed_schema() is _speculative.installed_schema()
    if (schema := installed_schema()) is not None:
        assert schema.source.name == "speculative.py" and schema.source.parent.name == "config"
        assert textwrap.dedent(schema.source.read_text()).count("class SpeculativeConfig") == 1
