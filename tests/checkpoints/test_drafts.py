"""Tests of the draft builder (spectune.checkpoints) on the tiny test models (seconds; the SmolLM2 build itself is not run).

The full build (about 5 minutes on 2 cores) is measured by benchmarks/smollm2_draft.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import spectune.checkpoints._draft as draft_build
from spectune.checkpoints import (
    DRAFT_MARKER,
    build_smollm2_draft,
    distill_loss,
    draft_agreement,
    generate_distill_data,
    init_draft_from_target,
    split_prompts,
    train_draft,
)
from spectune.checkpoints._distil import greedy_path_batch
from spectune.config import WorkloadSpec
from spectune.errors import ConfigError, SpectuneError
from spectune.workloads import load_prompts, select

SMALL = {"steps": 4, "num_prompts": 3}


@pytest.fixture(scope="module")
def built_draft(tiny_models, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, float]:
    """A draft of the tiny target built by the real machinery, in a few seconds."""
    cache = tmp_path_factory.mktemp("draft-cache")
    t0 = time.perf_counter()
    path = build_smollm2_draft(tiny_models.target, cache, **SMALL)
    return path, cache, time.perf_counter() - t0


@pytest.fixture(scope="module")
def tiny_target(tiny_models):  # noqa: ANN201
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(tiny_models.target))
    model = LlamaForCausalLM.from_pretrained(str(tiny_models.target), dtype=torch.float32)
    return model.eval(), tok


def test_build_writes_a_draft_sharing_the_targets_tokenizer(built_draft, tiny_models):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig

    path, cache, _ = built_draft
    assert path == cache / "models" / "target-draft"
    target = tiny_models.target
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (path / name).read_bytes() == (target / name).read_bytes(), name
    cfg_t, cfg_d = AutoConfig.from_pretrained(str(target)), AutoConfig.from_pretrained(str(path))
    assert cfg_d.model_type == "llama" and cfg_d.vocab_size == cfg_t.vocab_size
    assert cfg_d.hidden_size == cfg_t.hidden_size
    assert cfg_d.num_hidden_layers == 2 < cfg_t.num_hidden_layers
    assert "quantization_config" not in json.loads((path / "config.json").read_text())
    # Embeddings and lm_head are the target's, untouched by training.
    wt, wd = load_file(target / "model.safetensors"), load_file(path / "model.safetensors")
    assert torch.equal(wt["model.embed_tokens.weight"], wd["model.embed_tokens.weight"])
    assert torch.equal(wt["lm_head.weight"], wd["lm_head.weight"])
    marker = json.loads((path / DRAFT_MARKER).read_text())
    assert marker["request"]["steps"] == SMALL["steps"] and marker["request"]["seed"] == 0
    assert marker["build_seconds"] > 0
    agreement = marker["agreement"]["after_training"]
    assert 0.0 <= agreement["overall"] <= 1.0 and agreement["positions"] > 0
    assert set(agreement["by_source"]) == {"humaneval", "mtbench"}
    assert not list(path.parent.glob(".target-draft.build-*"))


def test_second_call_returns_at_once_and_other_requests_rebuild(built_draft, tiny_models,
                                                                monkeypatch):
    path, cache, _ = built_draft

    def no_build(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("rebuilt although built")

    monkeypatch.setattr(draft_build, "_build_draft_into", no_build)
    mtime = (path / DRAFT_MARKER).stat().st_mtime_ns
    assert build_smollm2_draft(tiny_models.target, cache, **SMALL) == path  # no_build would raise
    assert (path / DRAFT_MARKER).stat().st_mtime_ns == mtime

    def failing_build(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("boom")

    monkeypatch.setattr(draft_build, "_build_draft_into", failing_build)
    for kwargs in ({**SMALL, "seed": 1}, {**SMALL, "force": True}):  # both must rebuild
        with pytest.raises(SpectuneError, match="boom"):
            build_smollm2_draft(tiny_models.target, cache, **kwargs)
    # The failed builds left the finished draft and no temporary folder.
    assert (path / DRAFT_MARKER).stat().st_mtime_ns == mtime
    assert not list(path.parent.glob(".target-draft.build-*"))


def test_missing_target_is_a_one_line_config_error(tmp_path):
    with pytest.raises(ConfigError) as e:
        build_smollm2_draft(tmp_path / "no-such-model", tmp_path / "cache")
    assert "no-such-model" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "cache").exists()
    with pytest.raises(ConfigError, match="steps"):
        build_smollm2_draft(tmp_path, tmp_path / "cache", steps=0)


def test_held_out_prompts_include_what_measure_sends_and_are_not_trained_on():
    train, held = split_prompts()
    held_keys = {(s, p.id) for s, p in held}
    assert not held_keys & {(s, p.id) for s, p in train}
    for source in ("humaneval", "mtbench"):
        prompts = load_prompts(WorkloadSpec(source=source))
        measured = {(source, p.id) for p in select(prompts, 8, 0, source)}
        assert measured <= held_keys
        assert len([1 for s, _ in train if s == source]) + len(
            [1 for s, _ in held if s == source]) == len(prompts)


def test_init_draft_takes_the_targets_layers_and_freezes_embeddings(tiny_target):
    import torch

    target, _ = tiny_target
    draft = init_draft_from_target(target, [2, 0])
    assert draft.config.num_hidden_layers == 2
    t_sd, d_sd = target.state_dict(), draft.state_dict()
    for name, value in d_sd.items():
        src = name.replace("model.layers.0.", "model.layers.2.").replace(
            "model.layers.1.", "model.layers.0.")
        assert torch.equal(value, t_sd[src]), name
    trainable = {n for n, p in draft.named_parameters() if p.requires_grad}
    assert trainable and not any("embed_tokens" in n or "lm_head" in n for n in trainable)
    with pytest.raises(ConfigError, match="draft layers"):
        init_draft_from_target(target, [0, target.config.num_hidden_layers])


def test_training_lowers_the_distillation_loss(tiny_target):
    import torch

    target, tok = tiny_target
    train, held = split_prompts()
    examples = generate_distill_data(target, tok, train[::20] + held[::4], max_new_tokens=16,
                                     top_k=8, batch_size=8, prompt_labels=24)
    assert examples
    for ex in examples:
        assert ex.topk_ids.shape == ex.topk_logits.shape == (ex.num_positions, 8)
        assert ex.num_positions == len(ex.ids) - 1 - ex.first_label
        assert ex.first_label == max(0, ex.prompt_len - 1 - 24)
        assert 1 <= ex.num_generated <= 16
        # Along the greedy path the target's top-1 is the token it generated.
        r = ex.prompt_len - 1 - ex.first_label
        assert torch.equal(ex.topk_ids[r:, 0], ex.ids[ex.prompt_len:])
        assert torch.all(ex.topk_logits[:, :-1] >= ex.topk_logits[:, 1:])

    torch.manual_seed(0)
    draft = init_draft_from_target(target, [0])
    fixed = greedy_path_batch(examples)
    with torch.no_grad():
        before = float(distill_loss(draft, fixed))
    losses = train_draft(draft, examples, steps=25, batch_size=4, window=32, lr=3e-3, seed=0)
    with torch.no_grad():
        after = float(distill_loss(draft, fixed))
    assert len(losses) == 25
    assert after < before - 0.05, (before, after)
    share = draft_agreement(draft, examples)
    assert 0.0 <= share["overall"] <= 1.0
    assert share["positions"] == sum(e.num_generated for e in examples)

