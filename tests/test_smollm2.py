"""The embedded default model: SmolLM2-135M-Instruct prepared from the shipped GGUF, served by vLLM."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from spectune.checkpoints import prepare_smollm2
from spectune.config import EngineArgs, SpecConfig
from spectune.trial import measure
from spectune.workloads import WorkloadSpec, load_prompts

pytestmark = pytest.mark.engine

HUMANEVAL_STOP = ["\ndef ", "\nclass ", "\nif __name__", "\nprint("]  # the API takes 4 at most


def test_prepared_smollm2_completes_a_humaneval_prompt_with_python(tmp_path: Path) -> None:
    model = prepare_smollm2()
    assert (model / "config.json").is_file() and (model / "tokenizer.json").is_file()
    wl = WorkloadSpec.model_validate({
        "source": "humaneval", "num_prompts": 2, "seed": 0, "warmup_requests": 0,
        "sampling": {"temperature": 0.0, "max_tokens": 160, "stop": HUMANEVAL_STOP},
    })
    prompts = load_prompts(wl)
    m = measure(EngineArgs(model=str(model), max_model_len=2048), SpecConfig(), wl, prompts,
                log_dir=tmp_path, startup_timeout=600)
    assert m.num_failed == 0 and m.engine.dtype == "bfloat16"
    parsed = 0
    for prompt, req in zip(prompts, m.requests, strict=True):
        assert req.output_tokens and req.text.strip()
        code = prompt.as_text() + req.text
        try:
            ast.parse(code)
        except SyntaxError:
            continue
        parsed += 1
    assert parsed >= 1, [r.text for r in m.requests]
