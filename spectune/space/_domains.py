"""Parameter domains of a space: a fixed value, a list of choices, or an inclusive range."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping, Sequence
from functools import cache
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import (
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    TypeAdapter,
    ValidationError,
    model_serializer,
    model_validator,
)

from spectune._util import StrictModel
from spectune.config import NGRAM_FAMILY, Method, SpecConfig

if TYPE_CHECKING:
    from optuna.trial import BaseTrial


__all__ = ["DOMAIN_FIELDS", "ENV_KEY", "EXTENDABLE", "PARAMS", "PLACEHOLDER", "ChoiceDomain", "Domain", "FloatDomain", "IntDomain",
           "check_bounds", "choices", "knob_domain", "method_params", "range_text"]

logger = logging.getLogger(__name__)

_SUFFIX_PARAMS = (
    "suffix_decoding_max_tree_depth",
    "suffix_decoding_max_cached_requests",
    "suffix_decoding_max_spec_factor",
    "suffix_decoding_min_token_prob",
)
_HEAD_PARAMS = ("models", "num_speculative_tokens", "draft_tensor_parallel_size")
# What each method may tune, in suggestion order. "models" becomes SpecConfig.model.
PARAMS: dict[Method, tuple[str, ...]] = {
    Method.NONE: (),
    Method.NGRAM: ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"),
    Method.SUFFIX: ("num_speculative_tokens", *_SUFFIX_PARAMS),
    Method.DRAFT_MODEL: _HEAD_PARAMS,
    Method.EAGLE: _HEAD_PARAMS,
    Method.EAGLE3: _HEAD_PARAMS,
    Method.MLP_SPECULATOR: _HEAD_PARAMS,
    Method.MEDUSA: _HEAD_PARAMS,
    # MTP proposes with the target's own MTP layers; `model` is optional.
    Method.MTP: ("models", "num_speculative_tokens"),
}


def method_params(method: Method) -> tuple[str, ...]:
    """What ``method`` may tune of the fields spectune declares (:data:`PARAMS`): a method spectune
    knows nothing special about (``dflash``) takes those of a head, ``ngram_gpu`` those of ``ngram``.
    Any other field of vLLM's SpeculativeConfig may be given too (:class:`MethodSpace`)."""
    if method in PARAMS:
        return PARAMS[method]
    return PARAMS[Method.NGRAM] if method in NGRAM_FAMILY else _HEAD_PARAMS


DOMAIN_FIELDS = (
    "num_speculative_tokens",
    "prompt_lookup_min",
    "prompt_lookup_max",
    *_SUFFIX_PARAMS,
    "draft_tensor_parallel_size",
)
PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")
ENV_KEY = re.compile(r"env:([A-Za-z_][A-Za-z0-9_]*)")



# ---------------------------------------------------------------------------------------------
# Domains


def _is_number(value: Any, integer: bool) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) if integer else isinstance(value, int | float)


class Domain(StrictModel):
    """Values one parameter may take: explicit ``choices``, or the range ``low..high``.

    Immutable. In YAML a scalar means one fixed value and a list means choices; a mapping gives a
    range (``{low, high, step}``) or, explicitly, ``{choices: [...]}``.
    """

    model_config = ConfigDict(frozen=True)

    choices: tuple[Any, ...] | None = None
    low: Any = None
    high: Any = None
    step: Any = None

    _integer: ClassVar[bool] = False
    _what: ClassVar[str] = "value"

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if isinstance(data, Domain) or isinstance(data, Mapping):
            return data
        what = cls._what
        if isinstance(data, list | tuple):
            if not data:
                raise ValueError("empty list of choices")
            for i, item in enumerate(data):
                if not _is_number(item, cls._integer):
                    raise ValueError(f"choice {i} ({item!r}) is not {what}")
            return {"choices": list(data)}
        if not _is_number(data, cls._integer):
            raise ValueError(f"expected {what}, a list of choices or a range {{low, high}}, got {data!r}")
        return {"choices": [data]}

    @model_validator(mode="after")
    def _coherent(self) -> Domain:
        log = getattr(self, "log", False)
        if self.choices is not None:
            if self.low is not None or self.high is not None or self.step is not None or log:
                raise ValueError("give either a list of choices or a range {low, high}, not both")
            if not self.choices:
                raise ValueError("empty list of choices")
            if len(set(self.choices)) != len(self.choices):
                raise ValueError(f"repeated choice in {list(self.choices)}")
            return self
        if self.low is None or self.high is None:
            raise ValueError("a range needs both low and high")
        if self.low > self.high:
            raise ValueError(f"empty range: low ({self.low}) > high ({self.high})")
        if log and self.step is not None:
            raise ValueError("a range takes step or log, not both")
        if log and self.low <= 0:
            raise ValueError(f"a log range needs low > 0, got {self.low}")
        if self.step is not None and not self._on_grid(self.high):
            raise ValueError(f"high ({self.high}) is not low ({self.low}) plus a multiple of step ({self.step})")
        return self

    @model_serializer(mode="plain")
    def _compact(self) -> Any:
        """The shortest YAML form: a scalar, a list, or a range mapping."""
        if self.choices is not None:
            return self.choices[0] if len(self.choices) == 1 else list(self.choices)
        out: dict[str, Any] = {"low": self.low, "high": self.high}
        if self.step is not None:
            out["step"] = self.step
        if getattr(self, "log", False):
            out["log"] = True
        if getattr(self, "hard", False):
            out["hard"] = True
        if getattr(self, "bounds", None) is not None:
            out["bounds"] = list(self.bounds)  # type: ignore[attr-defined]
        return out

    # -- queries -----------------------------------------------------------------------------

    @property
    def is_range(self) -> bool:
        return self.choices is None

    @property
    def is_fixed(self) -> bool:
        """One value only: it is not tuned (no Optuna parameter)."""
        return len(self.choices) == 1 if self.choices is not None else self.low == self.high

    @property
    def fixed_value(self) -> Any:
        if not self.is_fixed:
            raise ValueError(f"{self.model_dump()} has more than one value")
        return self.choices[0] if self.choices is not None else self.low

    @property
    def lowest(self) -> Any:
        return min(self.choices) if self.choices is not None else self.low

    @property
    def highest(self) -> Any:
        return max(self.choices) if self.choices is not None else self.high

    def _on_grid(self, value: Any) -> bool:
        if self.step is None:
            return True
        k = (value - self.low) / self.step
        return abs(k - round(k)) < 1e-8

    def contains(self, value: Any) -> bool:
        """Whether ``value`` is one of the domain's values (a range's grid included)."""
        if value is None or isinstance(value, bool):
            return False
        if self.choices is not None:
            return value in self.choices
        if not _is_number(value, self._integer):
            return False
        return self.low <= value <= self.high and self._on_grid(value)

    def values(self) -> list[Any]:
        """The values :meth:`SearchSpace.enumerate` tries (see the subclasses for ranges)."""
        if self.choices is not None:
            return list(self.choices)
        raise NotImplementedError

    def clip(self, lo: Any = None, hi: Any = None) -> Domain | None:
        """The values within ``[lo, hi]`` (a range stays on its grid); None when none are left."""
        if self.choices is not None:
            kept = tuple(v for v in self.choices if (lo is None or v >= lo) and (hi is None or v <= hi))
            return self.model_copy(update={"choices": kept}) if kept else None
        low, high = self.low, self.high
        if lo is not None and lo > low:
            low = lo if self.step is None else self.low + math.ceil((lo - self.low) / self.step - 1e-9) * self.step
        if hi is not None and hi < high:
            high = hi if self.step is None else self.low + math.floor((hi - self.low) / self.step + 1e-9) * self.step
        if low > high:
            return None
        return self.model_copy(update={"low": low, "high": high})

    def suggest(self, trial: BaseTrial, name: str) -> Any:
        """Ask ``trial`` for a value of parameter ``name`` from this domain."""
        if self.choices is not None:
            return trial.suggest_categorical(name, list(self.choices))
        raise NotImplementedError


class IntDomain(Domain):
    """Domain of an integer parameter. A range enumerates every value on its grid.

    Guided search may widen a range of :data:`EXTENDABLE` past an edge where its pick sits
    (:meth:`widened`), within ``bounds`` (default: the field's own limits, and at most four times
    ``high``); ``hard: true`` keeps the range as given.
    """

    choices: tuple[StrictInt, ...] | None = None
    low: StrictInt | None = None
    high: StrictInt | None = None
    step: StrictInt | None = Field(default=None, ge=1)
    hard: StrictBool = False
    bounds: tuple[StrictInt, StrictInt] | None = None

    _integer: ClassVar[bool] = True
    _what: ClassVar[str] = "an integer"

    @model_validator(mode="before")
    @classmethod
    def _bounds_pair(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "bounds" in data and data["bounds"] is not None:
            b = data["bounds"]
            if not isinstance(b, list | tuple) or len(b) != 2 or not all(_is_number(v, True) for v in b):
                raise ValueError(f"bounds must be [low, high], two integers, got {b!r}")
        return data

    @model_validator(mode="after")
    def _extension(self) -> IntDomain:
        if (self.hard or self.bounds is not None) and self.choices is not None:
            raise ValueError("hard and bounds apply to a range {low, high}: a list of choices is kept as given")
        if self.hard and self.bounds is not None:
            raise ValueError("give hard or bounds, not both")
        if self.bounds is not None and not self.bounds[0] <= self.low <= self.high <= self.bounds[1]:
            raise ValueError(f"bounds {list(self.bounds)} must hold the range {self.low}..{self.high}")
        return self

    def limits(self, field: str) -> tuple[int, int]:
        """How far guided search may widen this range: ``bounds``; the range itself when ``hard``
        (or a list of choices); else down to the field's own lower limit and up to the smaller of
        its upper limit and four times ``high``."""
        if self.choices is not None or self.hard:
            return self.lowest, self.highest
        if self.bounds is not None:
            return self.bounds
        lo, hi = _field_limits(field)
        step = self.step or 1
        top = max(4 * self.high, self.high + 4 * step)
        return (self.low if lo is None else min(self.low, lo + (self.low - lo) % step),
                top if hi is None else max(self.high, min(top, hi)))

    def widened(self, field: str, side: Literal["low", "high"]) -> IntDomain | None:
        """This range grown past its ``side`` by its own width (at most to :meth:`limits`, on its
        grid), carrying its limits; None where it cannot grow that way."""
        if self.choices is not None or self.hard or self.is_fixed:
            return None
        lo, hi = self.limits(field)
        step = self.step or 1
        width = self.high - self.low + step
        if side == "high":
            high = self.high + min(width, (hi - self.high) // step * step)
            return None if high == self.high else self.model_copy(update={"high": high, "bounds": (lo, hi)})
        low = self.low - min(width, (self.low - lo) // step * step)
        return None if low == self.low else self.model_copy(update={"low": low, "bounds": (lo, hi)})

    def values(self) -> list[Any]:
        if self.choices is not None:
            return list(self.choices)
        return list(range(self.low, self.high + 1, self.step or 1))

    def suggest(self, trial: BaseTrial, name: str) -> Any:
        if self.choices is not None:
            return trial.suggest_categorical(name, list(self.choices))
        return trial.suggest_int(name, self.low, self.high, step=self.step or 1)


class FloatDomain(Domain):
    """Domain of a float parameter; a range may be ``log``.

    A range cannot be listed in full: :meth:`values` gives ``low``, the midpoint (geometric for a
    log range, arithmetic otherwise, snapped to ``step`` when there is one) and ``high``.
    """

    choices: tuple[StrictFloat, ...] | None = None
    low: StrictFloat | None = None
    high: StrictFloat | None = None
    step: StrictFloat | None = Field(default=None, gt=0)
    log: bool = False

    _what: ClassVar[str] = "a number"

    def values(self) -> list[Any]:
        if self.choices is not None:
            return list(self.choices)
        mid = math.sqrt(self.low * self.high) if self.log else (self.low + self.high) / 2
        if self.step is not None:
            mid = self.low + round((mid - self.low) / self.step) * self.step
        mid = float(f"{mid:.12g}")
        return list(dict.fromkeys((self.low, mid, self.high)))

    def suggest(self, trial: BaseTrial, name: str) -> Any:
        if self.choices is not None:
            return trial.suggest_categorical(name, list(self.choices))
        return trial.suggest_float(name, self.low, self.high, step=self.step, log=self.log)


class ChoiceDomain(Domain):
    """Domain of a categorical parameter (a data type, a switch): a list of choices, or one value."""

    choices: tuple[StrictBool | StrictInt | StrictFloat | str, ...] | None = None

    _what: ClassVar[str] = "a value"

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if isinstance(data, Domain | Mapping):
            return data
        if isinstance(data, list | tuple):
            if not data:
                raise ValueError("empty list of choices")
            return {"choices": list(data)}
        if data is None or isinstance(data, dict | list):
            raise ValueError(f"expected a value or a list of choices, got {data!r}")
        return {"choices": [data]}

    @model_validator(mode="after")
    def _only_choices(self) -> ChoiceDomain:
        if self.choices is None:
            raise ValueError("takes a list of choices, not a range")
        return self

    def contains(self, value: Any) -> bool:
        return self.choices is not None and any(type(value) is type(c) and value == c for c in self.choices)


EXTENDABLE = ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "suffix_decoding_max_tree_depth")
"""The fields whose integer ranges guided search may widen past an edge (:meth:`IntDomain.widened`)."""


def _field_limits(field: str) -> tuple[int | None, int | None]:
    """SpecConfig's own lower and upper limit of integer ``field`` (None where it sets none)."""
    lo = hi = None
    for m in SpecConfig.model_fields[field].metadata:
        lo = getattr(m, "ge", lo)
        hi = getattr(m, "le", hi)
    return lo, hi


def range_text(data: Mapping[str, Any]) -> str:
    """A range's dump (``{low, high, step}``) as the log and the notes show it: ``1..12 step 2``."""
    step = data.get("step")
    return f"{data.get('low')}..{data.get('high')}" + (f" step {step}" if step not in (None, 1) else "")


def choices(values: Sequence[str]) -> Domain:
    return Domain.model_construct(choices=tuple(values))


@cache
def _value_adapter(field: str) -> TypeAdapter[float]:
    """Checks one value against SpecConfig's own bounds for ``field`` (one source of truth)."""
    info = SpecConfig.model_fields[field]
    return TypeAdapter(Annotated[float, *info.metadata])


def check_bounds(field: str, domain: Domain) -> None:
    """Every value of ``domain`` (its ``bounds`` too) within vLLM's limits for ``field``, as
    SpecConfig states them; ``hard`` and ``bounds`` only where guided search may widen."""
    bounds = getattr(domain, "bounds", None)
    if (bounds is not None or getattr(domain, "hard", False)) and field not in EXTENDABLE:
        raise ValueError(f"hard and bounds apply to the ranges guided search may widen ({', '.join(EXTENDABLE)})")
    adapter = _value_adapter(field)
    for value in domain.choices if domain.choices is not None else (domain.low, domain.high, *(bounds or ())):
        try:
            adapter.validate_python(value)
        except ValidationError as e:
            why = e.errors()[0]["msg"]
            raise ValueError(f"{value} is out of range: {why[0].lower()}{why[1:]}") from None




_KNOB_DOMAINS: dict[str, type[Domain]] = {"int": IntDomain, "float": FloatDomain, "choice": ChoiceDomain}


def knob_domain(name: str, value: Any) -> Domain:
    """The domain of engine knob ``name`` (:data:`spectune.config.ENGINE_KNOBS`) a space gives as
    ``value``, checked against :class:`~spectune.config.EngineArgs`' own bounds for it."""
    from spectune.config import ENGINE_KNOBS, EngineArgs

    domain = _KNOB_DOMAINS[ENGINE_KNOBS[name]].model_validate(value)
    if getattr(domain, "hard", False) or getattr(domain, "bounds", None) is not None:
        raise ValueError("hard and bounds apply to speculative parameters: an engine knob's range is never widened")
    info = EngineArgs.model_fields[name]
    adapter: TypeAdapter[Any] = TypeAdapter(Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation)
    for v in domain.choices if domain.choices is not None else (domain.low, domain.high):
        try:
            adapter.validate_python(v, strict=True)
        except ValidationError as e:
            raise ValueError(f"{v!r}: {e.errors()[0]['msg'][0].lower()}{e.errors()[0]['msg'][1:]}") from None
    return domain
