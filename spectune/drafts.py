"""Draft models spectune builds for a target: a distilled draft for SmolLM2-135M-Instruct.

:func:`build_smollm2_draft` makes a small Llama draft that shares the target's vocabulary and
tokenizer (byte-identical tokenizer files), so that vLLM can use it as a draft model
(``{"model": DRAFT, "num_speculative_tokens": k}``). The recipe, offline and on CPU:

1. **Data.** The target's own greedy continuations (transformers, float32, 32 tokens) of the
   shipped prompts (HumanEval and MT-Bench, as spectune sends them by default: the completions
   API with :meth:`~spectune.workloads.Prompt.as_text`), keeping the target's top-k logits at
   each generated position and, from the same prefill, at the prompt's last 64 positions.
   Some prompts are held out for measuring (:data:`HELD_OUT`): among them every prompt that
   ``spectune measure --num-prompts 8`` (seed 0) sends.
2. **Initialisation.** The draft is the target's embeddings, final norm and lm_head (tied and
   frozen) with a few of the target's decoder layers (:func:`init_draft_from_target`).
3. **Distillation.** The layers and the final norm are trained to match the target's top-k
   distribution on windows of that text, most of them ending on the target's continuation
   (cross-entropy to the renormalised top-k softmax, i.e. the KL up to a constant, with the
   softmax over the tokens seen in the top-k; :func:`train_draft`).
4. **Measuring.** On the held-out prompts: the share of positions along the target's greedy
   path where the draft's argmax equals the target's (:func:`draft_agreement`), before and
   after training. Recorded in the marker file with the build time.

The result is written atomically (temporary folder renamed into place, under a lock file) into
``<cache>/models/<target name>-draft`` with a marker file (:data:`DRAFT_MARKER`) written last;
a later call with the same request returns at once. The private helpers for locking, atomic
swap and markers are those of :mod:`spectune.checkpoints`.

torch and transformers are imported inside the functions that use them.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from spectune._hf import dtype_kwarg, quiet_transformers
from spectune.checkpoints import (
    _import_checkpoint_deps,
    _lock,
    _read_json,
    _remove_stale,
    _swap_in,
    _versions,
    _write_json,
    default_cache_dir,
    prepare_smollm2,
)
from spectune.errors import ConfigError, SpectuneError

__all__ = [
    "DRAFT_MARKER",
    "HELD_OUT",
    "DistillExample",
    "build_smollm2_draft",
    "distill_loss",
    "draft_agreement",
    "draft_name",
    "generate_distill_data",
    "greedy_path_batch",
    "init_draft_from_target",
    "split_prompts",
    "train_draft",
    "window_batch",
]

logger = logging.getLogger(__name__)

DRAFT_MARKER = "spectune-draft.json"
"""Marker file written last into a finished draft folder."""

HELD_OUT: dict[str, tuple[int, ...]] = {"humaneval": (8, 16), "mtbench": (8,)}
"""Held-out prompts per shipped set: those selected with seed 0 for each of these counts
(what ``spectune measure --prompts SET --num-prompts N`` sends)."""

_TOKENIZER_GLOBS = ("tokenizer*", "special_tokens_map.json", "chat_template*", "vocab.*",
                    "merges.txt", "added_tokens.json")

# Everything that decides the draft's content besides target, seed and steps. Changing any value
# changes the marker, so an existing draft is rebuilt on the next call.
_DRAFT_RECIPE: dict[str, Any] = {
    "format": 1,
    "data": {
        "sources": ["humaneval", "mtbench"],
        "prompt": "Prompt.as_text() (completions API), tokenizer defaults",
        "held_out": {k: list(v) for k, v in HELD_OUT.items()},
        "generation": "transformers greedy, float32, left-padded batches of similar length",
        "labels": "target's top-k logits at the last prompt_labels prompt positions (teacher "
                  "forcing) and along its greedy continuation",
        "max_new_tokens": 32,
        "prompt_labels": 64,
        "generation_batch_size": 64,
        "top_k": 8,
    },
    "architecture": {
        "target_layers": [0, 1],
        "frozen": "embeddings, lm_head (the target's, tied as in the target)",
        "trained": "decoder layers, final norm",
        "dtype": "float32",
    },
    "training": {
        "loss": "cross-entropy to the target's renormalised top-k softmax, softmax over the "
                "tokens of the training top-k only",
        "optimizer": "AdamW, one-cycle schedule, gradient norm clipped at 1",
        "lr": 1.5e-3,
        "batch_size": 16,
        "window": 64,
        "end_share": 0.75,
    },
}
_DEFAULT_STEPS = 100
# On 2 cores shared with other work, two torch threads were up to 10x slower than one at
# decoding (OpenMP threads waiting for each other), so the build uses one.
_THREADS = 1


@dataclasses.dataclass(frozen=True)
class DistillExample:
    """One prompt, the target's greedy continuation of it, and the target's top-k logits.

    ``ids`` holds the prompt's ``prompt_len`` tokens, then the continuation. Row ``r`` of
    ``topk_ids`` / ``topk_logits`` is the target's top-k for the token after position
    ``first_label + r``, for every position from ``first_label`` to ``len(ids) - 2``. On the
    prompt the target reads the prompt's text (teacher forcing); from position
    ``prompt_len - 1`` on it reads its own greedy continuation, so there the top-1 is the next
    token of ``ids``.
    """

    prompt_id: str
    source: str
    ids: Any  # LongTensor [L]
    prompt_len: int
    first_label: int
    topk_ids: Any  # LongTensor [L - 1 - first_label, k]
    topk_logits: Any  # FloatTensor [L - 1 - first_label, k]

    @property
    def num_positions(self) -> int:
        """Positions with a target distribution (prompt and continuation)."""
        return int(self.topk_ids.shape[0])

    @property
    def num_generated(self) -> int:
        """Positions along the target's greedy path (the continuation's tokens)."""
        return len(self.ids) - self.prompt_len


def draft_name(target: Path) -> str:
    """The draft folder's name for ``target``: the target folder's name plus ``-draft``."""
    return f"{Path(target).name}-draft"


@contextlib.contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


# --------------------------------------------------------------------------------------------
# Data


def split_prompts(sources: Sequence[str] = ("humaneval", "mtbench")) -> tuple[list[Any], list[Any]]:
    """The shipped prompts of ``sources`` split into (training, held-out), each with its source.

    Returns two lists of ``(source, Prompt)``. Held out: the prompts ``select`` picks with
    seed 0 for each count in :data:`HELD_OUT`.
    """
    from spectune.config import WorkloadSpec
    from spectune.workloads import load_prompts, select

    train: list[Any] = []
    held: list[Any] = []
    for source in sources:
        prompts = load_prompts(WorkloadSpec(source=source))
        held_ids: set[str] = set()
        for n in HELD_OUT.get(source, ()):
            held_ids.update(p.id for p in select(prompts, n, 0, source))
        for p in prompts:
            (held if p.id in held_ids else train).append((source, p))
    return train, held


class _TopKRecorder:
    """A logits processor that records each step's top-k logits, leaving the scores as they are."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.ids: list[Any] = []
        self.logits: list[Any] = []

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        vals, idx = scores.float().topk(self.k, dim=-1)
        self.ids.append(idx)
        self.logits.append(vals)
        return scores


def generate_distill_data(
    target: Any,
    tokenizer: Any,
    prompts: Sequence[tuple[str, Any]],
    *,
    max_new_tokens: int,
    top_k: int,
    batch_size: int = 64,
    prompt_labels: int | None = None,
) -> list[DistillExample]:
    """The target's greedy continuations of ``prompts`` ((source, Prompt) pairs), with its top-k
    logits at every position of prompt and continuation (see :class:`DistillExample`).

    Prompts are tokenized as vLLM's completions API does (``Prompt.as_text()``, the tokenizer's
    defaults), sorted by length and generated in left-padded batches with ``generate``; the
    prompt positions' logits come from the same prefill (a hook on the final norm), so the
    prompt costs one forward pass. A continuation ends after the first end-of-sequence token
    or at ``max_new_tokens``. ``prompt_labels`` keeps the top-k of only that many last positions
    of each prompt (None: all).
    """
    import torch
    from transformers.generation import LogitsProcessorList

    eos = target.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = next(iter(eos_ids), 0)
    encoded = [(source, p.id, tokenizer(p.as_text())["input_ids"]) for source, p in prompts]
    encoded = [e for e in encoded if e[2]]
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i][2]))
    prefill: list[Any] = []

    def keep_prefill(module: Any, args: Any, output: Any) -> None:
        if not prefill:  # the first call of a generate() is the prefill over every position
            prefill.append(output.detach())

    hook = target.model.norm.register_forward_hook(keep_prefill)
    out: dict[int, DistillExample] = {}
    target.eval()
    try:
        for b in range(0, len(order), batch_size):
            batch = order[b: b + batch_size]
            width = max(len(encoded[i][2]) for i in batch)
            ids = torch.full((len(batch), width), pad, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, i in enumerate(batch):
                toks = encoded[i][2]
                ids[row, width - len(toks):] = torch.tensor(toks, dtype=torch.long)
                mask[row, width - len(toks):] = 1
            rec = _TopKRecorder(top_k)
            prefill.clear()
            with torch.inference_mode():
                seqs = target.generate(
                    input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                    do_sample=False, num_beams=1, pad_token_id=pad,
                    logits_processor=LogitsProcessorList([rec]),
                )
                gen = seqs[:, width:]
                gen_ids = torch.stack(rec.ids, dim=1)  # [batch, steps, k]
                gen_logits = torch.stack(rec.logits, dim=1)
                hidden = prefill[0]
                for row, i in enumerate(batch):
                    source, pid, toks = encoded[i]
                    cont = gen[row].tolist()
                    n = len(cont)
                    for j, t in enumerate(cont):
                        if t in eos_ids:
                            n = j + 1
                            break
                    n = min(n, gen_ids.shape[1])
                    # Prompt positions first .. P-2: from the prefill's hidden states.
                    first = 0 if prompt_labels is None else max(0, len(toks) - 1 - prompt_labels)
                    h = hidden[row, width - len(toks) + first: width - 1]
                    p_vals, p_idx = target.lm_head(h).float().topk(top_k, dim=-1)
                    out[i] = DistillExample(
                        prompt_id=pid, source=source,
                        ids=torch.tensor(toks + cont[:n], dtype=torch.long),
                        prompt_len=len(toks), first_label=first,
                        topk_ids=torch.cat([p_idx, gen_ids[row, :n]]).clone(),
                        topk_logits=torch.cat([p_vals, gen_logits[row, :n]]).clone(),
                    )
            logger.debug("generated %d of %d prompts", min(b + batch_size, len(order)),
                         len(order))
    finally:
        hook.remove()
    return [out[i] for i in range(len(encoded)) if i in out]


# --------------------------------------------------------------------------------------------
# Draft: initialisation, training, measuring


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
) -> list[float]:
    """Distil ``examples`` into ``draft`` for ``steps`` steps; return the loss of every step.

    Each step takes ``batch_size`` windows of at most ``window`` tokens, a share ``end_share``
    of them ending at an example's end (:func:`_pick_windows`, drawn with ``seed``), and
    minimises :func:`distill_loss` at every position over the draft's
    trainable parameters (AdamW, one-cycle learning rate peaking at ``lr``, gradient norm
    clipped at 1). With ``restrict_vocab`` the softmax runs over the tokens that occur in the
    examples' top-k only.
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
    for _ in range(steps):
        batch = window_batch(examples,
                             _pick_windows(examples, batch_size, window, gen, end_share))
        loss = distill_loss(draft, batch, vocab=vocab)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
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


def _target_identity(target: Path) -> dict[str, Any]:
    weights = sorted(target.glob("*.safetensors")) + sorted(target.glob("*.bin"))
    return {
        "path": str(target.resolve()),
        "weights": [{"file": w.name, "size": w.stat().st_size, "mtime_ns": w.stat().st_mtime_ns}
                    for w in weights],
    }


def _draft_request(target: Path, seed: int, steps: int, num_prompts: int | None) -> dict[str, Any]:
    return {"builder": "spectune.drafts.build_smollm2_draft", "target": _target_identity(target),
            "seed": seed, "steps": steps, "num_prompts": num_prompts, "recipe": _DRAFT_RECIPE}


def _draft_is_built(dest: Path, request: dict[str, Any]) -> bool:
    if not (dest / "config.json").is_file():
        return False
    marker = _read_json(dest / DRAFT_MARKER)
    return marker is not None and marker.get("request") == json.loads(json.dumps(request))


def _copy_tokenizer_files(src: Path, dst: Path) -> list[str]:
    names = sorted({p.name for g in _TOKENIZER_GLOBS for p in src.glob(g) if p.is_file()})
    if not {"tokenizer.json", "tokenizer.model", "vocab.json"} & set(names):
        raise ConfigError(f"{src}: no tokenizer files (tokenizer.json) to share with the draft")
    for name in names:
        shutil.copy2(src / name, dst / name)
    return names


def _build_draft_into(
    target_dir: Path, out: Path, *, seed: int, steps: int, num_prompts: int | None,
    request: dict[str, Any],
) -> dict[str, Any]:
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    data_cfg, arch, train_cfg = (_DRAFT_RECIPE["data"], _DRAFT_RECIPE["architecture"],
                                 _DRAFT_RECIPE["training"])
    timings: dict[str, float] = {}
    t = time.perf_counter()
    with quiet_transformers():
        tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
        target = LlamaForCausalLM.from_pretrained(str(target_dir), **dtype_kwarg(torch.float32))
    target.eval()
    timings["load_target_s"] = time.perf_counter() - t

    train_prompts, held_prompts = split_prompts(data_cfg["sources"])
    if num_prompts is not None:  # a smaller build (tests): every n-th prompt of each split
        train_prompts = train_prompts[:: max(1, len(train_prompts) // num_prompts)][:num_prompts]
        held_prompts = held_prompts[:: max(1, len(held_prompts) // num_prompts)][:num_prompts]
    t = time.perf_counter()
    logger.info("generating the target's greedy continuations of %d prompts",
                len(train_prompts) + len(held_prompts))
    examples = generate_distill_data(
        target, tokenizer, train_prompts + held_prompts,
        max_new_tokens=data_cfg["max_new_tokens"], top_k=data_cfg["top_k"],
        batch_size=data_cfg["generation_batch_size"], prompt_labels=data_cfg["prompt_labels"],
    )
    held_keys = {(s, p.id) for s, p in held_prompts}
    train_ex = [e for e in examples if (e.source, e.prompt_id) not in held_keys]
    held_ex = [e for e in examples if (e.source, e.prompt_id) in held_keys]
    timings["generate_s"] = time.perf_counter() - t
    logger.info("generated %d positions (%d along greedy paths) in %.0fs",
                sum(e.num_positions for e in examples), sum(e.num_generated for e in examples),
                timings["generate_s"])

    t = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        draft = init_draft_from_target(target, arch["target_layers"])
        del target
        before = draft_agreement(draft, held_ex)
        logger.info("distilling %d examples into the draft (%d steps)", len(train_ex), steps)
        losses = train_draft(draft, train_ex, steps=steps, batch_size=train_cfg["batch_size"],
                             window=train_cfg["window"], lr=train_cfg["lr"], seed=seed,
                             end_share=train_cfg["end_share"])
    timings["train_s"] = time.perf_counter() - t
    logger.info("trained %d steps in %.0fs (loss %.2f -> %.2f)", steps, timings["train_s"],
                losses[0], losses[-1])
    t = time.perf_counter()
    after = draft_agreement(draft, held_ex)
    timings["measure_s"] = time.perf_counter() - t

    t = time.perf_counter()
    for p in draft.parameters():
        p.requires_grad_(True)
    with quiet_transformers():
        draft.save_pretrained(out, safe_serialization=True)
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        cfg.pop(key, None)
    _write_json(cfg_path, cfg)
    copied = _copy_tokenizer_files(target_dir, out)
    timings["save_s"] = time.perf_counter() - t
    k = max(1, len(losses) // 10)
    return {
        "format": _DRAFT_RECIPE["format"],
        "name": out.name,
        "request": request,
        "tokenizer_files": copied,
        "num_hidden_layers": len(arch["target_layers"]),
        "data": {
            "train_prompts": len(train_ex),
            "train_positions": sum(e.num_positions for e in train_ex),
            "train_generated_positions": sum(e.num_generated for e in train_ex),
            "held_out_prompts": {s: sorted(e.prompt_id for e in held_ex if e.source == s)
                                 for s in data_cfg["sources"]},
            "held_out_generated_positions": sum(e.num_generated for e in held_ex),
        },
        "train_loss": {"first": round(sum(losses[:k]) / k, 4),
                       "last": round(sum(losses[-k:]) / k, 4), "averaged_over_steps": k},
        "agreement": {"metric": "held-out share of positions along the target's greedy path "
                                "where the draft's argmax equals the target's (float32)",
                      "before_training": before, "after_training": after},
        "timings_s": {k2: round(v, 1) for k2, v in timings.items()},
        "versions": _versions("torch", "transformers", "tokenizers"),
    }


def build_smollm2_draft(
    target: Path | None = None,
    cache_dir: Path | None = None,
    *,
    force: bool = False,
    steps: int = _DEFAULT_STEPS,
    seed: int = 0,
    num_prompts: int | None = None,
) -> Path:
    """Build (once) a distilled draft for ``target`` (default: SmolLM2-135M-Instruct); return it.

    ``target`` is a Hugging Face Llama folder; by default the one :func:`prepare_smollm2`
    prepares in ``cache_dir``. The draft, ``<cache_dir>/models/<target name>-draft``
    (``cache_dir`` defaults to :func:`default_cache_dir`), is a ``LlamaForCausalLM`` holding the
    target's embeddings, final norm and lm_head and two of its decoder layers, distilled for
    ``steps`` steps on the target's greedy continuations of the shipped HumanEval and MT-Bench
    prompts, with the target's tokenizer files copied byte for byte. Its marker file
    (:data:`DRAFT_MARKER`) records the recipe, seed, steps, build time and the measured
    agreement on held-out prompts. See the module docstring for the recipe. For SmolLM2 about
    7 minutes on 2 shared CPU cores with one torch thread (5 for the target's continuations,
    under 2 for training); ``steps`` costs about 1 s each.

    ``num_prompts`` limits the prompts of each split (training, held out) for quick builds of
    small targets (tests); None takes them all.

    Idempotent: when the folder holds a finished build of the same request (target weights'
    size and mtime, recipe, seed, steps, num_prompts), it is returned at once unless ``force``.
    The build happens in a temporary folder renamed into place under a lock file, so concurrent
    callers build once and an interrupted build leaves no half model.

    Raises:
        ConfigError: the target folder does not exist or holds no model or tokenizer, steps < 1,
            or torch/transformers are missing.
        SpectuneError: the build failed or the cache folder cannot be written.
    """
    if steps < 1:
        raise ConfigError(f"steps must be at least 1, got {steps}")
    if num_prompts is not None and num_prompts < 1:
        raise ConfigError(f"num_prompts must be at least 1, got {num_prompts}")
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    if target is None:
        target = prepare_smollm2(root)
    target = Path(target).expanduser()
    if not (target / "config.json").is_file():
        raise ConfigError(f"{target}: no target model there (no config.json)")
    parent = root / "models"
    name = draft_name(target)
    dest = parent / name
    request = _draft_request(target, seed, steps, num_prompts)
    if not force and _draft_is_built(dest, request):
        logger.debug("draft already built in %s", dest)
        return dest
    _import_checkpoint_deps()
    prefix = f".{name}.build-"
    try:
        with _lock(parent, f".{name}.lock"):
            if not force and _draft_is_built(dest, request):  # built by a concurrent caller
                return dest
            _remove_stale(parent, prefix)
            t0 = time.perf_counter()
            work = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
            try:
                out = work / name
                try:
                    with _torch_threads(_THREADS):
                        marker = _build_draft_into(target, out, seed=seed, steps=steps,
                                                   num_prompts=num_prompts, request=request)
                except (OSError, SpectuneError):
                    raise
                except Exception as e:  # foreign errors from torch/transformers, at the border
                    raise SpectuneError(
                        f"building the draft for {target.name} failed: {type(e).__name__}: {e}"
                    ) from e
                marker["build_seconds"] = round(time.perf_counter() - t0, 1)
                _write_json(out / DRAFT_MARKER, marker)  # last: marks a finished draft
                _swap_in(out, dest, work / "old")
            finally:
                shutil.rmtree(work, ignore_errors=True)
    except OSError as e:
        raise SpectuneError(f"cannot build the draft {name} in {parent}: {e}") from e
    logger.info("draft %s ready (%.0fs): held-out agreement %.3f", dest, marker["build_seconds"],
                marker["agreement"]["after_training"]["overall"] or 0.0)
    return dest
