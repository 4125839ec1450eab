"""Prompt loaders, one per file format; every error names the file and line."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from spectune._util import describe_validation_error
from spectune.errors import ConfigError
from spectune.workloads._types import ChatMessage, Prompt, WorkloadSpec

__all__ = ["load_jsonl", "load_prompts"]


def _prompt_from_record(record: Any, ident: str, where: str) -> Prompt:
    if not isinstance(record, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(record).__name__}")
    try:
        if "messages" in record:
            return Prompt(id=ident, messages=[ChatMessage.model_validate(m) for m in record["messages"]])
        if "prompt" in record:
            if not isinstance(record["prompt"], str) or not record["prompt"]:
                raise ConfigError(f"{where}: 'prompt' must be a non-empty string")
            return Prompt(id=ident, text=record["prompt"])
    except ValidationError as e:
        raise ConfigError(describe_validation_error(e, where)) from e
    raise ConfigError(f"{where}: a record needs 'prompt' or 'messages'")


def load_jsonl(path: Path) -> list[Prompt]:
    """JSONL, one object a line with ``prompt`` (text) or ``messages`` (chat)."""
    prompts: list[Prompt] = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from e
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{where}: invalid JSON: {e.msg}") from e
        prompts.append(_prompt_from_record(record, str(record.get("id", n)) if isinstance(record, dict) else str(n), where))
    return prompts


def select(prompts: list[Prompt], num_prompts: int | None, seed: int, source: str) -> list[Prompt]:
    """``num_prompts`` of ``prompts`` chosen with ``seed`` (all, in order, when None)."""
    if not prompts:
        raise ConfigError(f"{source}: no prompts")
    if num_prompts is None or num_prompts >= len(prompts):
        return list(prompts)
    rng = random.Random(seed)
    idx = sorted(rng.sample(range(len(prompts)), num_prompts))
    return [prompts[i] for i in idx]


def load_prompts(spec: WorkloadSpec) -> list[Prompt]:
    """The prompts ``spec`` selects."""
    path = Path(spec.source)
    if not path.exists():
        raise ConfigError(f"{spec.source}: no such file")
    prompts = load_jsonl(path)
    return select(prompts, spec.num_prompts, spec.seed, spec.source)
