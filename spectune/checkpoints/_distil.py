"""Distilling a draft: initialised from the target's layers, trained on the target's top-k
distribution, measured by its agreement with the target's greedy path."""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from typing import Any

from spectune._util import ProgressHook, silent
from spectune.checkpoints._distil_data import DistillExample
from spectune.errors import ConfigError, SpectuneError

__all__ = ["distill_loss", "train_step", "draft_agreement", "greedy_path_batch", "init_draft_from_target", "train_draft",
           "window_batch"]

logger = logging.getLogger(__name__)


def init_draft_from_target(target: Any, layers: Sequence[int]) -> Any:
    """A ``LlamaForCausalLM`` with ``target``'s config, embeddings, final norm and lm_head, and
    the target's decoder layers ``layers`` (in that order) as its own layers 0, 1, ...

    Embeddings and lm_head are frozen (``requires_grad=False``); layers and norm are trainable.
    """
    import torch
    from transformers import LlamaForCausalLM

    n_target = target.config.num_hidden_layers
    if not layers or any(not 0 <= i < n_target for i in layers):
        raise ConfigError(f"draft layers {list(layers)}: need indices in 0..{n_target - 1}")
    cfg = copy.deepcopy(target.config)
    cfg.num_hidden_layers = len(layers)
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = [cfg.layer_types[i] for i in layers]
    draft = LlamaForCausalLM(cfg)
    src = target.state_dict()
    state = draft.state_dict()
    for name in state:
        key = name
        if name.startswith("model.layers."):
            idx, _, tail = name[len("model.layers."):].partition(".")
            key = f"model.layers.{layers[int(idx)]}.{tail}"
        state[name] = src[key].detach().clone()
    draft.load_state_dict(state)
    draft.model.embed_tokens.weight.requires_grad_(False)
    draft.lm_head.weight.requires_grad_(False)
    draft.to(torch.float32).eval()
    return draft


def _batch(items: Sequence[tuple[Any, int, Any, Any]]) -> dict[str, Any]:
    """Right-padded inputs and flat loss positions of ``items``.

    Each item is ``(input_ids, first_loss_position, topk_ids, topk_logits)``: the loss positions
    are ``first_loss_position ..`` one per row of ``topk_ids``.
    """
    import torch

    width = max(len(it[0]) for it in items)
    ids = torch.zeros((len(items), width), dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    rows, positions = [], []
    for r, (seq, first, tk_ids, _) in enumerate(items):
        ids[r, : len(seq)] = seq
        mask[r, : len(seq)] = 1
        n = int(tk_ids.shape[0])
        rows.append(torch.full((n,), r, dtype=torch.long))
        positions.append(torch.arange(first, first + n))
    return {"input_ids": ids, "attention_mask": mask, "rows": torch.cat(rows),
            "positions": torch.cat(positions),
            "topk_ids": torch.cat([it[2] for it in items]),
            "topk_logits": torch.cat([it[3] for it in items])}


def window_batch(
    examples: Sequence[DistillExample], picks: Sequence[tuple[int, int, int]]
) -> dict[str, Any]:
    """A training batch: for each ``(example, start, end)`` (label rows) the tokens at positions
    ``first_label + start .. first_label + end - 1`` as input and the target's top-k at each of
    them as labels."""
    items = []
    for i, a, b in picks:
        ex = examples[i]
        f = ex.first_label
        items.append((ex.ids[f + a: f + b], 0, ex.topk_ids[a:b], ex.topk_logits[a:b]))
    return _batch(items)


def greedy_path_batch(examples: Sequence[DistillExample]) -> dict[str, Any]:
    """The examples' full contexts, with loss positions along the target's greedy path only."""
    items = []
    for ex in examples:
        first = ex.prompt_len - 1
        r = first - ex.first_label
        items.append((ex.ids[:-1], first, ex.topk_ids[r:], ex.topk_logits[r:]))
    return _batch(items)


def _draft_logits(draft: Any, batch: dict[str, Any], head: Any = None) -> Any:
    """The draft's logits at the batch's loss positions only (the lm_head is the costly part).

    ``head`` replaces the lm_head's weight (rows of a vocabulary subset) when given.
    """
    import torch.nn.functional as F

    hidden = draft.model(input_ids=batch["input_ids"],
                         attention_mask=batch["attention_mask"]).last_hidden_state
    h = hidden[batch["rows"], batch["positions"]]
    return draft.lm_head(h) if head is None else F.linear(h, head)


def distill_loss(draft: Any, batch: dict[str, Any], *, vocab: Any = None,
                 temperature: float = 1.0) -> Any:
    """Cross-entropy of the draft to the target's renormalised top-k softmax (mean per position).

    With ``vocab`` (a sorted LongTensor of token ids holding every id of ``batch["topk_ids"]``)
    the draft's softmax is taken over those tokens only: the frozen lm_head, which otherwise
    dominates the cost of a step, shrinks by the vocabulary's share.
    """
    import torch

    if vocab is None:
        logits, targets = _draft_logits(draft, batch), batch["topk_ids"]
    else:
        logits = _draft_logits(draft, batch, draft.lm_head.weight[vocab])
        targets = torch.searchsorted(vocab, batch["topk_ids"])
    logp = torch.log_softmax(logits.float(), dim=-1)
    p = torch.softmax(batch["topk_logits"] / temperature, dim=-1)
    return -(p * logp.gather(-1, targets)).sum(-1).mean()


def _pick_windows(examples: Sequence[DistillExample], n: int, window: int, gen: Any,
                  end_share: float = 0.5) -> list[tuple[int, int, int]]:
    """``n`` random windows: an example drawn in proportion to its positions; a share
    ``end_share`` of the windows end at the example's end (so they hold the target's own
    continuation), the others anywhere."""
    import torch

    weights = torch.tensor([float(e.num_positions) for e in examples])
    picks = []
    for i in torch.multinomial(weights, n, replacement=True, generator=gen).tolist():
        total = examples[i].num_positions
        w = min(window, total)
        if float(torch.rand((), generator=gen)) < end_share:
            end = total
        else:
            end = w + int(torch.randint(0, total - w + 1, (), generator=gen))
        picks.append((i, end - w, end))
    return picks


def train_draft(
    draft: Any,
    examples: Sequence[DistillExample],
    *,
    steps: int,
    batch_size: int = 16,
    window: int = 64,
    lr: float = 1e-3,
    seed: int = 0,
    end_share: float = 0.5,
    restrict_vocab: bool = True,
    progress: ProgressHook | None = None,
) -> list[float]:
    """Distil ``examples`` into ``draft`` for ``steps`` steps; return the loss of every step.

    Each step takes ``batch_size`` windows of at most ``window`` tokens, a share ``end_share``
    of them ending at an example's end (:func:`_pick_windows`, drawn with ``seed``), and
    minimises :func:`distill_loss` at every position over the draft's
    trainable parameters (AdamW, one-cycle learning rate peaking at ``lr``, gradient norm
    clipped at 1). With ``restrict_vocab`` the softmax runs over the tokens that occur in the
    examples' top-k only. ``progress`` counts the steps.
    """
    import torch

    if steps < 1:
        raise ConfigError(f"steps must be at least 1, got {steps}")
    examples = [e for e in examples if e.num_positions > 0]
    if not examples:
        raise SpectuneError("no distillation examples to train on")
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps,
                                                pct_start=0.1 if steps >= 10 else 0.5)
    gen = torch.Generator().manual_seed(seed)
    vocab = (torch.unique(torch.cat([e.topk_ids.reshape(-1) for e in examples]))
             if restrict_vocab else None)
    losses: list[float] = []
    draft.train()
    hook = progress or silent
    for step in range(steps):
        hook("training the draft for {total} steps", step, steps)
        batch = window_batch(examples,
                             _pick_windows(examples, batch_size, window, gen, end_share))
        losses.append(train_step(distill_loss(draft, batch, vocab=vocab), opt, sched, params))
    draft.eval()
    return losses


def draft_agreement(
    draft: Any, examples: Sequence[DistillExample], *, batch_size: int = 8
) -> dict[str, Any]:
    """Share of positions along the target's greedy path where the draft's argmax (over the whole
    vocabulary) is the target's.

    The draft reads each prompt and the target's continuation so far. Returns
    ``{"overall": share, "positions": n, "by_source": {source: share}}`` (shares in [0, 1]).
    """
    import torch

    hits: dict[str, int] = {}
    counts: dict[str, int] = {}
    draft.eval()
    examples = [e for e in examples if e.num_generated > 0]
    with torch.inference_mode():
        for b in range(0, len(examples), batch_size):
            chunk = examples[b: b + batch_size]
            batch = greedy_path_batch(chunk)
            ok = (_draft_logits(draft, batch).argmax(-1) == batch["topk_ids"][:, 0]).tolist()
            pos = 0
            for ex in chunk:
                n = ex.num_generated
                hits[ex.source] = hits.get(ex.source, 0) + sum(ok[pos: pos + n])
                counts[ex.source] = counts.get(ex.source, 0) + n
                pos += n
    total = sum(counts.values())
    return {
        "overall": round(sum(hits.values()) / total, 4) if total else None,
        "positions": total,
        "by_source": {s: round(hits[s] / counts[s], 4) for s in sorted(counts)},
    }


# --------------------------------------------------------------------------------------------
# The build


def train_step(loss: Any, opt: Any, sched: Any, params: Any) -> float:
    """One optimiser step on ``loss``, its gradient norm clipped at 1 and the schedule stepped
    (the draft's distillation and the EAGLE-3 head's training); the loss as a float."""
    import torch

    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    sched.step()
    return float(loss.detach())
