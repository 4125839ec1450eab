"""Draft models spectune builds for a target: a distilled draft for SmolLM2-135M-Instruct.

:func:`build_smollm2_draft` makes a small Llama draft that shares the target's vocabulary and
tokenizer (byte-identical tokenizer files), so that vLLM can use it as a draft model
(``{"model": DRAFT, "num_speculative_tokens": k}``). The recipe, offline and on CPU:

1. **Data.** The target's own greedy continuations (transformers, float32) of the shipped
   prompts (HumanEval and MT-Bench, as spectune sends them by default: the completions API
   with :meth:`~spectune.workloads.Prompt.as_text`), keeping at each generated position the
   target's top-k logits. Some prompts are held out for measuring (:data:`HELD_OUT`): among
   them every prompt that ``spectune measure --num-prompts 8`` (seed 0) sends.
2. **Initialisation.** The draft is the target's embeddings, final norm and lm_head (tied and
   frozen) with a few of the target's decoder layers (:func:`init_draft_from_target`).
3. **Distillation.** The layers and the final norm are trained to match the target's top-k
   distribution along the target's greedy path (cross-entropy to the renormalised top-k
   softmax, i.e. the KL up to a constant; :func:`train_draft`).
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

from spectune.checkpoints import (
    _import_checkpoint_deps,
    _lock,
    _quiet_transformers,
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
    "draft_agreement",
    "draft_name",
    "generate_distill_data",
    "init_draft_from_target",
    "split_prompts",
    "train_draft",
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
        "generation": "transformers greedy, float32, batches of similar length",
        "max_new_tokens": 96,
        "generation_batch_size": 24,
        "top_k": 16,
    },
    "architecture": {
        "target_layers": [0, 1],
        "frozen": "embeddings, lm_head (the target's, tied as in the target)",
        "trained": "decoder layers, final norm",
        "dtype": "float32",
    },
    "training": {
        "loss": "cross-entropy to the target's renormalised top-k softmax on generated positions",
        "optimizer": "AdamW, one-cycle schedule",
        "lr": 5e-4,
        "batch_size": 8,
        "max_prompt_context": 192,
    },
}
_DEFAULT_STEPS = 300
_THREADS = 1  # on 2 shared cores one thread is several times faster than two (OpenMP spinning)


@dataclasses.dataclass(frozen=True)
class DistillExample:
    """One prompt with the target's greedy continuation and its top-k logits.

    ``ids`` holds prompt then continuation tokens. The hidden state at position
    ``start + j`` (``start`` = prompt length - 1) predicts continuation token ``j``; the target's
    top-k at that position are ``topk_ids[j]`` / ``topk_logits[j]`` (``topk_ids[j, 0]`` is the
    target's greedy token, i.e. ``ids[start + j + 1]``).
    """

    prompt_id: str
    source: str
    ids: Any  # LongTensor [prompt_len + gen_len]
    start: int
    topk_ids: Any  # LongTensor [gen_len, k]
    topk_logits: Any  # FloatTensor [gen_len, k]

    @property
    def num_positions(self) -> int:
        return int(self.topk_ids.shape[0])


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
    from spectune.workloads import WorkloadSpec, load_prompts, select

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
    """A logits processor that records each step's top-k logits and leaves the scores as they are."""

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
    batch_size: int = 24,
) -> list[DistillExample]:
    """Greedy continuations of ``prompts`` ((source, Prompt) pairs) by ``target`` with top-k logits.

    Prompts are tokenized as vLLM's completions API does (``Prompt.as_text()``, the tokenizer's
    defaults), sorted by length and generated in left-padded batches. A continuation ends after
    the first end-of-sequence token or at ``max_new_tokens``.
    """
    import torch
    from transformers.generation import LogitsProcessorList

    eos = target.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = next(iter(eos_ids), 0)
    encoded = [
        (source, p.id, tokenizer(p.as_text())["input_ids"]) for source, p in prompts
    ]
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i][2]))
    out: dict[int, DistillExample] = {}
    target.eval()
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
        with torch.inference_mode():
            seqs = target.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                do_sample=False, num_beams=1, pad_token_id=pad,
                logits_processor=LogitsProcessorList([rec]),
            )
        gen = seqs[:, width:]
        top_ids = torch.stack(rec.ids, dim=1)  # [batch, steps, k]
        top_logits = torch.stack(rec.logits, dim=1)
        for row, i in enumerate(batch):
            source, pid, toks = encoded[i]
            cont = gen[row].tolist()
            n = len(cont)
            for j, t in enumerate(cont):
                if t in eos_ids:
                    n = j + 1
                    break
            n = min(n, top_ids.shape[1])
            if n == 0:
                continue
            out[i] = DistillExample(
                prompt_id=pid, source=source,
                ids=torch.tensor(toks + cont[:n], dtype=torch.long),
                start=len(toks) - 1,
                topk_ids=top_ids[row, :n].clone(),
                topk_logits=top_logits[row, :n].clone(),
            )
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


def _pad_batch(examples: Sequence[DistillExample], max_context: int | None) -> dict[str, Any]:
    """Right-padded inputs and the flat loss positions of ``examples``."""
    import torch

    rows = []
    for ex in examples:
        cut = 0 if max_context is None else max(0, ex.start + 1 - max_context)
        # Inputs up to the last position that predicts a continuation token.
        ids = ex.ids[cut: ex.start + ex.num_positions]
        rows.append((ids, ex.start - cut, ex))
    width = max(len(r[0]) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    b_idx, p_idx, tk_ids, tk_logits = [], [], [], []
    for row, (seq, start, ex) in enumerate(rows):
        ids[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1
        n = ex.num_positions
        b_idx.append(torch.full((n,), row, dtype=torch.long))
        p_idx.append(torch.arange(start, start + n))
        tk_ids.append(ex.topk_ids)
        tk_logits.append(ex.topk_logits)
    return {"input_ids": ids, "attention_mask": mask, "rows": torch.cat(b_idx),
            "positions": torch.cat(p_idx), "topk_ids": torch.cat(tk_ids),
            "topk_logits": torch.cat(tk_logits)}


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
    the draft's softmax is taken over those tokens only: the frozen lm_head's cost shrinks by
    the vocabulary's share, which dominates the training cost otherwise.
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


def train_draft(
    draft: Any,
    examples: Sequence[DistillExample],
    *,
    steps: int,
    batch_size: int = 8,
    lr: float = 5e-4,
    seed: int = 0,
    max_context: int | None = 32,
    restrict_vocab: bool = True,
) -> list[float]:
    """Distil ``examples`` into ``draft`` for ``steps`` steps; return the loss of every step.

    Each step takes ``batch_size`` examples drawn at random (``seed``), with at most
    ``max_context`` prompt tokens before the continuation, and minimises :func:`distill_loss`
    over the trainable parameters (AdamW, one-cycle learning rate ``lr``). With
    ``restrict_vocab`` the softmax runs over the tokens that occur in the examples' top-k only
    (see :func:`distill_loss`).
    """
    import torch

    if steps < 1:
        raise ConfigError(f"steps must be at least 1, got {steps}")
    if not examples:
        raise SpectuneError("no distillation examples to train on")
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=lr, total_steps=steps, pct_start=min(0.1, 10 / steps) if steps > 1 else 0.5
    )
    gen = torch.Generator().manual_seed(seed)
    vocab = (torch.unique(torch.cat([e.topk_ids.reshape(-1) for e in examples]))
             if restrict_vocab else None)
    losses: list[float] = []
    draft.train()
    for _ in range(steps):
        pick = torch.randint(0, len(examples), (min(batch_size, len(examples)),), generator=gen)
        batch = _pad_batch([examples[int(i)] for i in pick], max_context)
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
    """Share of positions along the target's greedy path where the draft's argmax is the target's.

    Returns ``{"overall": share, "positions": n, "by_source": {source: share}}`` (shares in
    [0, 1]; the draft sees the full prompt and the target's continuation so far).
    """
    import torch

    hits: dict[str, int] = {}
    counts: dict[str, int] = {}
    draft.eval()
    with torch.inference_mode():
        for b in range(0, len(examples), batch_size):
            chunk = list(examples[b: b + batch_size])
            batch = _pad_batch(chunk, None)
            pred = _draft_logits(draft, batch).argmax(-1)
            ok = (pred == batch["topk_ids"][:, 0]).tolist()
            pos = 0
            for ex in chunk:
                n = ex.num_positions
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
    if "tokenizer.json" not in names and "tokenizer.model" not in names and "vocab.json" not in names:
        raise ConfigError(f"{src}: no tokenizer files (tokenizer.json) to share with the draft")
    for name in names:
        shutil.copy2(src / name, dst / name)
    return names


def _build_draft_into(
    target_dir: Path, out: Path, *, seed: int, steps: int, num_prompts: int | None,
    request: dict[str, Any],
) -> dict[str, Any]:
    import torch
    import transformers
    from transformers import AutoTokenizer, LlamaForCausalLM

    data_cfg, arch, train_cfg = (_DRAFT_RECIPE["data"], _DRAFT_RECIPE["architecture"],
                                 _DRAFT_RECIPE["training"])
    timings: dict[str, float] = {}
    t = time.perf_counter()
    dtype_kw = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    with _quiet_transformers():
        tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
        target = LlamaForCausalLM.from_pretrained(str(target_dir), **{dtype_kw: torch.float32})
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
        batch_size=data_cfg["generation_batch_size"],
    )
    held_keys = {(s, p.id) for s, p in held_prompts}
    train_ex = [e for e in examples if (e.source, e.prompt_id) not in held_keys]
    held_ex = [e for e in examples if (e.source, e.prompt_id) in held_keys]
    timings["generate_s"] = time.perf_counter() - t

    t = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        draft = init_draft_from_target(target, arch["target_layers"])
        del target
        before = draft_agreement(draft, held_ex)
        logger.info("distilling %d examples into the draft (%d steps)", len(train_ex), steps)
        losses = train_draft(draft, train_ex, steps=steps, batch_size=train_cfg["batch_size"],
                             lr=train_cfg["lr"], seed=seed,
                             max_context=train_cfg["max_prompt_context"])
    timings["train_s"] = time.perf_counter() - t
    t = time.perf_counter()
    after = draft_agreement(draft, held_ex)
    timings["measure_s"] = time.perf_counter() - t

    t = time.perf_counter()
    for p in draft.parameters():
        p.requires_grad_(True)
    with _quiet_transformers():
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
            "train_prompts": len(train_ex), "train_positions": sum(e.num_positions for e in train_ex),
            "held_out_prompts": {s: sorted(e.prompt_id for e in held_ex if e.source == s)
                                 for s in data_cfg["sources"]},
            "held_out_positions": sum(e.num_positions for e in held_ex),
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
    agreement on held-out prompts. See the module docstring for the recipe. About 5 minutes on
    2 CPU cores for SmolLM2 (one torch thread).

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
