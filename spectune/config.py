"""Typed models of what spectune runs: a candidate speculative configuration and engine arguments.

Both are validated when built (from YAML, JSON or CLI flags) so that an impossible candidate is
refused with one line before any engine starts. Each knows how to become what vLLM reads:
:meth:`SpecConfig.to_vllm` gives the ``--speculative-config`` mapping, and
:meth:`EngineArgs.to_vllm_options` the other ``vllm serve`` options under their CLI names.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from enum import Enum
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationInfo, model_validator

from spectune._speculative import installed_schema
from spectune._util import StrictModel, key_error, validate
from spectune.errors import ConfigError

__all__ = ["API_KEY_ENV", "ENGINE_KNOBS", "NEEDS_K", "NEEDS_MODEL", "RECORDED", "SHIPPED_NAMES", "ChatMessage", "EngineArgs", "Method",
           "Prompt", "Sampling", "SpecConfig", "WorkloadSpec", "candidate_label", "engine_field_error", "engine_method_error",
           "parse_spec"]

SHIPPED_NAMES: tuple[str, ...] = ("humaneval", "mtbench", "sharegpt")
"""Names that :attr:`WorkloadSpec.source` treats as shipped prompt sets rather than file paths
(their files: :mod:`spectune.workloads`)."""


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

class ChatMessage(StrictModel):
    role: Literal["system", "user", "assistant"]
    content: str


class Prompt(StrictModel):
    """One request's input: plain text (completions API) or chat messages (chat API)."""

    id: str = Field(description="Stable within its source: task_id, question_id, id, or the position.")
    text: str | None = None
    messages: list[ChatMessage] | None = None
    category: str | None = Field(default=None, description="The source's category (MT-Bench, Spec-Bench).")
    max_tokens: int | None = Field(
        default=None, ge=1,
        description="This request's output length (vLLM bench 'custom' output_tokens); "
        "overrides sampling.max_tokens when set.",
    )

    @model_validator(mode="after")
    def _one_of(self) -> Prompt:
        if (self.text is None) == (self.messages is None):
            raise ValueError("a prompt has either text or messages")
        if self.messages is not None and not self.messages:
            raise ValueError("messages must not be empty")
        return self

    def as_text(self) -> str:
        """The prompt as plain text (messages joined), for features and completions."""
        if self.text is not None:
            return self.text
        return "\n".join(m.content for m in self.messages or [])


class Sampling(StrictModel):
    """Sampling parameters sent with every request."""

    temperature: float = Field(default=0.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    max_tokens: int = Field(default=128, ge=1)
    seed: int | None = None
    ignore_eos: bool = Field(
        default=False, description="Generate max_tokens every time (vLLM extension)."
    )
    stop: list[str] | None = Field(default=None, description="Stop sequences.")


class WorkloadSpec(StrictModel):
    """Where prompts come from, how many, how they are sent, and at what load.

    Load shape: ``concurrency`` is the number of requests in flight for one measurement;
    ``concurrency_levels`` lists the levels of a sweep (``concurrency`` then defaults to the
    first); ``request_rate`` sends requests as a Poisson process at that many per second
    instead, with ``concurrency`` as the cap on requests in flight, and ``request_rate_levels``
    lists the rates of a sweep (``request_rate`` then defaults to the first). A level is keyed
    by its concurrency or by its rate (:attr:`levels`, :attr:`headline`).
    """

    source: str = Field(
        description="A file (JSONL, ShareGPT JSON, vLLM bench custom JSONL, Spec-Bench question.jsonl) "
        f"or a shipped set: {', '.join(SHIPPED_NAMES)}."
    )
    format: Literal["auto", "jsonl", "sharegpt", "custom", "spec_bench"] = Field(
        default="auto",
        description="auto: .json is ShareGPT; .jsonl is told by its first record "
        "(turns: spec_bench, output_tokens: custom, prompt/messages: jsonl).",
    )
    sharegpt_mode: Literal["first_turn", "history"] = Field(
        default="first_turn",
        description="ShareGPT: the first user turn as text, or the conversation up to its last "
        "user turn as chat messages.",
    )
    num_prompts: int | None = Field(default=None, ge=1, description="Prompts to select (default: all).")
    seed: int = Field(default=0, description="Seed of the selection of num_prompts.")
    api: Literal["completions", "chat"] = "completions"
    sampling: Sampling = Field(default_factory=Sampling)
    concurrency: int = Field(default=1, ge=1, description="Requests in flight in one measurement.")
    concurrency_levels: list[int] | None = Field(
        default=None, min_length=1, description="Concurrency levels of a sweep, each >= 1."
    )
    level_weights: list[float] | None = Field(
        default=None, description="How much each level (of concurrency_levels or request_rate_levels) counts in the "
        "study's objective (the share of the time the deployment spends at it; default: equal). Normalised; 0: "
        "measured (for predictions and the schedule), not counted.")
    request_rate: float | None = Field(
        default=None, gt=0, description="Requests per second (Poisson arrivals) instead of a fixed concurrency."
    )
    request_rate_levels: list[float] | None = Field(
        default=None, min_length=1, description="Request rates of a sweep (requests per second, each > 0), each "
        "level sent as request_rate is, at most concurrency in flight.")
    burstiness: float = Field(
        default=1.0, gt=0, le=1000, description="With request_rate: the shape of the gamma-distributed gaps between "
        "arrivals, as vllm bench serve's --burstiness (1: Poisson; below 1: requests come in bursts).")
    warmup_requests: int = Field(default=1, ge=0)
    request_timeout: float = Field(default=300.0, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _default_concurrency(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("concurrency_levels") and "concurrency" not in data:
            levels = data["concurrency_levels"]
            if isinstance(levels, list) and levels and isinstance(levels[0], int):
                data = {**data, "concurrency": levels[0]}
        if isinstance(data, dict) and data.get("request_rate_levels") and data.get("request_rate") is None:
            rates = data["request_rate_levels"]
            if isinstance(rates, list) and rates and isinstance(rates[0], (int, float)):
                data = {**data, "request_rate": rates[0]}
        return data

    @model_validator(mode="after")
    def _load_shape(self) -> WorkloadSpec:
        if self.concurrency_levels is not None:
            if any(c < 1 for c in self.concurrency_levels):
                raise ValueError("concurrency_levels: every level must be >= 1")
            if len(set(self.concurrency_levels)) != len(self.concurrency_levels):
                raise ValueError("concurrency_levels: levels must be distinct")
            if self.request_rate is not None:
                raise ValueError("give concurrency_levels or request rates, not both")
        if self.concurrency_levels and self.concurrency not in self.concurrency_levels:
            raise ValueError(f"concurrency {self.concurrency} is not one of concurrency_levels "
                             f"{self.concurrency_levels}: the headline level must be one of them")
        if self.request_rate_levels is not None:
            if not all(math.isfinite(r) and r > 0 for r in self.request_rate_levels):
                raise ValueError("request_rate_levels: every rate must be a finite number > 0")
            if len(set(self.request_rate_levels)) != len(self.request_rate_levels):
                raise ValueError("request_rate_levels: rates must be distinct")
            if self.concurrency == 1 and len(self.request_rate_levels) > 1:
                raise ValueError("request_rate_levels: at concurrency 1 every rate runs one request at a time; give "
                                 "concurrency, the most requests in flight (e.g. 16)")
            if self.request_rate not in self.request_rate_levels:
                raise ValueError(f"request_rate {self.request_rate} is not one of request_rate_levels "
                                 f"{self.request_rate_levels}: the headline level must be one of them")
        if self.level_weights is not None:
            swept = self.concurrency_levels or self.request_rate_levels
            if swept is None or len(self.level_weights) != len(swept):
                raise ValueError("level_weights: give one weight per level of concurrency_levels or request_rate_levels")
            if not all(math.isfinite(w) and w >= 0 for w in self.level_weights) or not any(self.level_weights):
                raise ValueError("level_weights: every weight must be a finite number >= 0, one at least > 0")
        if self.burstiness != 1.0 and self.request_rate is None:
            raise ValueError("burstiness shapes request_rate's arrivals: give request_rate too")
        return self

    @property
    def is_mix(self) -> bool:
        """Whether the study's objective is a load mix: two levels or more (of concurrency or of
        request rate), each counted by its weight (:meth:`weights`)."""
        return len(self.concurrency_levels or self.request_rate_levels or []) >= 2

    @property
    def by_rate(self) -> bool:
        """Whether the levels are request rates (``request_rate_levels``), not concurrencies."""
        return bool(self.request_rate_levels)

    @property
    def headline(self) -> float:
        """The headline level's key: its request rate where the levels are rates, else its concurrency."""
        return self.request_rate if self.by_rate and self.request_rate is not None else self.concurrency

    def at_level(self, level: float) -> WorkloadSpec:
        """This workload at one of its levels: that request rate (at most ``concurrency`` in
        flight), or that concurrency."""
        if self.by_rate:
            return self.model_copy(update={"request_rate": float(level)})
        return self.model_copy(update={"concurrency": int(level)})

    def level_name(self, level: float, short: bool = False) -> str:
        """A level as a user reads it: ``concurrency 4`` or ``0.5 requests/s`` (``short``: ``c=4``
        or ``0.5/s``, for a table's header)."""
        if self.by_rate:
            return f"{level:g}/s" if short else f"{level:g} requests/s"
        return f"c={level:g}" if short else f"concurrency {level:g}"

    def weights(self) -> dict[float, float]:
        """Each level's share of the load mix (``level_weights`` normalised; default: equal)."""
        levels = self.levels
        raw = self.level_weights or [1.0] * len(levels)
        total = math.fsum(raw)
        return {c: w / total for c, w in zip(levels, raw, strict=True)}

    @property
    def is_shipped(self) -> bool:
        """True when ``source`` names a shipped set rather than a file."""
        return self.source in SHIPPED_NAMES

    @property
    def name(self) -> str:
        """A short name: the shipped set's name, or the file's name without its extensions."""
        if self.is_shipped:
            return self.source
        name = Path(self.source).name
        for suffix in (".gz", ".jsonl", ".json"):
            name = name.removesuffix(suffix)
        return name or self.source

    @property
    def levels(self) -> list[float]:
        """The levels to measure, by key: ``concurrency_levels``, ``request_rate_levels``, else
        ``[headline]``."""
        return list(self.concurrency_levels or self.request_rate_levels or [self.headline])
