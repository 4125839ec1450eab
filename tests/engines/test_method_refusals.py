"""Methods the engine here cannot run are refused before it starts, with one line saying why."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from spectune._speculative import SpeculativeSchema, installed_schema
from spectune.config import EngineArgs, Prompt, SpecConfig, WorkloadSpec, parse_spec
from spectune.engines import ARCTIC_ENV, Platform, _platform, check_runnable, method_refusal
from spectune.errors import ConfigError
from spectune.trial import measure

CPU = Platform(name="cpu", serve_command=("py", "-m", "api", "--model"))
GPU = Platform(name="gpu", serve_command=("vllm", "serve"))
VLLM = SpeculativeSchema(version="0.32.0+cpu", source=Path("speculative.py"),
                         methods=frozenset({"ngram", "eagle3", "mlp_speculator", "suffix"}),
                         fields={"num_speculative_tokens": int, "enable_suffix_decoding": bool})
ARCTIC = dataclasses.replace(VLLM, plugin="arctic_inference", plugin_methods=frozenset({"arctic"}),
                             plugin_fields=frozenset({"enable_suffix_decoding"}), plugin_pin="0.32.0")

needs_vllm = pytest.mark.skipif(installed_schema() is None, reason="no vLLM installed")


@pytest.fixture
def schema(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """Install a schema in place of the installed vLLM's; no Arctic variable from this process."""
    monkeypatch.delenv(ARCTIC_ENV, raising=False)
    monkeypatch.delenv("ARCTIC_INFERENCE_SKIP_PLATFORM_CHECK", raising=False)
    monkeypatch.delenv("ARCTIC_INFERENCE_SKIP_VERSION_CHECK", raising=False)

    def use(s: SpeculativeSchema | None) -> None:
        monkeypatch.setattr(_platform, "installed_schema", lambda: s)

    return use


def test_mlp_speculator_is_refused_on_vllms_own_v1_engine_with_the_reason(schema) -> None:  # noqa: ANN001
    schema(VLLM)
    why = method_refusal("mlp_speculator", platform=GPU)
    assert why is not None and "\n" not in why
    assert why.startswith("method mlp_speculator: vLLM 0.32.0+cpu's V1 engine has no MLP-speculator proposer")
    assert "'Unknown speculative decoding method'" in why and "Arctic Inference's vLLM plugin" in why
    for method in ("ngram", "eagle3", "suffix", "dflash"):
        assert method_refusal(method, platform=GPU) is None


def test_arctic_methods_run_only_where_arctic_inferences_plugin_loads(schema) -> None:  # noqa: ANN001
    schema(ARCTIC)
    cases = [
        ("arctic", (), {}, CPU, "the plugin requires CUDA: it refuses to load on vLLM's CPU build"),
        ("mlp_speculator", (), {ARCTIC_ENV: "1"}, CPU, "the plugin requires CUDA"),
        ("arctic", (), {}, GPU, f"where the engine's environment sets {ARCTIC_ENV}=1"),
        ("eagle3", ("enable_suffix_decoding",), {}, GPU, "enable_suffix_decoding (method eagle3) is Arctic Inference's"),
    ]
    for method, fields, env, platform, needle in cases:
        why = method_refusal(method, fields, env, platform)
        assert why is not None and needle in why and "\n" not in why, (method, why)
    assert method_refusal("arctic", (), {ARCTIC_ENV: "1"}, GPU) is None
    assert method_refusal("mlp_speculator", (), {ARCTIC_ENV: "1"}, GPU) is None
    assert method_refusal("arctic", (), {ARCTIC_ENV: "1", "ARCTIC_INFERENCE_SKIP_PLATFORM_CHECK": "1"}, CPU) is None
    pinned = dataclasses.replace(ARCTIC, plugin_pin="0.26.0")
    schema(pinned)
    why = method_refusal("arctic", (), {ARCTIC_ENV: "1"}, GPU)
    assert why is not None and why.endswith("the plugin installed here patches vLLM 0.26.0 only, not vLLM 0.32.0+cpu")
    assert method_refusal("arctic", (), {ARCTIC_ENV: "1", "ARCTIC_INFERENCE_SKIP_VERSION_CHECK": "1"}, GPU) is None


def test_without_the_plugin_installed_the_refusal_says_where_the_method_runs(schema) -> None:  # noqa: ANN001
    schema(VLLM)
    why = method_refusal("mlp_speculator", (), {ARCTIC_ENV: "1"}, GPU)
    assert why is not None and why.endswith(f"on CUDA (pip install arctic-inference, and {ARCTIC_ENV}=1 in the engine's env)")
    schema(None)  # no vLLM here: nothing says the engine cannot run it
    assert method_refusal("mlp_speculator", platform=CPU) is None


@needs_vllm
def test_the_installed_vllms_v1_engine_still_has_no_mlp_speculator_proposer() -> None:
    """The reason method_refusal gives, checked in the installed vLLM's source: when this fails,
    vLLM runs MLP speculators again and the refusal must go."""
    schema = installed_schema()
    assert schema is not None
    vllm = schema.source.parent.parent
    runner = (vllm / "v1" / "worker" / "gpu_model_runner.py").read_text()
    dispatch = runner[runner.index("self.drafter = "):runner.index("Unknown speculative decoding method")]
    assert "mlp_speculator" not in dispatch.lower() and "MLPSpeculator" not in dispatch
    v2 = (vllm / "config" / "vllm.py").read_text()
    unsupported = v2[v2.index("def _get_v2_model_runner_unsupported_features"):]
    assert '"mlp_speculator"' in unsupported[:unsupported.index("return unsupported")]


@needs_vllm
def test_the_engine_here_refuses_mlp_speculator_unless_arctic_inferences_plugin_runs_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ARCTIC_ENV, raising=False)
    spec = SpecConfig(method="mlp_speculator", model="ibm-ai-platform/llama3-8b-accelerator", num_speculative_tokens=2)
    with pytest.raises(ConfigError) as info:
        check_runnable(spec)
    message = str(info.value)
    assert message.startswith("mlp_speculator k=2 (llama3-8b-accelerator): method mlp_speculator: vLLM ")
    assert "\n" not in message
    check_runnable(parse_spec('{"method": "ngram", "num_speculative_tokens": 2}'))


@needs_vllm
def test_measure_refuses_before_any_engine_starts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ARCTIC_ENV, raising=False)
    started: list[object] = []

    def server_factory(*args: object, **kwargs: object) -> object:
        started.append(args)
        raise AssertionError("an engine was started")

    spec = SpecConfig(method="mlp_speculator", model="org/accelerator", num_speculative_tokens=2)
    workload = WorkloadSpec(source="prompts.jsonl", concurrency=1)
    with pytest.raises(ConfigError, match="^mlp_speculator k=2 .*no MLP-speculator proposer"):
        measure(EngineArgs(model="org/target"), spec, workload, [Prompt(id="0", text="hi")], log_dir=tmp_path,
                server_factory=server_factory)
    assert started == []
