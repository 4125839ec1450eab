"""Prompt files the workload tests write, and a guard that nothing reaches the network."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path

def conv(*turns: tuple[str, str], **extra: Any) -> dict[str, Any]:
    return {**extra, "conversations": [{"from": f, "value": v} for f, v in turns]}
