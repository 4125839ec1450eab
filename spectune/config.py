"""Typed models of what spectune runs: a candidate speculative configuration and engine arguments.

Both are validated when built (from YAML, JSON or CLI flags) so that an impossible candidate is
refused with one line before any engine starts. Each knows how to become what vLLM reads:
:meth:`SpecConfig.to_vllm` gives the ``--speculative-config`` mapping, and
:meth:`EngineArgs.to_vllm_options` the other ``vllm serve`` options under their CLI names.
"""

from __future__ import annotations

import json
from enum import Enum
from typing import Any

from pydantic import Field, model_validator

from spectune._util import StrictModel, validate
from spectune.errors import ConfigError

__all__ = ["EngineArgs", "Method", "SpecConfig", "parse_spec"]


class Method(str, Enum):
    """Speculative-decoding proposers, named as vLLM's ``speculative_config.method``."""

    NONE = "none"
    NGRAM = "ngram"
    DRAFT_MODEL = "draft_model"
    EAGLE = "eagle"
    EAGLE3 = "eagle3"
    MLP_SPECULATOR = "mlp_speculator"
    MEDUSA = "medusa"
    MTP = "mtp"
    SUFFIX = "suffix"

    def __str__(self) -> str:
        return self.value

    @property
    def drafts_from_text(self) -> bool:
        """Whether the proposer drafts from the text alone, no model of its own running in the
        engine's steps (n-gram lookup, suffix decoding)."""
        return self in _MODEL_FREE


# Methods whose proposer is a separate checkpoint that must be named.
_NEEDS_MODEL = {Method.DRAFT_MODEL, Method.EAGLE, Method.EAGLE3, Method.MLP_SPECULATOR, Method.MEDUSA}
# Methods that propose from the text alone and take no model.
_MODEL_FREE = {Method.NGRAM, Method.SUFFIX}
# Methods whose k cannot be read from the proposer's own config and must be given.
_NEEDS_K = {Method.NGRAM, Method.DRAFT_MODEL, Method.EAGLE, Method.EAGLE3}

_NGRAM_KEYS = ("prompt_lookup_min", "prompt_lookup_max")
_SUFFIX_KEYS = (
    "suffix_decoding_max_tree_depth",
    "suffix_decoding_max_cached_requests",
    "suffix_decoding_max_spec_factor",
    "suffix_decoding_min_token_prob",
)


class SpecConfig(StrictModel):
    """One candidate speculative-decoding configuration.

    ``method="none"`` is the baseline: the target model alone. Field names are vLLM's
    ``speculative_config`` keys, so :meth:`to_vllm` is a plain, checked projection.
    """

    method: Method = Method.NONE
    model: str | None = Field(default=None, description="Draft model or head: local path or hub name.")
    num_speculative_tokens: int | None = Field(default=None, ge=1, le=64)
    prompt_lookup_min: int | None = Field(default=None, ge=1)
    prompt_lookup_max: int | None = Field(default=None, ge=1)
    suffix_decoding_max_tree_depth: int | None = Field(default=None, ge=1)
    suffix_decoding_max_cached_requests: int | None = Field(default=None, ge=0)
    suffix_decoding_max_spec_factor: float | None = Field(default=None, gt=0)
    suffix_decoding_min_token_prob: float | None = Field(default=None, ge=0, le=1)
    draft_tensor_parallel_size: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _coherent(self) -> SpecConfig:
        m = self.method
        set_keys = {k for k, v in self if v is not None and k != "method"}
        if m is Method.NONE:
            if set_keys:
                raise ValueError(f"method none takes no other keys, got {', '.join(sorted(set_keys))}")
            return self
        if m in _MODEL_FREE and self.model is not None:
            raise ValueError(f"method {m} proposes from the text and takes no model")
        if m in _NEEDS_MODEL and not self.model:
            raise ValueError(f"method {m} needs a model (the draft or head checkpoint)")
        if m in _NEEDS_K and self.num_speculative_tokens is None:
            raise ValueError(f"method {m} needs num_speculative_tokens (k >= 1)")
        if m is not Method.NGRAM and (wrong := [k for k in _NGRAM_KEYS if k in set_keys]):
            raise ValueError(f"{wrong[0]} applies to method ngram only, not {m}")
        if m is not Method.SUFFIX and (wrong := [k for k in _SUFFIX_KEYS if k in set_keys]):
            raise ValueError(f"{wrong[0]} applies to method suffix only, not {m}")
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"prompt_lookup_min ({lo}) > prompt_lookup_max ({hi})")
        return self

    @property
    def is_baseline(self) -> bool:
        return self.method is Method.NONE

    def to_vllm(self) -> dict[str, Any] | None:
        """The mapping vLLM takes as ``--speculative-config`` (None for the baseline)."""
        if self.is_baseline:
            return None
        return {k: (v.value if isinstance(v, Enum) else v) for k, v in self if v is not None}

    def label(self) -> str:
        """Short human label: ``ngram k=3 [1..3]``, ``draft_model k=4 (draft)``, ``none``."""
        if self.is_baseline:
            return "none"
        parts = [self.method.value]
        if self.num_speculative_tokens is not None:
            parts.append(f"k={self.num_speculative_tokens}")
        if self.prompt_lookup_min is not None or self.prompt_lookup_max is not None:
            parts.append(f"lookup={self.prompt_lookup_min or '?'}..{self.prompt_lookup_max or '?'}")
        if self.model:
            parts.append(f"({self.model.rstrip('/').rsplit('/', 1)[-1]})")
        return " ".join(parts)


def parse_spec(text: str) -> SpecConfig:
    """Parse ``none`` or a JSON object in vLLM's ``--speculative-config`` form.

    As vLLM does, a ``model`` without a ``method`` means ``draft_model``.
    """
    text = text.strip()
    if text.lower() in {"none", "null", ""}:
        return SpecConfig()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--spec: not JSON and not 'none': {e.msg} at column {e.colno}") from e
    if not isinstance(data, dict):
        raise ConfigError("--spec: expected a JSON object such as {\"method\": \"ngram\", ...}")
    if "method" not in data and data.get("model"):
        data = {**data, "method": "draft_model"}
    return validate(SpecConfig, data, "--spec")


class EngineArgs(StrictModel):
    """The engine arguments that are not speculative: the same for every trial of a study.

    ``None`` means "the platform's default" (see :mod:`spectune.engines`), so CPU-only
    settings never leak into a GPU user's configuration.
    """

    model: str = Field(description="Target model: local path or hub name.")
    tokenizer: str | None = None
    served_model_name: str | None = None
    dtype: str | None = None
    max_model_len: int | None = Field(default=None, ge=16)
    max_num_seqs: int | None = Field(default=None, ge=1)
    kv_cache_memory_bytes: int | None = Field(default=None, ge=1)
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    enforce_eager: bool | None = None
    tensor_parallel_size: int | None = Field(default=None, ge=1)
    seed: int | None = None
    host: str = "127.0.0.1"
    extra_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Further `vllm serve` options under their CLI names, e.g. {enable-prefix-caching: true}.",
    )
    env: dict[str, str] = Field(default_factory=dict, description="Environment variables for the engine.")

    @model_validator(mode="after")
    def _no_spec_in_extra(self) -> EngineArgs:
        for key in self.extra_args:
            norm = key.lstrip("-").replace("_", "-")
            if norm in {"speculative-config", "model", "port", "host"}:
                raise ValueError(f"extra_args: {key} is set by spectune itself")
        return self

    def to_vllm_options(self) -> dict[str, Any]:
        """``vllm serve`` options (CLI names without dashes) for the values that are set."""
        skip = {"model", "host", "extra_args", "env"}
        out: dict[str, Any] = {}
        for key, value in self:
            if key in skip or value is None:
                continue
            out[key.replace("_", "-")] = value
        for key, value in self.extra_args.items():
            out[key.lstrip("-").replace("_", "-")] = value
        return out
