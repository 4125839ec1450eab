"""One method's part of a space (its models and parameter domains), and the space's fixed engine arguments."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from spectune._util import StrictModel, key_error
from spectune.config import NEEDS_K, NEEDS_MODEL, EngineArgs, Method, engine_field_error
from spectune.space._domains import (
    DOMAIN_FIELDS,
    ENV_KEY,
    EXTENDABLE,
    PLACEHOLDER,
    ChoiceDomain,
    Domain,
    FloatDomain,
    IntDomain,
    check_bounds,
    choices,
    method_params,
)

if TYPE_CHECKING:
    pass


__all__ = ["FixedEngineArgs", "MethodSpace"]

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# One method


# (field, static domain, dynamic domain given the values chosen so far)
_Step = tuple[str, Domain, Callable[[dict[str, Any]], Domain] | None]


class MethodSpace(StrictModel):
    """What one method may try. ``method`` comes from the key in :attr:`SearchSpace.methods`.

    Besides the fields declared here, any other field of the installed vLLM's SpeculativeConfig
    may be given (``parallel_drafting: true``, ``rejection_sample_method: [standard, block]``):
    one value, or a list of choices, each checked against vLLM's annotation of the field
    (:func:`~spectune.config.engine_field_error`); these are pydantic's extra fields, each held
    as a :class:`~spectune.space.ChoiceDomain` (:attr:`engine_fields`), and tuned like the others.
    """

    model_config = ConfigDict(extra="allow", validate_assignment=True, populate_by_name=True)

    method: Method = Field(exclude=True, description="Set from the key under `methods`.")
    requires: list[str] = Field(
        default_factory=list,
        description="Python modules the method needs; without them the method is dropped.",
    )
    platforms: list[Literal["cpu", "gpu"]] = Field(
        default_factory=list,
        description="The engine platforms the method runs on (cpu, gpu); on another it is dropped. Empty: any.",
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
            for match in PLACEHOLDER.finditer(entry):
                key = match.group(1)
                if key not in {"target", "draft"} and not ENV_KEY.fullmatch(key):
                    raise ValueError(
                        f"unknown placeholder {match.group(0)} in {entry!r} (use ${{target}}, ${{draft}} or ${{env:VAR}})"
                    )
        return value

    @field_validator(*DOMAIN_FIELDS, mode="after")
    @classmethod
    def _domain(cls, value: Domain | None, info: ValidationInfo) -> Domain | None:
        if value is None:
            return value
        cls._applies(info)
        check_bounds(info.field_name, value)
        return value

    @staticmethod
    def _applies(info: ValidationInfo) -> None:
        method = info.data.get("method")
        if method is None or info.field_name in method_params(method):
            return
        takes = ", ".join(method_params(method)) or "no parameters"
        raise ValueError(f"does not apply to method {method} ({method} takes {takes})")

    @property
    def engine_fields(self) -> dict[str, Domain]:
        """The further fields of vLLM's SpeculativeConfig this method's candidates set (see the class)."""
        return dict(self.__pydantic_extra__ or {})

    def _engine_domains(self) -> None:
        extra = self.__pydantic_extra__ or {}
        for name, value in list(extra.items()):
            def refuse(why: str, name: str = name, value: Any = value) -> ValidationError:
                return key_error(type(self).__name__, name, why, value)

            if name == "model":
                raise refuse("give the checkpoints to try as models: [...]")
            if self.method is Method.NONE:
                raise refuse("does not apply to method none (none takes no parameters)")
            if why := engine_field_error(name):
                raise refuse(why)
            try:
                domain = value if isinstance(value, ChoiceDomain) else ChoiceDomain.model_validate(value)
            except ValidationError as e:
                raise refuse(e.errors()[0]["msg"].removeprefix("Value error, ")) from None
            for choice in domain.values():
                if why := engine_field_error(name, choice):
                    raise refuse(why)
            extra[name] = domain

    @model_validator(mode="after")
    def _complete(self) -> MethodSpace:
        self._engine_domains()
        m = self.method
        if m in NEEDS_MODEL and self.models is None:
            raise ValueError(f"method {m} needs models: the draft or head checkpoints to try (a path, a hub name or ${{draft}})")
        if m in NEEDS_K and self.num_speculative_tokens is None:
            raise ValueError(f"method {m} needs num_speculative_tokens")
        self._steps()  # raises when prompt_lookup_min/max cannot be kept in order
        return self

    def edges(self, values: Mapping[str, Any]) -> list[tuple[str, Literal["low", "high"]]]:
        """Where a candidate of this method (its field values) sits on the edge of a tuned range
        that guided search may widen (:data:`EXTENDABLE`, :meth:`IntDomain.widened`): (field, side)."""
        out: list[tuple[str, Literal["low", "high"]]] = []
        for field in EXTENDABLE:
            domain = getattr(self, field)
            if not isinstance(domain, IntDomain) or domain.choices is not None or domain.is_fixed:
                continue
            for side, edge in (("high", domain.high), ("low", domain.low)):
                wider = domain.widened(field, side) if values.get(field) == edge else None  # type: ignore[arg-type]
                if wider is not None and self._adds(field, wider):
                    out.append((field, side))  # type: ignore[arg-type]
        return out

    def _adds(self, field: str, wider: IntDomain) -> bool:
        """Whether ``field`` over ``wider`` gives candidates a value they lack now (the n-gram
        window keeps prompt_lookup_min <= prompt_lookup_max: a wider one may add none)."""
        now = {c.get(field) for c in self._combinations()}
        return bool({c.get(field) for c in self.model_copy(update={field: wider})._combinations()} - now)

    # -- the walk shared by suggest, params_of and enumerate ---------------------------------

    def _steps(self) -> list[_Step]:
        steps: list[_Step] = []
        for name in method_params(self.method):
            if name == "models":
                if self.models:
                    steps.append(("model", choices(self.models), None))
            elif name == "prompt_lookup_max":
                steps.extend(self._lookup_steps())
            elif name != "prompt_lookup_min" and (domain := getattr(self, name)) is not None:
                steps.append((name, domain, None))
        steps.extend((name, domain, None) for name, domain in self.engine_fields.items())
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


