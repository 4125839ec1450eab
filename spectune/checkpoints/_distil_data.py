"""The distillation data of a draft: the target's own greedy continuations of the shipped prompts,
with its top-k logits, and the recipe every draft build follows (:mod:`spectune.checkpoints._draft`)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from spectune._util import ProgressHook, silent

__all__ = ["DEFAULT_STEPS", "DRAFT_MARKER", "DRAFT_RECIPE", "HELD_OUT", "THREADS", "TOKENIZER_GLOBS", "DistillExample",
           "draft_name", "generate_distill_data", "split_prompts", "torch_threads"]

logger = logging.getLogger(__name__)

DRAFT_MARKER = "spectune-draft.json"
"""Marker file written last into a finished draft folder."""

HELD_OUT: dict[str, tuple[int, ...]] = {"humaneval": (8, 16), "mtbench": (8,)}
"""Held-out prompts per shipped set: those selected with seed 0 for each of these counts
(what ``spectune measure --prompts SET --num-prompts N`` sends)."""

TOKENIZER_GLOBS = ("tokenizer*", "special_tokens_map.json", "chat_template*", "vocab.*",
                    "merges.txt", "added_tokens.json")

# Everything that decides the draft's content besides target, seed and steps. Changing any value
# changes the marker, so an existing draft is rebuilt on the next call.
DRAFT_RECIPE: dict[str, Any] = {
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
DEFAULT_STEPS = 100
# On 2 cores shared with other work, two torch threads were up to 10x slower than one at
# decoding (OpenMP threads waiting for each other), so the build uses one.
THREADS = 1


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
def torch_threads(n: int) -> Iterator[None]:
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
    progress: ProgressHook | None = None,
) -> list[DistillExample]:
    """The target's greedy continuations of ``prompts`` ((source, Prompt) pairs), with its top-k
    logits at every position of prompt and continuation (see :class:`DistillExample`).

    Prompts are tokenized as vLLM's completions API does (``Prompt.as_text()``, the tokenizer's
    defaults), sorted by length and generated in left-padded batches with ``generate``; the
    prompt positions' logits come from the same prefill (a hook on the final norm), so the
    prompt costs one forward pass. A continuation ends after the first end-of-sequence token
    or at ``max_new_tokens``. ``prompt_labels`` keeps the top-k of only that many last positions
    of each prompt (None: all). ``progress`` counts the prompts generated, batch by batch.
    """
    report = progress or silent

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
            report("generating the target's continuations of {total} prompts", b, len(order))
            batch = [(i, *encoded[i]) for i in order[b: b + batch_size]]
            prefill.clear()
            out.update(_generate_batch(target, batch, pad, eos_ids, prefill, max_new_tokens=max_new_tokens,
                                       top_k=top_k, prompt_labels=prompt_labels))
            logger.debug("generated %d of %d prompts", min(b + batch_size, len(order)), len(order))
    finally:
        hook.remove()
    return [out[i] for i in range(len(encoded)) if i in out]


# --------------------------------------------------------------------------------------------
# Draft: initialisation, training, measuring


def _generate_batch(target: Any, batch: list[tuple[int, str, str, list[int]]], pad: int, eos_ids: set[int],
                    prefill: list[Any], *, max_new_tokens: int, top_k: int,
                    prompt_labels: int | None) -> dict[int, DistillExample]:
    """One left-padded batch of :func:`generate_distill_data`: (index, source, prompt id, tokens)
    in, each prompt's example by its index out (``prefill`` receives the prefill's hidden states)."""
    import torch
    from transformers.generation import LogitsProcessorList

    width = max(len(toks) for _, _, _, toks in batch)
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, (_, _, _, toks) in enumerate(batch):
        ids[row, width - len(toks):] = torch.tensor(toks, dtype=torch.long)
        mask[row, width - len(toks):] = 1
    rec = _TopKRecorder(top_k)
    out: dict[int, DistillExample] = {}
    with torch.inference_mode():
        seqs = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                               num_beams=1, pad_token_id=pad, logits_processor=LogitsProcessorList([rec]))
        gen = seqs[:, width:]
        gen_ids = torch.stack(rec.ids, dim=1)  # [batch, steps, k]
        gen_logits = torch.stack(rec.logits, dim=1)
        hidden = prefill[0]
        for row, (i, source, pid, toks) in enumerate(batch):
            cont = gen[row].tolist()
            n = next((j + 1 for j, t in enumerate(cont) if t in eos_ids), len(cont))
            n = min(n, gen_ids.shape[1])
            # Prompt positions first .. P-2: from the prefill's hidden states.
            first = 0 if prompt_labels is None else max(0, len(toks) - 1 - prompt_labels)
            h = hidden[row, width - len(toks) + first: width - 1]
            p_vals, p_idx = target.lm_head(h).float().topk(top_k, dim=-1)
            out[i] = DistillExample(
                prompt_id=pid, source=source, ids=torch.tensor(toks + cont[:n], dtype=torch.long),
                prompt_len=len(toks), first_label=first,
                topk_ids=torch.cat([p_idx, gen_ids[row, :n]]).clone(),
                topk_logits=torch.cat([p_vals, gen_logits[row, :n]]).clone(),
            )
    return out
