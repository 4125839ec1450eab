"""A study whose space holds a method the engine here cannot run is refused before any engine
starts and before anything is written, with one line naming the space's key and the reason
(the engine test of a study with a failing engine: tests/study/test_study.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import study_config

from spectune._speculative import installed_schema
from spectune.engines import ARCTIC_ENV
from spectune.errors import ConfigError
from spectune.worker import run_study

SPACE = """
methods:
  none: {}
  ngram:
    num_speculative_tokens: 2
  mlp_speculator:
    models: ["${target}"]
    num_speculative_tokens: 2
"""


@pytest.mark.skipif(installed_schema() is None, reason="no vLLM installed: nothing says what the engine runs")
def test_a_study_with_a_method_the_engine_cannot_run_is_refused_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ARCTIC_ENV, raising=False)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": str(i), "prompt": f"def f{i}(x):"}) + "\n" for i in range(4)))
    cfg = study_config(tmp_path, tmp_path / "no-such-target", prompts, SPACE, "refused", trials=3)

    def measure_fn(*args: object, **kwargs: object) -> object:
        raise AssertionError("a trial was measured")

    with pytest.raises(ConfigError) as info:
        run_study(cfg, measure_fn=measure_fn)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{tmp_path / 'space.yaml'}: methods.mlp_speculator: method mlp_speculator: vLLM ")
    assert "no MLP-speculator proposer" in message and message.endswith("; leave it out of the space")
    assert not (tmp_path / "study.db").exists()  # nothing written
