"""Result files in the form ``vllm bench serve --save-result`` writes them, made from spectune's own
measurements (the tests of ``spectune import`` that do not run vllm bench itself)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from spectune.measurement import Measurement


def bench_result(m: Measurement, *, model: str | None = None, **extra: Any) -> dict[str, Any]:
    """What vllm bench serve would have saved for ``m``'s window, with its speculative config as
    ``--metadata speculative_config=...`` saves it (a string)."""
    out: dict[str, Any] = {
        "date": "20261201-120000", "backend": "openai", "model_id": model or m.engine.model,
        "tokenizer_id": m.engine.model, "num_prompts": m.num_requests, "request_rate": "inf",
        "burstiness": 1.0, "max_concurrency": m.concurrency, "duration": m.duration_seconds,
        "completed": m.num_requests - m.num_failed, "failed": m.num_failed, "total_input_tokens": m.input_tokens,
        "total_output_tokens": m.output_tokens, "request_throughput": m.request_throughput,
        "output_throughput": m.output_throughput, "total_token_throughput": m.total_token_throughput,
    }
    for name, stats in (("ttft", m.ttft_ms), ("tpot", m.tpot_ms), ("itl", m.itl_ms), ("e2el", m.e2el_ms)):
        out.update({f"mean_{name}_ms": stats.mean, f"median_{name}_ms": stats.median, f"p99_{name}_ms": stats.p99})
    if (a := m.acceptance) is not None:
        out.update({"spec_decode_acceptance_rate": a.acceptance_rate * 100, "spec_decode_acceptance_length":
                    a.mean_acceptance_length, "spec_decode_num_drafts": a.num_drafts,
                    "spec_decode_draft_tokens": a.num_draft_tokens, "spec_decode_accepted_tokens": a.num_accepted_tokens,
                    "spec_decode_per_position_acceptance_rates": a.per_position})
    if not m.spec.is_baseline:
        out["speculative_config"] = json.dumps(m.spec.to_vllm())
    return {**out, **extra}


def write_result(folder: Path, name: str, data: dict[str, Any]) -> Path:
    path = folder / name
    path.write_text(json.dumps(data, indent=2))
    return path
