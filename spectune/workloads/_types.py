"""Typed workload: prompts, sampling parameters and the load shape."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from spectune._util import StrictModel

__all__ = ["ChatMessage", "Prompt", "Sampling", "WorkloadSpec"]


class ChatMessage(StrictModel):
    role: Literal["system", "user", "assistant"]
    content: str


class Prompt(StrictModel):
    """One request's input: plain text (completions API) or chat messages (chat API)."""

    id: str
    text: str | None = None
    messages: list[ChatMessage] | None = None

    @model_validator(mode="after")
    def _one_of(self) -> Prompt:
        if (self.text is None) == (self.messages is None):
            raise ValueError("a prompt has either text or messages")
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


class WorkloadSpec(StrictModel):
    """Where prompts come from, how many, how they are sent, and at what load."""

    source: str = Field(description="A file (JSONL, ShareGPT JSON, ...) or a shipped set: humaneval, mtbench, sharegpt.")
    format: Literal["auto", "jsonl", "sharegpt", "custom", "spec_bench"] = "auto"
    num_prompts: int | None = Field(default=None, ge=1)
    seed: int = 0
    api: Literal["completions", "chat"] = "completions"
    sampling: Sampling = Field(default_factory=Sampling)
    concurrency: int = Field(default=1, ge=1)
    warmup_requests: int = Field(default=1, ge=0)
    request_timeout: float = Field(default=300.0, gt=0)
