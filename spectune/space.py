"""Search spaces: which speculative-decoding configurations a study may try.

A space is read from YAML (``search_spaces/*.yaml`` or a user's file) straight into
:class:`SearchSpace`; every mistake is one :class:`~spectune.errors.ConfigError` line naming the
file and the dotted key::

    description: n-gram lookup against no speculation
    methods:
      none: {}                              # the baseline: the target alone
      ngram:
        num_speculative_tokens: {low: 1, high: 6}
        prompt_lookup_max: [2, 3, 4, 5]
        prompt_lookup_min: {low: 1, high: 2}
      draft_model:
        models: ["${draft}"]
        num_speculative_tokens: 4           # one value: fixed, not tuned
    engine:                                 # fixed engine arguments (EngineArgs without `model`)
      max_num_seqs: 64

Parameter domains (:class:`IntDomain`, :class:`FloatDomain`):

- a scalar is one fixed value; a list is explicit choices; ``{low, high}`` is an inclusive range
  with an optional ``step`` (and, for float parameters, ``log: true``);
- an empty list, a repeated choice, ``low > high`` or a ``high`` off the ``step`` grid is an error,
  and so is a value that vLLM would refuse (``num_speculative_tokens: 0``).

Which parameters a method takes is fixed per method (``_PARAMS``); a parameter of another method
is an error naming the method and the key. ``requires: [module, ...]`` drops a method whose
Python modules are not importable here (suffix decoding needs ``arctic_inference``), with a
logged warning.

Placeholders in ``models`` entries, substituted by :meth:`SearchSpace.resolve`:

- ``${target}``: the target model itself (as its own draft, say);
- ``${draft}``: the draft or head the user names for this study; several drafts make one entry
  each; with none, the entry is left out, and a method whose models all need a draft is dropped
  (logged at INFO);
- ``${env:VAR}``: the environment variable ``VAR``; unset is an error.

Optuna parameters (define-by-run, :meth:`SearchSpace.suggest`): ``method`` is a categorical over
the method names (strings), then each tuned parameter of the chosen method is named
``"{method}.{field}"`` with ``field`` the :class:`~spectune.config.SpecConfig` field
(``ngram.num_speculative_tokens``, ``draft_model.model``), so the dashboard shows them per method.
A fixed value (one value, including a one-method space's ``method``) is no Optuna parameter but
still goes into the :class:`~spectune.config.SpecConfig`.

n-gram windows keep ``prompt_lookup_min <= prompt_lookup_max``: when some combination of the two
domains would break it, one of them must be an integer range, and that one gets a *dynamic*
range (Optuna allows dynamic int/float ranges, not dynamic categorical choices). With
``prompt_lookup_min`` a range: ``max`` is suggested first (its values below the smallest ``min``
left out), then ``min`` in ``[low, min(high, max)]``. Otherwise ``max`` is the range: ``min`` first
(its values above the largest ``max`` left out), then ``max`` in ``[max(low, min), high]``.
Samplers that model parameters independently (TPE, random) handle such ranges; the grid sampler
does not, use :meth:`SearchSpace.enumerate` with ``study.enqueue_trial`` instead.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import logging
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from pydantic import (
    ConfigDict,
    Field,
    PrivateAttr,
    StrictFloat,
    StrictInt,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from spectune._util import StrictModel, load_yaml_file, validate
from spectune.config import _NEEDS_K, _NEEDS_MODEL, EngineArgs, Method, SpecConfig
from spectune.errors import ConfigError

if TYPE_CHECKING:
    from optuna.trial import BaseTrial

__all__ = [
    "FixedEngineArgs",
    "FloatDomain",
    "IntDomain",
    "MethodSpace",
    "SearchSpace",
    "list_spaces",
    "load_space",
    "spaces_dirs",
]

logger = logging.getLogger(__name__)

# The search-space folder shipped beside the package (a source checkout or an editable install).
SHIPPED_SPACES = "spectune.search_spaces"
"""The data package of the shipped spaces: the repository's ``search_spaces/``, mapped into the
wheel (read through :mod:`importlib.resources`, so an installed spectune finds them from any
directory)."""
SPACES_ENV = "SPECTUNE_SPACES"

_SUFFIX_PARAMS = (
    "suffix_decoding_max_tree_depth",
    "suffix_decoding_max_cached_requests",
    "suffix_decoding_max_spec_factor",
    "suffix_decoding_min_token_prob",
)
_HEAD_PARAMS = ("models", "num_speculative_tokens", "draft_tensor_parallel_size")
# What each method may tune, in suggestion order. "models" becomes SpecConfig.model.
_PARAMS: dict[Method, tuple[str, ...]] = {
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
_DOMAIN_FIELDS = (
    "num_speculative_tokens",
    "prompt_lookup_min",
    "prompt_lookup_max",
    *_SUFFIX_PARAMS,
    "draft_tensor_parallel_size",
)
_PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")
_ENV_KEY = re.compile(r"env:([A-Za-z_][A-Za-z0-9_]*)")


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
    """Domain of an integer parameter. A range enumerates every value on its grid."""

    choices: tuple[StrictInt, ...] | None = None
    low: StrictInt | None = None
    high: StrictInt | None = None
    step: StrictInt | None = Field(default=None, ge=1)

    _integer: ClassVar[bool] = True
    _what: ClassVar[str] = "an integer"

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


def _choices(values: Sequence[str]) -> Domain:
    return Domain.model_construct(choices=tuple(values))


@cache
def _value_adapter(field: str) -> TypeAdapter[float]:
    """Checks one value against SpecConfig's own bounds for ``field`` (one source of truth)."""
    info = SpecConfig.model_fields[field]
    return TypeAdapter(Annotated[float, *info.metadata])


def _check_bounds(field: str, domain: Domain) -> None:
    adapter = _value_adapter(field)
    for value in domain.choices if domain.choices is not None else (domain.low, domain.high):
        try:
            adapter.validate_python(value)
        except ValidationError as e:
            why = e.errors()[0]["msg"]
            raise ValueError(f"{value} is out of range: {why[0].lower()}{why[1:]}") from None


# ---------------------------------------------------------------------------------------------
# One method


# (field, static domain, dynamic domain given the values chosen so far)
_Step = tuple[str, Domain, Callable[[dict[str, Any]], Domain] | None]


class MethodSpace(StrictModel):
    """What one method may try. ``method`` comes from the key in :attr:`SearchSpace.methods`."""

    method: Method = Field(exclude=True, description="Set from the key under `methods`.")
    requires: list[str] = Field(
        default_factory=list,
        description="Python modules the method needs; without them the method is dropped.",
    )
    models: list[str] | None = Field(
        default=None, description="Draft models or heads: local paths, hub names or placeholders."
    )
    num_speculative_tokens: IntDomain | None = None
    prompt_lookup_min: IntDomain | None = None
    prompt_lookup_max: IntDomain | None = None
    suffix_decoding_max_tree_depth: IntDomain | None = None
    suffix_decoding_max_cached_requests: IntDomain | None = None
    suffix_decoding_max_spec_factor: FloatDomain | None = None
    suffix_decoding_min_token_prob: FloatDomain | None = None
    draft_tensor_parallel_size: IntDomain | None = None

    @field_validator("requires", mode="after")
    @classmethod
    def _module_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not all(part.isidentifier() for part in name.split(".")):
                hint = f" (did you mean {name.replace('-', '_')}?)" if "-" in name else ""
                raise ValueError(f"{name!r} is not a Python module name{hint}")
        return value

    @field_validator("models", mode="before")
    @classmethod
    def _one_model(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("models", mode="after")
    @classmethod
    def _models(cls, value: list[str] | None, info: ValidationInfo) -> list[str] | None:
        if value is None:
            return value
        cls._applies(info)
        if not value:
            raise ValueError("empty list: give at least one model, or leave models out")
        if len(set(value)) != len(value):
            raise ValueError(f"repeated model in {value}")
        for entry in value:
            if not entry.strip():
                raise ValueError("empty model name")
            for match in _PLACEHOLDER.finditer(entry):
                key = match.group(1)
                if key not in {"target", "draft"} and not _ENV_KEY.fullmatch(key):
                    raise ValueError(
                        f"unknown placeholder {match.group(0)} in {entry!r} (use ${{target}}, ${{draft}} or ${{env:VAR}})"
                    )
        return value

    @field_validator(*_DOMAIN_FIELDS, mode="after")
    @classmethod
    def _domain(cls, value: Domain | None, info: ValidationInfo) -> Domain | None:
        if value is None:
            return value
        cls._applies(info)
        _check_bounds(info.field_name, value)
        return value

    @staticmethod
    def _applies(info: ValidationInfo) -> None:
        method = info.data.get("method")
        if method is None or info.field_name in _PARAMS[method]:
            return
        takes = ", ".join(_PARAMS[method]) or "no parameters"
        raise ValueError(f"does not apply to method {method} ({method} takes {takes})")

    @model_validator(mode="after")
    def _complete(self) -> MethodSpace:
        m = self.method
        if m in _NEEDS_MODEL and self.models is None:
            raise ValueError(f"method {m} needs models: the draft or head checkpoints to try (a path, a hub name or ${{draft}})")
        if m in _NEEDS_K and self.num_speculative_tokens is None:
            raise ValueError(f"method {m} needs num_speculative_tokens")
        self._steps()  # raises when prompt_lookup_min/max cannot be kept in order
        return self

    # -- the walk shared by suggest, params_of and enumerate ---------------------------------

    def _steps(self) -> list[_Step]:
        steps: list[_Step] = []
        for name in _PARAMS[self.method]:
            if name == "models":
                if self.models:
                    steps.append(("model", _choices(self.models), None))
            elif name == "prompt_lookup_max":
                steps.extend(self._lookup_steps())
            elif name != "prompt_lookup_min" and (domain := getattr(self, name)) is not None:
                steps.append((name, domain, None))
        return steps

    def _lookup_steps(self) -> list[_Step]:
        """Steps for the n-gram window, keeping prompt_lookup_min <= prompt_lookup_max."""
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if lo is None or hi is None:
            return [(n, d, None) for n, d in (("prompt_lookup_max", hi), ("prompt_lookup_min", lo)) if d is not None]
        if lo.highest <= hi.lowest:  # every combination is valid: independent parameters
            return [("prompt_lookup_max", hi, None), ("prompt_lookup_min", lo, None)]
        if lo.is_range and not lo.is_fixed:
            his = hi.clip(lo=lo.lowest)
            if his is None:
                raise ValueError(f"prompt_lookup_min is never <= prompt_lookup_max ({lo.lowest} > {hi.highest})")
            return [
                ("prompt_lookup_max", his, None),
                ("prompt_lookup_min", lo, lambda chosen: lo.clip(hi=chosen["prompt_lookup_max"])),
            ]
        if hi.is_range and not hi.is_fixed:
            los = lo.clip(hi=hi.highest)
            if los is None:
                raise ValueError(f"prompt_lookup_min is never <= prompt_lookup_max ({lo.lowest} > {hi.highest})")
            return [
                ("prompt_lookup_min", los, None),
                ("prompt_lookup_max", hi, lambda chosen: hi.clip(lo=chosen["prompt_lookup_min"])),
            ]
        raise ValueError(
            f"prompt_lookup_min can exceed prompt_lookup_max ({lo.highest} > {hi.lowest}); make one of them "
            "a range {low, high} so that the tuner can keep min <= max"
        )

    def _walk(self, choose: Callable[[str, Domain, bool], Any]) -> dict[str, Any]:
        """Choose each parameter in order: ``choose(field, domain, tuned)`` returns its value."""
        chosen: dict[str, Any] = {}
        for name, static, dynamic in self._steps():
            domain = dynamic(chosen) if dynamic is not None else static
            chosen[name] = choose(name, domain, not static.is_fixed)
        return chosen

    def _combinations(self) -> Iterator[dict[str, Any]]:
        steps = self._steps()

        def rec(i: int, chosen: dict[str, Any]) -> Iterator[dict[str, Any]]:
            if i == len(steps):
                yield dict(chosen)
                return
            name, static, dynamic = steps[i]
            domain = dynamic(chosen) if dynamic is not None else static
            for value in domain.values():
                chosen[name] = value
                yield from rec(i + 1, chosen)
            chosen.pop(name, None)

        yield from rec(0, {})


# ---------------------------------------------------------------------------------------------
# Engine arguments fixed by a space


class FixedEngineArgs(EngineArgs):
    """:class:`~spectune.config.EngineArgs` without the target: what a space fixes for every trial."""

    model: str | None = Field(default=None, exclude=True)  # type: ignore[assignment]

    @field_validator("model")
    @classmethod
    def _no_target(cls, value: str | None) -> str | None:
        if value is not None:
            raise ValueError("the target model is not part of a search space; give it to the study")
        return value


# ---------------------------------------------------------------------------------------------
# The space


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


class SearchSpace(StrictModel):
    """Candidate speculative configurations of a study, and the engine arguments they share.

    Build with :func:`load_space`, then :meth:`resolve` the placeholders before :meth:`suggest`,
    :meth:`enumerate` or :meth:`params_of`. Immutable in use: :meth:`resolve` returns a new space.
    """

    description: str | None = None
    methods: dict[Method, MethodSpace] = Field(description="vLLM method name -> what it may try.")
    engine: FixedEngineArgs = Field(default_factory=FixedEngineArgs)

    _source: str | None = PrivateAttr(default=None)

    @field_validator("methods", mode="before")
    @classmethod
    def _method_keys(cls, value: Any) -> Any:
        if not isinstance(value, Mapping):
            return value
        if not value:
            raise ValueError("no methods: list at least one, e.g. none: {} and ngram: {...}")
        out: dict[Method, Any] = {}
        for key, body in value.items():
            try:
                method = Method(key)
            except ValueError:
                known = ", ".join(m.value for m in Method)
                raise ValueError(f"unknown method {key!r} (known: {known})") from None
            if body is None:
                body = {}
            if isinstance(body, MethodSpace):
                if body.method is not method:
                    raise ValueError(f"{key}: holds the space of method {body.method}")
            elif isinstance(body, Mapping):
                given = body.get("method", method.value)
                if given != method.value:
                    raise ValueError(f"{key}: method {given!r} differs from its key")
                body = {**body, "method": method.value}
            out[method] = body
        return out

    @field_validator("methods", mode="after")
    @classmethod
    def _available(cls, methods: dict[Method, MethodSpace]) -> dict[Method, MethodSpace]:
        ordered = sorted(methods.items(), key=lambda item: item[0] is not Method.NONE)  # baseline first
        kept: dict[Method, MethodSpace] = {}
        for method, space in ordered:
            missing = [name for name in space.requires if not _importable(name)]
            if missing:
                logger.warning("search space: method %s left out: module %s is not importable", method, missing[0])
                continue
            kept[method] = space
        if not kept:
            raise ValueError("no method left: every method requires a module that is not importable")
        return kept

    # -- identity ----------------------------------------------------------------------------

    @property
    def source(self) -> str | None:
        """The file this space was loaded from, if any."""
        return self._source

    def _where(self) -> str:
        return f"{self._source}: " if self._source else ""

    # -- placeholders ------------------------------------------------------------------------

    def resolve(self, target: str, draft: str | Sequence[str] | None = None) -> SearchSpace:
        """A copy with ``${target}``, ``${draft}`` and ``${env:VAR}`` substituted in ``models``.

        ``draft`` may name several drafts (one model entry each). Entries that need a draft when
        none is given are left out; a method left without the models it needs is dropped (INFO).

        Raises:
            ConfigError: an empty target, an unset ``${env:VAR}``, or no method left but the
                baseline when the space had others.
        """
        if not target or not target.strip():
            raise ConfigError(f"{self._where()}resolve: the target model is empty")
        drafts = [draft] if isinstance(draft, str) else list(draft or [])
        methods: dict[Method, MethodSpace] = {}
        for method, space in self.methods.items():
            if space.models is None:
                methods[method] = space
                continue
            models: list[str] = []
            for entry in space.models:
                for model in self._expand(entry, target, drafts, f"methods.{method}.models"):
                    if model not in models:
                        models.append(model)
            if not models and method in _NEEDS_MODEL:
                logger.info("search space: method %s left out: its models need ${draft} and no draft was given", method)
                continue
            methods[method] = space.model_copy(update={"models": models or None})
        if set(methods) <= {Method.NONE} and set(self.methods) - {Method.NONE}:
            left_out = ", ".join(m.value for m in self.methods if m not in methods)
            raise ConfigError(
                f"{self._where()}no method but the baseline left: {left_out} need ${{draft}}; give a draft"
            )
        return self.model_copy(update={"methods": methods})

    def _expand(self, entry: str, target: str, drafts: list[str], where: str) -> list[str]:
        needs_draft = any(m.group(1) == "draft" for m in _PLACEHOLDER.finditer(entry))
        if needs_draft and not drafts:
            return []
        out = []
        for draft in drafts if needs_draft else [None]:

            def substitute(match: re.Match[str], draft: str | None = draft) -> str:
                key = match.group(1)
                if key == "target":
                    return target
                if key == "draft":
                    assert draft is not None
                    return draft
                var = key.removeprefix("env:")
                value = os.environ.get(var)
                if not value:
                    raise ConfigError(f"{self._where()}{where}: {match.group(0)} is used but {var} is not set")
                return value

            out.append(_PLACEHOLDER.sub(substitute, entry))
        return out

    def _require_resolved(self) -> None:
        for method, space in self.methods.items():
            for entry in space.models or ():
                if _PLACEHOLDER.search(entry):
                    raise ConfigError(
                        f"{self._where()}methods.{method}.models: {entry!r} has a placeholder; "
                        "call resolve(target, draft) first"
                    )

    # -- Optuna --------------------------------------------------------------------------------

    def suggest(self, trial: BaseTrial) -> SpecConfig:
        """Define-by-run: draw one candidate through ``trial`` (see the module docstring)."""
        self._require_resolved()
        names = [m.value for m in self.methods]
        method = Method(names[0] if len(names) == 1 else trial.suggest_categorical("method", names))

        def choose(field: str, domain: Domain, tuned: bool) -> Any:
            return domain.suggest(trial, f"{method.value}.{field}") if tuned else domain.fixed_value

        values = self.methods[method]._walk(choose)
        return validate(SpecConfig, {"method": method, **values}, self._source)

    def params_of(self, spec: SpecConfig) -> dict[str, Any]:
        """The Optuna parameters :meth:`suggest` draws for ``spec``, for ``study.enqueue_trial``.

        Raises:
            ConfigError: ``spec`` is not a candidate of this space.
        """
        self._require_resolved()
        method = spec.method
        if method not in self.methods:
            have = ", ".join(m.value for m in self.methods)
            raise ConfigError(f"{self._where()}{spec.label()}: method {method} is not in this space (it has {have})")
        params: dict[str, Any] = {}
        if len(self.methods) > 1:
            params["method"] = method.value

        def choose(field: str, domain: Domain, tuned: bool) -> Any:
            value = getattr(spec, field)
            if not domain.contains(value):
                raise ConfigError(
                    f"{self._where()}{spec.label()}: {field}={value!r} is not in methods.{method} ({domain.model_dump()})"
                )
            if tuned:
                params[f"{method.value}.{field}"] = value
            return value

        walked = self.methods[method]._walk(choose)
        extra = sorted(k for k, v in spec if v is not None and k != "method" and k not in walked)
        if extra:
            raise ConfigError(f"{self._where()}{spec.label()}: {extra[0]} is set but methods.{method} has no {extra[0]}")
        return params

    def enumerate(self, limit: int | None = 10_000) -> list[SpecConfig]:
        """Every candidate, baseline first, in a deterministic order.

        The cartesian product of choices and integer ranges, per method in the space's order
        (the baseline first); a float range contributes ``low``, midpoint and ``high`` (see
        :class:`FloatDomain`). n-gram combinations with ``prompt_lookup_min > prompt_lookup_max``
        are skipped.

        Raises:
            ConfigError: more than ``limit`` candidates (None: no limit).
        """
        self._require_resolved()
        out: list[SpecConfig] = []
        for method, space in self.methods.items():
            for values in space._combinations():
                out.append(validate(SpecConfig, {"method": method, **values}, self._source))
                if limit is not None and len(out) > limit:
                    raise ConfigError(
                        f"{self._where()}more than {limit} candidates; narrow the ranges or list choices"
                    )
        return out

    def proposers(self) -> list[tuple[Method, str]]:
        """Each (method, model) pair the space may run, once: what to pass to ``check_pairing``.

        Cheaper than walking :meth:`enumerate` when ranges are large.
        """
        self._require_resolved()
        return [(method, model) for method, space in self.methods.items() for model in space.models or ()]

    # -- engine --------------------------------------------------------------------------------

    def engine_args(self, target: str) -> EngineArgs:
        """The space's fixed engine arguments with ``target`` as the model."""
        data = self.engine.model_dump(exclude_unset=True, exclude={"model"})
        return validate(EngineArgs, {**data, "model": target}, self._source)


# ---------------------------------------------------------------------------------------------
# Loading


def spaces_dirs() -> list[Path]:
    """Folders searched for named spaces: ``$SPECTUNE_SPACES`` (os.pathsep list), then shipped."""
    dirs = [Path(p).expanduser() for p in os.environ.get(SPACES_ENV, "").split(os.pathsep) if p]
    return [*dirs, *_shipped_dirs()]


def _shipped_dirs() -> list[Path]:
    """The folder of the shipped spaces: inside the installed package (the repository's
    ``search_spaces/`` for an editable install)."""
    try:
        return [Path(str(importlib.resources.files(SHIPPED_SPACES)))]
    except ModuleNotFoundError:  # pragma: no cover - an install without its data package
        return []


def list_spaces() -> dict[str, Path]:
    """Named spaces -> their files; an earlier folder of :func:`spaces_dirs` wins a name."""
    found: dict[str, Path] = {}
    for folder in spaces_dirs():
        if not folder.is_dir():
            continue
        for path in sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")]):
            found.setdefault(path.stem, path)
    return found


def _find(path_or_name: str | Path) -> Path:
    if isinstance(path_or_name, Path):
        return path_or_name
    text = str(path_or_name)
    looks_like_path = "/" in text or os.sep in text or text.endswith((".yaml", ".yml"))
    if looks_like_path or Path(text).is_file():
        return Path(text).expanduser()
    known = list_spaces()
    if text in known:
        return known[text]
    where = ", ".join(str(d) for d in spaces_dirs())
    names = ", ".join(known) or "none"
    raise ConfigError(f"no search space named {text!r} (looked in {where}; known: {names})")


def load_space(path_or_name: str | Path) -> SearchSpace:
    """Load a space from a YAML file, or by name (``default``, ``ngram``) from :func:`spaces_dirs`.

    The space still holds its placeholders: call :meth:`SearchSpace.resolve` next.

    Raises:
        ConfigError: no such file or name, invalid YAML, or an invalid space (one line naming
            the file and the dotted key).
    """
    path = _find(path_or_name)
    data = load_yaml_file(path)
    if data is None:
        raise ConfigError(f"{path}: empty search space (expected a mapping with 'methods')")
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected a mapping with 'methods', got {type(data).__name__}")
    space = validate(SearchSpace, data, source=str(path))
    space._source = str(path)
    return space
