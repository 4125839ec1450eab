"""Typed models of what spectune runs: a candidate speculative configuration, engine arguments and
the workload (:mod:`spectune.config._workload`, re-exported here).

Both are validated when built (from YAML, JSON or CLI flags) so that an impossible candidate is
refused with one line before any engine starts. Each knows how to become what vLLM reads:
:meth:`SpecConfig.to_vllm` gives the ``--speculative-config`` mapping, and
:meth:`EngineArgs.to_vllm_options` the other ``vllm serve`` options under their CLI names.
"""

from __future__ import annotations

import difflib
import json
import re
from enum import Enum
from types import MappingProxyType
from typing import Any

from pydantic import ConfigDict, Field, ValidationInfo, model_validator

from spectune._speculative import installed_schema
from spectune._util import StrictModel, key_error, validate
from spectune.config._workload import SHIPPED_NAMES, ChatMessage, Prompt, Sampling, WorkloadSpec
from spectune.errors import ConfigError

__all__ = ["API_KEY_ENV", "ENGINE_KNOBS", "NEEDS_K", "NEEDS_MODEL", "RECORDED", "SHIPPED_NAMES", "ChatMessage", "EngineArgs", "Method",
           "Prompt", "Sampling", "SpecConfig", "WorkloadSpec", "candidate_label", "engine_field_error", "engine_method_error",
           "parse_spec"]


class Method(str, Enum):
    """Speculative-decoding proposers, named as vLLM's ``speculative_config.method``.

    The members are the methods spectune treats specially (which need a model, which a k, which
    parameters they tune, how their cost is modelled). Any other name without white space
    (``dflash``, ``ngram_gpu``) is a member too, made when first asked for (``Method("dflash")``,
    one per name) and not listed by iterating the class: whether the engine takes it is checked
    where a candidate is made (:func:`engine_method_error`), not here, so that what an engine ran
    can be read back anywhere.
    """

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

    @classmethod
    def _missing_(cls, value: object) -> Method | None:
        if not isinstance(value, str) or not _METHOD_NAME.fullmatch(value):
            return None
        member = str.__new__(cls, value)
        member._name_, member._value_ = value.upper(), value
        return cls._value2member_map_.setdefault(value, member)  # one member per name, whichever thread makes it

    @property
    def drafts_from_text(self) -> bool:
        """Whether the proposer drafts from the text alone, no model of its own running in the
        engine's steps (n-gram lookup, suffix decoding)."""
        return self in _MODEL_FREE

    @property
    def is_known(self) -> bool:
        """Whether spectune treats this method specially (a declared member, ``none`` included)."""
        return self._name_ in type(self)._member_map_


_METHOD_NAME = re.compile(r"\S+")
# Methods whose proposer is a separate checkpoint that must be named.
NEEDS_MODEL = {Method.DRAFT_MODEL, Method.EAGLE, Method.EAGLE3, Method.MLP_SPECULATOR, Method.MEDUSA}
# n-gram lookup, on the CPU (ngram) and on the GPU (vLLM's ngram_gpu): prompt_lookup_min/max apply.
NGRAM_FAMILY = frozenset({Method.NGRAM, Method("ngram_gpu")})
# Methods that propose from the text alone and take no model.
_MODEL_FREE = {*NGRAM_FAMILY, Method.SUFFIX}
# Methods whose k cannot be read from the proposer's own config and must be given.
NEEDS_K = {*NGRAM_FAMILY, Method.DRAFT_MODEL, Method.EAGLE, Method.EAGLE3}

_RECORDED_KEY = "spectune_recorded"
RECORDED = MappingProxyType({_RECORDED_KEY: True})
"""Validation context of configurations read back from storage (``model_validate(...,
context=RECORDED)``): what an engine ran is not checked again against the vLLM installed here."""


def engine_method_error(method: str) -> str | None:
    """Why the installed vLLM's ``SpeculativeConfig`` does not take ``method`` (one line), or None.

    ``none`` (spectune's baseline) always passes. Without vLLM installed, spectune's own methods
    (:class:`Method`'s members) stand in for vLLM's.
    """
    if method == Method.NONE.value:
        return None
    schema = installed_schema()
    if schema is None:
        names, where = frozenset(m.value for m in Method) - {Method.NONE.value}, "spectune (no vLLM is installed here)"
    else:
        names, where = schema.all_methods(), f"{schema.name}'s SpeculativeConfig"
    if names is None or method in names:
        return None
    close = difflib.get_close_matches(method.lower(), sorted(names), n=1)
    if close:
        hint = f"did you mean {close[0]}?"
    else:  # vLLM names one MTP method per model family: counted, not listed
        mtp = [n for n in names if n.endswith("_mtp")]
        hint = "it has " + ", ".join(sorted(set(names) - set(mtp))) + (f" and {len(mtp)} *_mtp variants" if mtp else "")
    return f"unknown method {method!r}: {where} has no such method ({hint})"


def engine_field_error(name: str, value: Any = None) -> str | None:
    """Why the installed vLLM's ``SpeculativeConfig`` takes no field ``name``, or not ``value``
    for it (one line, without the name); None when it does. Without vLLM installed, spectune's
    own fields (:class:`SpecConfig`'s) stand in, their values checked by SpecConfig itself."""
    schema = installed_schema()
    if schema is None:
        if name in SpecConfig.model_fields:
            return None
        return "unknown key (spectune knows no such field, and no vLLM is installed here to ask)"
    if name not in schema.fields:
        return f"unknown key ({schema.name}'s SpeculativeConfig takes no such field)"
    return schema.value_error(name, value) if value is not None else None

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

    Which methods and fields a candidate may use is the installed vLLM's answer
    (:mod:`spectune._speculative`): ``method`` must be one of its ``SpeculativeConfig``'s methods,
    and besides the fields declared here (those spectune tunes or reads) any field of that class
    may be given (``parallel_drafting``, ``rejection_sample_method``), its value checked against
    the class's annotation; these are pydantic's extra fields, refused when the installed vLLM has
    no such field. A configuration read back from storage (validation context :data:`RECORDED`)
    is not checked against the installed vLLM.
    """

    model_config = ConfigDict(extra="allow", validate_assignment=True, populate_by_name=True)

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
    def _coherent(self, info: ValidationInfo) -> SpecConfig:
        m = self.method
        set_keys = {k for k, v in self if v is not None and k != "method"}
        if m is Method.NONE:
            if set_keys:
                raise ValueError(f"method none takes no other keys, got {', '.join(sorted(set_keys))}")
            return self
        if not (info.context or {}).get(_RECORDED_KEY):
            self._check_engine(set_keys)
        if m in _MODEL_FREE and self.model is not None:
            raise ValueError(f"method {m} proposes from the text and takes no model")
        if m in NEEDS_MODEL and not self.model:
            raise ValueError(f"method {m} needs a model (the draft or head checkpoint)")
        if m in NEEDS_K and self.num_speculative_tokens is None:
            raise ValueError(f"method {m} needs num_speculative_tokens (k >= 1)")
        if m not in NGRAM_FAMILY and (wrong := [k for k in _NGRAM_KEYS if k in set_keys]):
            raise ValueError(f"{wrong[0]} applies to methods {' and '.join(sorted(NGRAM_FAMILY))} only, not {m}")
        if m is not Method.SUFFIX and (wrong := [k for k in _SUFFIX_KEYS if k in set_keys]):
            raise ValueError(f"{wrong[0]} applies to method suffix only, not {m}")
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"prompt_lookup_min ({lo}) > prompt_lookup_max ({hi})")
        return self

    def _check_engine(self, set_keys: set[str]) -> None:
        """The method and every field set, against the installed vLLM's SpeculativeConfig."""
        if why := engine_method_error(self.method.value):
            raise ValueError(why)
        extra = self.__pydantic_extra__ or {}
        for key in sorted(set_keys):
            if why := engine_field_error(key, extra.get(key)):
                raise key_error(type(self).__name__, key, why, extra.get(key, getattr(self, key, None)))

    @property
    def extra_fields(self) -> dict[str, Any]:
        """The fields set beyond those declared here (vLLM's, passed through as given)."""
        return {k: v for k, v in (self.__pydantic_extra__ or {}).items() if v is not None}

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
    except RecursionError as e:
        raise ConfigError("--spec: not JSON and not 'none': nested too deeply") from e
    except ValueError as e:  # a number of more than 4300 digits
        raise ConfigError(f"--spec: not JSON and not 'none': {str(e).split(':')[0]}") from e
    if not isinstance(data, dict):
        raise ConfigError("--spec: expected a JSON object such as {\"method\": \"ngram\", ...}")
    if "method" not in data and data.get("model"):
        data = {**data, "method": "draft_model"}
    return validate(SpecConfig, data, "--spec")


API_KEY_ENV = "VLLM_API_KEY"
"""The environment variable that gives vLLM's server its API key (``--api-key`` without the
command line): each engine spectune starts gets a fresh one (:class:`spectune.engines.VLLMServer`)."""


class EngineArgs(StrictModel):
    """The engine arguments that are not speculative: the study's, with the values a space's
    engine knobs (:data:`ENGINE_KNOBS`) give each trial.

    ``None`` means "the platform's default" (see :mod:`spectune.engines`), so CPU-only
    settings never leak into a GPU user's configuration.
    """

    model: str = Field(description="Target model: local path or hub name.")
    tokenizer: str | None = None
    served_model_name: str | None = None
    dtype: str | None = None
    max_model_len: int | None = Field(default=None, ge=16)
    max_num_seqs: int | None = Field(default=None, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = None
    block_size: int | None = Field(default=None, ge=1)
    quantization: str | None = None
    kv_cache_memory_bytes: int | None = Field(default=None, ge=1)
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    enforce_eager: bool | None = None
    tensor_parallel_size: int | None = Field(default=None, ge=1)
    seed: int | None = None
    host: str = Field(default="127.0.0.1", description="Address the engine listens on: loopback unless set.")
    extra_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Further `vllm serve` options under their CLI names, e.g. {enable-prefix-caching: true}.",
    )
    env: dict[str, str] = Field(default_factory=dict, description="Environment variables for the engine.")

    @model_validator(mode="after")
    def _no_spec_in_extra(self) -> EngineArgs:
        for key in self.extra_args:
            norm = key.lstrip("-").replace("_", "-")
            if norm in {"speculative-config", "model", "port", "host", "api-key"}:
                raise ValueError(f"extra_args: {key} is set by spectune itself")
        if API_KEY_ENV in self.env:
            raise ValueError(f"env: {API_KEY_ENV} is set by spectune itself (a fresh key for each engine)")
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


ENGINE_KNOBS: dict[str, str] = {
    "max_num_seqs": "int", "max_num_batched_tokens": "int", "block_size": "int", "kv_cache_memory_bytes": "int",
    "gpu_memory_utilization": "float", "enable_prefix_caching": "choice", "enable_chunked_prefill": "choice",
    "dtype": "choice", "quantization": "choice",
}
"""Engine arguments a search space may tune (a list of choices, or an int or float range), and
the kind of domain each takes; every other engine argument a space sets is fixed."""


def candidate_label(spec: SpecConfig, knobs: dict[str, Any] | None = None) -> str:
    """A candidate's label: its speculative configuration's (:meth:`SpecConfig.label`), then the
    engine knobs' values: ``ngram k=4 lookup=2..4, max_num_seqs=32``."""
    return spec.label() + "".join(f", {k}={v}" for k, v in (knobs or {}).items())


# -- the workload: prompts, sampling parameters and the load shape -------------------------
