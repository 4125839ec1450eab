"""``spectune models train-head``: a head for a target on a workload's answers, in speculators'
format, with a reduced draft vocabulary and its maps; bad input costs one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def _spectune(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spectune.cli", *args], capture_output=True, text=True, check=False)


def test_train_head_on_a_workload_with_a_reduced_vocabulary(tiny_models, tmp_path: Path) -> None:  # noqa: ANN001
    from safetensors.torch import load_file

    prompts = tmp_path / "code.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"def f{i}(x):\n    return x * {i}\n\ndef g{i}("}) + "\n"
                               for i in range(12)))
    out = tmp_path / "head"
    run = _spectune("models", "train-head", "--target", str(tiny_models.target), "--workload", str(prompts),
                    "--steps", "20", "--max-tokens", "8", "--draft-vocab", "200", "--out", str(out))
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(out)
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["draft_vocab_size"] == 200
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]  # vLLM's default (2, 2, 1) collides on 4 layers
    assert config["transformer_layer_config"]["num_hidden_layers"] == 1
    assert config["speculators_config"]["verifier"]["name_or_path"] == str(tiny_models.target.resolve())
    tensors = load_file(str(out / "model.safetensors"))
    d2t, t2d = tensors["d2t"], tensors["t2d"]
    assert tensors["lm_head.weight"].shape[0] == 200 and len(d2t) == 200 and len(t2d) == 1024
    kept = (d2t + d2t.new_tensor(range(200))).tolist()  # d2t is an offset: target id - draft id
    assert kept == sorted(set(kept)) and t2d.sum() == 200 and all(t2d[i] for i in kept)
    # the second call finds the head built and returns at once
    again = _spectune("models", "train-head", "--target", str(tiny_models.target), "--workload", str(prompts),
                      "--steps", "20", "--max-tokens", "8", "--draft-vocab", "200", "--out", str(out))
    assert again.returncode == 0 and again.stdout.strip() == str(out) and "training" not in again.stderr


@pytest.mark.parametrize(("args", "said"), [
    (["--target", "/no/such/target", "--workload", "humaneval"], "target /no/such/target: no such folder"),
    (["--workload", "/no/such/file.jsonl"], "/no/such/file.jsonl: no such file"),
    (["--workload", "humaneval", "--steps", "0"], "--steps"),
])
def test_train_head_refuses_bad_input_in_one_line(tiny_models, args: list[str], said: str) -> None:  # noqa: ANN001
    if "--target" not in args:
        args = ["--target", str(tiny_models.target), *args]
    run = _spectune("models", "train-head", *args)
    assert run.returncode == 2 and said in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "Traceback" not in run.stderr
