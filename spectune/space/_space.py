"""A search space: its methods, its fixed engine arguments, and the candidates it holds."""

from __future__ import annotations

import importlib.resources
import importlib.util
import logging
import os
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from spectune._util import StrictModel, validate
from spectune.config import ENGINE_KNOBS, NEEDS_MODEL, EngineArgs, Method, SpecConfig, engine_method_error
from spectune.errors import ConfigError
from spectune.space._domains import DOMAIN_FIELDS, PLACEHOLDER, Domain, IntDomain, knob_domain
from spectune.space._methods import FixedEngineArgs, MethodSpace

if TYPE_CHECKING:
    from optuna.trial import BaseTrial


__all__ = ["KNOB_PREFIX", "SearchSpace"]

KNOB_PREFIX = "engine."
"""The Optuna parameters of engine knobs are named ``engine.<argument>``."""

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# The space


def describe_error(e: ValueError) -> str:
    """A domain's error as one line (a pydantic error's first message)."""
    if isinstance(e, ValidationError):
        return str(e.errors()[0]["msg"]).removeprefix("Value error, ")
    return str(e)


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
    engine_knobs: dict[str, Domain] = Field(
        default_factory=dict, description="Engine arguments the study tunes beside speculation "
        "(ENGINE_KNOBS), from the ``engine:`` entries given as a list of choices or a range.")

    _source: str | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _knobs_from_engine(cls, data: Any) -> Any:
        """``engine:`` entries of :data:`ENGINE_KNOBS` given as a list or a range are tuned; one
        value (a scalar, or a list of one) stays fixed."""
        if not isinstance(data, Mapping) or not isinstance(data.get("engine_knobs") or {}, Mapping):
            return data  # the fields' own validation says what is wrong
        engine = data.get("engine") if isinstance(data.get("engine"), Mapping) else {}
        fixed, knobs = dict(engine), dict(data.get("engine_knobs") or {})
        for name, value in engine.items():
            if not isinstance(value, list | tuple) and not (isinstance(value, Mapping) and name in ENGINE_KNOBS):
                continue
            if name not in ENGINE_KNOBS:
                raise ValueError(f"engine.{name}: spectune does not tune it (it tunes {', '.join(ENGINE_KNOBS)}); "
                                 "give it one value")
            del fixed[name]
            if isinstance(value, list | tuple) and len(value) == 1:
                fixed[name] = value[0]
            else:
                knobs[name] = value
        for name, value in knobs.items():
            if name not in ENGINE_KNOBS:
                raise ValueError(f"engine.{name}: spectune does not tune it (it tunes {', '.join(ENGINE_KNOBS)})")
            try:
                knobs[name] = value if isinstance(value, Domain) else knob_domain(name, value)
            except ValueError as e:
                raise ValueError(f"engine.{name}: {describe_error(e)}") from None
        return {**data, **({"engine": fixed} if "engine" in data else {}), "engine_knobs": knobs}

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
            if why := engine_method_error(method.value):
                raise ValueError(why)
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
            if not models and (method in NEEDS_MODEL or not method.is_known):  # the engine's own methods: a model was asked for
                logger.info("search space: method %s left out: its models need ${draft} and no draft was given", method)
                continue
            methods[method] = space.model_copy(update={"models": models or None})
        if set(methods) <= {Method.NONE} and set(self.methods) - {Method.NONE}:
            left_out = ", ".join(m.value for m in self.methods if m not in methods)
            raise ConfigError(
                f"{self._where()}no method but the baseline left: {left_out} need ${{draft}}; give a draft"
            )
        return self.model_copy(update={"methods": methods})

    def for_platform(self, platform: str) -> SearchSpace:
        """A copy without the methods whose ``platforms`` leave out ``platform`` (``cpu``,
        ``gpu``; each dropped with an INFO line: vLLM there would not run it)."""
        methods = {}
        for method, space in self.methods.items():
            if space.platforms and platform not in space.platforms:
                logger.info("search space: method %s left out: it runs on %s engines, and this one is %s", method,
                               " and ".join(space.platforms), platform)
                continue
            methods[method] = space
        return self if len(methods) == len(self.methods) else self.model_copy(update={"methods": methods})

    def _expand(self, entry: str, target: str, drafts: list[str], where: str) -> list[str]:
        needs_draft = any(m.group(1) == "draft" for m in PLACEHOLDER.finditer(entry))
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

            out.append(PLACEHOLDER.sub(substitute, entry))
        return out

    def _require_resolved(self) -> None:
        for method, space in self.methods.items():
            for entry in space.models or ():
                if PLACEHOLDER.search(entry):
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

    def holds(self, spec: SpecConfig) -> bool:
        """Whether ``spec`` is a candidate of this space (:meth:`params_of` takes it)."""
        try:
            self.params_of(spec)
        except ConfigError:
            return False
        return True

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
            value = getattr(spec, field, None)  # an engine field the spec does not set: None
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

    # -- past the edges ------------------------------------------------------------------------

    def edges(self, spec: SpecConfig) -> list[tuple[str, Literal["low", "high"]]]:
        """The tuned ranges whose edge ``spec`` sits on, and that guided search may widen there:
        (``method.field``, side) (:meth:`MethodSpace.edges`)."""
        space = self.methods.get(spec.method)
        if space is None:
            return []
        return [(f"{spec.method.value}.{field}", side) for field, side in space.edges(spec.model_dump())]

    def domain(self, param: str) -> Domain | None:
        """The domain of ``method.field``, or None where the space has none."""
        method, _, field = param.partition(".")
        space = self.methods.get(Method(method)) if method in {m.value for m in Method} else None
        domain = getattr(space, field, None) if space is not None and field in DOMAIN_FIELDS else None
        return domain if isinstance(domain, Domain) else None

    def with_domain(self, param: str, domain: Domain) -> SearchSpace:
        """A copy with ``method.field``'s domain replaced (a widened range)."""
        method, _, field = param.partition(".")
        m = Method(method)
        return self.model_copy(update={"methods": {**self.methods, m: self.methods[m].model_copy(update={field: domain})}})

    def widened(self, param: str, side: Literal["low", "high"]) -> SearchSpace | None:
        """A copy with ``method.field``'s range grown past its ``side`` (:meth:`IntDomain.widened`);
        None where it cannot grow."""
        domain = self.domain(param)
        wider = domain.widened(param.partition(".")[2], side) if isinstance(domain, IntDomain) else None
        return self.with_domain(param, wider) if wider is not None else None

    def extended(self, widenings: Sequence[Mapping[str, Any]]) -> SearchSpace:
        """A copy with the ranges a study widened, in order (each ``{param: method.field, was:
        range, range: range}``, as :attr:`~spectune.records.StudyRecord.extensions` keeps them).
        A widening applies only to the range it was made from: a range given otherwise since
        (the space edited, made ``hard``, a method left out on this machine) keeps what it is."""
        space = self
        for w in widenings:
            param = w.get("param")
            domain = space.domain(param) if isinstance(param, str) else None
            if domain is not None and domain.model_dump(mode="json") == w.get("was"):
                space = space.with_domain(param, IntDomain.model_validate(w["range"]))
        return space

    def engine_fields(self, method: Method) -> list[str]:
        """The further fields of vLLM's SpeculativeConfig that ``method``'s candidates set
        (:attr:`MethodSpace.engine_fields`)."""
        return list(self.methods[method].engine_fields)

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

    @property
    def knobs(self) -> dict[str, Domain]:
        """The engine knobs this space tunes (more than one value), in the space's order."""
        return {name: d for name, d in self.engine_knobs.items() if not d.is_fixed}

    def suggest_engine(self, trial: BaseTrial) -> dict[str, Any]:
        """Draw the engine knobs' values through ``trial`` (after :meth:`suggest`); {} without knobs."""
        return {name: domain.suggest(trial, KNOB_PREFIX + name) for name, domain in self.knobs.items()}

    def engine_params_of(self, knobs: Mapping[str, Any]) -> dict[str, Any]:
        """The Optuna parameters :meth:`suggest_engine` draws for ``knobs``.

        Raises:
            ConfigError: a knob this space does not tune, or a value outside its domain.
        """
        out = {}
        for name, value in knobs.items():
            domain = self.knobs.get(name)
            if domain is None or not domain.contains(value):
                raise ConfigError(f"{self._where()}engine.{name}={value!r} is not in this space's engine knobs")
            out[KNOB_PREFIX + name] = value
        return out

    def default_knobs(self) -> dict[str, Any]:
        """Each knob's first value: where the baseline is measured."""
        return {name: domain.values()[0] for name, domain in self.knobs.items()}

    def knob_settings(self) -> list[dict[str, Any]]:
        """Every combination of the knobs' values (:meth:`Domain.values`), the defaults first."""
        settings: list[dict[str, Any]] = [{}]
        for name, domain in self.knobs.items():
            settings = [{**s, name: v} for s in settings for v in domain.values()]
        return settings

    def enumerate_candidates(self, limit: int | None = 10_000) -> list[tuple[SpecConfig, dict[str, Any]]]:
        """Every (speculative configuration, engine knobs) pair: :meth:`enumerate` times
        :meth:`knob_settings`, the baseline first.

        Raises:
            ConfigError: more than ``limit`` candidates.
        """
        settings = self.knob_settings()
        specs = self.enumerate(None if limit is None else max(1, limit // len(settings)))
        return [(spec, knobs) for spec in specs for knobs in settings]

    @staticmethod
    def spec_params(params: Mapping[str, Any]) -> dict[str, Any]:
        """``params`` without the engine knobs' (what :meth:`params_of` gives for the spec alone)."""
        return {k: v for k, v in params.items() if not k.startswith(KNOB_PREFIX)}


