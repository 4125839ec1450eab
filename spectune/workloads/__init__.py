"""Workloads: prompts, sampling and load shape, from files or shipped sets."""

from spectune.workloads._loaders import load_jsonl, load_prompts
from spectune.workloads._types import ChatMessage, Prompt, Sampling, WorkloadSpec

__all__ = ["ChatMessage", "Prompt", "Sampling", "WorkloadSpec", "load_jsonl", "load_prompts"]
