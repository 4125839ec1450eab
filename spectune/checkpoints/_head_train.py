"""Training an EAGLE-3 head on a target's own hidden states: the training data, the head's shape,
its loop (its state saved every :data:`SAVE_EVERY` steps, to resume) and the folder vLLM serves
it from."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spectune._hf import quiet_transformers
from spectune._util import ProgressHook
from spectune.checkpoints._distil import train_step
from spectune.errors import SpectuneError

__all__ = ["SAVE_EVERY", "HeadTraining"]

logger = logging.getLogger("spectune.checkpoints._head")

SAVE_EVERY = 50
"""Training steps between two saves of the resumable state."""


@dataclass(frozen=True)
class HeadTraining:
    """How a head is trained: the knobs of :data:`HEAD_RECIPE`."""

    steps: int = 600
    batch_size: int = 16
    window: int = 128
    ttt_steps: int = 3
    ttt_decay: float = 0.8
    lr: float = 3e-3
    max_new_tokens: int = 64
    draft_vocab_size: int | None = None
    """None: the target's whole vocabulary."""
    seed: int = 0


def _head_data(target: Any, tokenizer: Any, prompts: list[str], layer_ids: tuple[int, ...],
               training: HeadTraining, progress: ProgressHook) -> dict[str, Any]:
    """The target's greedy answers, then its aux states and argmax over the last ``window``
    positions of each prompt and answer."""
    import torch

    from spectune.checkpoints._distil_data import generate_distill_data
    from spectune.config import Prompt
    from spectune.predict._eagle3 import target_features

    examples = generate_distill_data(
        target, tokenizer, [("prompts", Prompt(id=str(i), text=p)) for i, p in enumerate(prompts)],
        max_new_tokens=training.max_new_tokens, top_k=1, batch_size=32, prompt_labels=0, progress=progress,
    )
    features, tokens, labels = [], [], []
    device = next(target.parameters()).device
    with torch.inference_mode():
        for i, ex in enumerate(examples):
            progress("reading the target's hidden states of {total} answers", i, len(examples))
            ids = ex.ids[-(training.window + 1):].to(device)  # one more token: the input of the last position
            feats, argmax = target_features(target, ids, layer_ids)
            features.append(feats[:-1].to(torch.bfloat16).cpu())
            tokens.append(ids.cpu())
            labels.append(argmax.cpu())
    return {"features": features, "tokens": tokens, "labels": labels, "layer_ids": list(layer_ids)}


def _new_head(target: Any, layer_ids: tuple[int, ...], data: dict[str, Any],
              training: HeadTraining) -> tuple[Any, Any, Any]:
    """A head initialised from the target: its embeddings, its lm_head's rows of the draft
    vocabulary (the most frequent argmax tokens), and the maps between the two vocabularies."""
    import torch

    from spectune.predict._eagle3 import Eagle3Head, HeadShape

    cfg = target.config
    vocab = int(cfg.vocab_size)
    size = min(training.draft_vocab_size or vocab, vocab)
    if size < vocab:
        counts = torch.bincount(torch.cat(data["labels"]), minlength=vocab)
        kept = counts.topk(size).indices.sort().values
    else:
        kept = torch.arange(vocab)
    heads = int(cfg.num_attention_heads)
    rope = getattr(cfg, "rope_parameters", None) or {}
    shape = HeadShape(
        hidden_size=int(cfg.hidden_size), num_heads=heads, num_kv_heads=int(getattr(cfg, "num_key_value_heads", heads)),
        head_dim=int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads),
        intermediate_size=int(cfg.intermediate_size), vocab_size=vocab, draft_vocab_size=size,
        layer_ids=layer_ids, rms_norm_eps=float(getattr(cfg, "rms_norm_eps", 1e-6)),
        rope_theta=float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))),
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(training.seed)
        head = Eagle3Head(shape)
    with torch.no_grad():
        head.embed_tokens.weight.copy_(target.get_input_embeddings().weight.detach().cpu())
        head.lm_head.weight.copy_(target.get_output_embeddings().weight.detach().cpu()[kept])
        head.norm.weight.copy_(target.model.norm.weight.detach().cpu())
        d2t = kept - torch.arange(size)
        head.d2t.copy_(d2t)
    head.embed_tokens.weight.requires_grad_(False)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[kept] = True
    return head, d2t, t2d


def _batch(data: dict[str, Any], rows: Sequence[int], window: int, depth: int, t2d_index: Any) -> tuple[Any, ...]:
    """Features ``[B, W, A]``, tokens ``[B, W + depth]`` and per-depth labels ``[depth, B, W]``
    (draft ids; -100 where there is none) of the sequences ``rows``."""
    import torch

    width = max(len(data["features"][r]) for r in rows)
    aux = data["features"][rows[0]].shape[-1]
    feats = torch.zeros(len(rows), width, aux)
    toks = torch.zeros(len(rows), width + depth, dtype=torch.long)
    labels = torch.full((depth, len(rows), width), -100, dtype=torch.long)
    for b, r in enumerate(rows):
        f, t, y = data["features"][r], data["tokens"][r], data["labels"][r]
        n = len(f)  # positions 0..n-1 read tokens 1..n; t has n + 1 tokens
        feats[b, :n] = f.float()
        toks[b, : n + 1] = t
        for d in range(1, depth + 1):
            m = n + 1 - d  # start i needs token i + d <= n, and its label is the argmax at i + d
            if m > 0:
                labels[d - 1, b, :m] = t2d_index[y[d: d + m]]
    return feats, toks, labels


def _train(head: Any, data: dict[str, Any], training: HeadTraining, state_file: Path,
           progress: ProgressHook) -> tuple[list[float], list[float]]:
    """Train ``head`` in place; the losses, and the last steps' agreement per depth."""
    import torch
    import torch.nn.functional as F

    device = head.fc.weight.device
    vocab = head.shape.vocab_size
    t2d_index = torch.full((vocab,), -100, dtype=torch.long)
    kept = torch.arange(head.shape.draft_vocab_size) + head.d2t.cpu()
    t2d_index[kept] = torch.arange(head.shape.draft_vocab_size)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=training.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=training.lr, total_steps=training.steps, pct_start=0.1)
    gen = torch.Generator().manual_seed(training.seed)
    losses: list[float] = []
    start = 0
    if state_file.is_file():
        state = torch.load(state_file)
        head.load_state_dict(state["head"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        gen.set_state(state["gen"])
        losses, start = state["losses"], state["step"]
        logger.info("resuming the head's training at step %d of %d", start, training.steps)
    n = len(data["features"])
    depth = training.ttt_steps
    hits = torch.zeros(depth)
    seen = torch.zeros(depth)
    head.train()
    for step in range(start, training.steps):
        progress("training the head for {total} steps", step, training.steps)
        rows = torch.randint(0, n, (min(training.batch_size, n),), generator=gen).tolist()
        feats, toks, labels = (x.to(device) for x in _batch(data, rows, training.window, depth, t2d_index))
        logits = head.chain_logits(feats, toks, depth)
        loss = torch.zeros((), device=device)
        for d, lg in enumerate(logits):
            y = labels[d]
            if (y >= 0).any():
                loss = loss + training.ttt_decay**d * F.cross_entropy(lg.reshape(-1, lg.shape[-1]), y.reshape(-1),
                                                                      ignore_index=-100)
            if step >= training.steps - max(1, training.steps // 10):
                ok = y >= 0
                hits[d] += (lg.argmax(-1)[ok] == y[ok]).sum().item()
                seen[d] += ok.sum().item()
        losses.append(train_step(loss, opt, sched, params))
        if (step + 1) % SAVE_EVERY == 0 and step + 1 < training.steps:
            tmp = state_file.with_suffix(".tmp")
            torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                        "gen": gen.get_state(), "losses": losses, "step": step + 1}, tmp)
            os.replace(tmp, state_file)
    head.eval()
    agreement = [round(float(h / s), 4) if s else None for h, s in zip(hits, seen)]
    return losses, agreement


def _save(head: Any, d2t: Any, t2d: Any, target_dir: Path, verifier: str, training: HeadTraining, out: Path) -> None:
    """Write ``head`` through speculators' ``Eagle3DraftModel`` (its config and safetensors)."""
    import copy

    from loguru import logger as speculators_log
    from speculators.models.eagle3 import Eagle3DraftModel
    from transformers import AutoConfig

    speculators_log.disable("speculators")  # its loading notes are not the user's business

    shape = head.shape
    layer_cfg = AutoConfig.from_pretrained(str(target_dir))
    if layer_cfg.model_type != "llama":  # the head's layer is a Llama layer whatever the target
        from transformers import LlamaConfig

        layer_cfg = LlamaConfig(**{k: v for k, v in layer_cfg.to_dict().items()
                                   if k not in ("model_type", "architectures", "auto_map")})
    layer_cfg = copy.deepcopy(layer_cfg)
    layer_cfg.num_hidden_layers = 1
    layer_cfg.head_dim = shape.head_dim
    layer_cfg.tie_word_embeddings = False
    with quiet_transformers():
        model = Eagle3DraftModel.from_training_args(
            layer_cfg, verifier_name_or_path=str(target_dir), draft_vocab_size=shape.draft_vocab_size,
            norm_before_residual=False, ttt_steps=training.ttt_steps, target_layer_ids=list(shape.layer_ids),
            t2d=t2d if shape.draft_vocab_size < shape.vocab_size else None,
            d2t=d2t if shape.draft_vocab_size < shape.vocab_size else None, draft_attn_impl="sdpa",
        )
        state = {k: v for k, v in head.state_dict().items() if k != "d2t" or shape.draft_vocab_size < shape.vocab_size}
        missing, unexpected = model.load_state_dict(state, strict=False)
        if unexpected or [m for m in missing if not m.startswith("verifier_") and m not in ("t2d", "d2t")]:
            raise SpectuneError(f"the head's tensors do not fit speculators' model: missing {missing}, unexpected {unexpected}")
        model.config.speculators_config.verifier.name_or_path = verifier
        model.save_pretrained(str(out))
