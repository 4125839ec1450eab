"""Which method a ``--draft`` serves, and the heads found beside a target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spectune.space._drafts import draft_method, local_heads


def _folder(path: Path, config: dict) -> str:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


@pytest.mark.parametrize(("config", "method"), [
    ({"speculators_model_type": "eagle3", "architectures": ["Eagle3DraftModel"]}, "eagle3"),
    ({"speculators_model_type": "dflash"}, "dflash"),
    ({"architectures": ["LlamaForCausalLMEagle3"]}, "eagle3"),
    ({"architectures": ["EAGLEModel"]}, "eagle"),
    ({"model_type": "mlp_speculator"}, "mlp_speculator"),
    ({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, "draft_model"),
])
def test_a_local_checkpoint_serves_the_method_its_config_names(tmp_path: Path, config: dict, method: str) -> None:
    assert draft_method(_folder(tmp_path / "ckpt", config)) == method


@pytest.mark.parametrize(("name", "method"), [
    ("RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3", "eagle3"),
    ("yuhuili/EAGLE-LLaMA3.1-Instruct-8B", "eagle"),
    ("meta-llama/Llama-3.2-1B-Instruct", "draft_model"),
])
def test_a_hub_name_is_read_as_vllm_reads_it(name: str, method: str) -> None:
    assert draft_method(name) == method


def test_heads_beside_a_target_are_found_when_they_name_it(tmp_path: Path) -> None:
    target = _folder(tmp_path / "models" / "M", {"model_type": "llama"})
    other = _folder(tmp_path / "models" / "N", {"model_type": "llama"})
    verifier = {"speculators_config": {"verifier": {"name_or_path": target}}, "speculators_model_type": "eagle3"}
    head = _folder(tmp_path / "models" / "M-eagle3", verifier)
    assert local_heads(target) == [head]
    assert local_heads(other) == []  # M-eagle3 is not N's
    _folder(tmp_path / "models" / "N-eagle3", {"speculators_config": {"verifier": {"name_or_path": target}}})
    assert local_heads(other) == []  # beside N, but trained for M
    assert local_heads("org/hub-model") == []


def test_each_draft_goes_to_the_method_it_serves_and_a_built_head_joins(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from spectune.errors import ConfigError
    from spectune.study import StudyConfig, resolved_space

    target = _folder(tmp_path / "m" / "T", {"model_type": "llama"})
    draft = _folder(tmp_path / "m" / "T-draft", {"model_type": "llama"})
    head = _folder(tmp_path / "m" / "T-eagle3", {"speculators_model_type": "eagle3",
                                                 "speculators_config": {"verifier": {"name_or_path": target}}})

    def methods(draft_arg: object, space: str = "default") -> dict[str, list[str] | None]:
        cfg = StudyConfig.model_validate({"target": target, "draft": draft_arg, "space": space,
                                          "workload": {"source": "humaneval"}})
        return {m.value: p.models for m, p in resolved_space(cfg).methods.items()}

    with caplog.at_level(logging.INFO):
        found = methods(draft)
    assert found["draft_model"] == [draft] and found["eagle3"] == [head]  # the head beside the target joined
    assert "found the EAGLE-3 head" in caplog.text
    # the eagle space: the head only under the method it serves
    assert methods(None, "eagle") == {"none": None, "eagle3": [head]}
    # a draft model given to a heads-only space leaves nothing: one line, before any engine
    (tmp_path / "m" / "T-eagle3" / "config.json").unlink()
    with pytest.raises(ConfigError, match="T-draft is for draft_model"):
        methods(draft, "eagle")
