"""Typed models of a workload: its prompts (text or chat messages), their sampling, and how they
are sent (concurrency, request rates, a load mix)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from spectune._util import StrictModel

__all__ = ["SHIPPED_NAMES", "ChatMessage", "Prompt", "Sampling", "WorkloadSpec"]

SHIPPED_NAMES: tuple[str, ...] = ("humaneval", "mtbench", "sharegpt")
"""Names that :attr:`WorkloadSpec.source` treats as shipped prompt sets rather than file paths
(their files: :mod:`spectune.workloads`)."""


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
