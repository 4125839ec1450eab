"""Typed workload: prompts, sampling parameters and the load shape."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from spectune._util import StrictModel
from spectune.workloads._shipped import SHIPPED_NAMES

__all__ = ["ChatMessage", "Prompt", "Sampling", "WorkloadSpec"]


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
    instead, with ``concurrency`` as the cap on requests in flight.
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
    request_rate: float | None = Field(
        default=None, gt=0, description="Requests per second (Poisson arrivals) instead of a fixed concurrency."
    )
    warmup_requests: int = Field(default=1, ge=0)
    request_timeout: float = Field(default=300.0, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _default_concurrency(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("concurrency_levels") and "concurrency" not in data:
            levels = data["concurrency_levels"]
            if isinstance(levels, list) and levels and isinstance(levels[0], int):
                data = {**data, "concurrency": levels[0]}
        return data

    @model_validator(mode="after")
    def _load_shape(self) -> WorkloadSpec:
        if self.concurrency_levels is not None:
            if any(c < 1 for c in self.concurrency_levels):
                raise ValueError("concurrency_levels: every level must be >= 1")
            if len(set(self.concurrency_levels)) != len(self.concurrency_levels):
                raise ValueError("concurrency_levels: levels must be distinct")
            if self.request_rate is not None:
                raise ValueError("give concurrency_levels or request_rate, not both")
        return self

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
    def levels(self) -> list[int]:
        """The concurrency levels to measure: ``concurrency_levels``, else ``[concurrency]``."""
        return list(self.concurrency_levels) if self.concurrency_levels else [self.concurrency]
