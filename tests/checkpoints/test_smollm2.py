"""The embedded default model: SmolLM2-135M-Instruct prepared from the shipped GGUF, served by vLLM."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from spectune.checkpoints import prepare_smollm2
from spectune.config import ChatMessage, EngineArgs, Prompt, SpecConfig, WorkloadSpec
from spectune.engines import cpu_dtype, cpu_features
from spectune.trial import measure
from spectune.workloads import load_prompts

pytestmark = pytest.mark.engine

_CODE_BLOCK = re.compile(r"```(?:python|py)?\s*\n(.*?)(?:```|$)", re.DOTALL)


def test_prepared_smollm2_completes_a_humaneval_prompt_with_python(tmp_path: Path) -> None:
    model = prepare_smollm2()
    assert (model / "config.json").is_file() and (model / "tokenizer.json").is_file()
    wl = WorkloadSpec.model_validate({
        "source": "humaneval", "num_prompts": 3, "seed": 0, "warmup_requests": 0, "api": "chat",
        "sampling": {"temperature": 0.0, "max_tokens": 256},
    })
    humaneval = load_prompts(wl)
    # the instruct model, asked through its chat template, answers with a code block
    prompts = [Prompt(id=p.id, messages=[ChatMessage(
        role="user", content=f"Complete this Python function.\n```python\n{p.as_text()}```")]) for p in humaneval]
    m = measure(EngineArgs(model=str(model), max_model_len=2048), SpecConfig(), wl, prompts,
                log_dir=tmp_path, startup_timeout=600, answer_margins=False)  # nothing to hold its answers against
    # the engine's data type follows the processor, and says why
    dtype, why = cpu_dtype(cpu_features())
    assert m.num_failed == 0 and m.engine.dtype == dtype and m.engine_defaults["dtype"] == why
    # the chat API's token ids are kept as the completions API's are: the replays and features need them
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    asked = {p.id: p.messages[0].content for p in prompts if p.messages}
    parsed = []
    for req in m.requests:
        assert req.output_tokens and req.text.strip()
        assert req.token_ids is not None and len(req.token_ids) == req.output_tokens
        assert req.prompt_token_ids is not None and len(req.prompt_token_ids) == req.prompt_tokens
        assert asked[req.prompt_id].split("\n")[0] in tok.decode(req.prompt_token_ids)
        for block in _CODE_BLOCK.findall(req.text):
            try:
                tree = ast.parse(block)
            except SyntaxError:
                continue
            if any(isinstance(node, ast.FunctionDef) for node in ast.walk(tree)):
                parsed.append(req.prompt_id)
                break
    assert parsed, [r.text for r in m.requests]
