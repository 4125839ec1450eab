"""What ``compare_vllm_bench.py`` records and concludes: each round's requests and counters, each tool's
summary, their comparison against the tolerance, the consistency checks and the Markdown report."""

from __future__ import annotations

import datetime as dt
import statistics
from typing import Any, Literal

from pydantic import BaseModel, Field

from spectune.config import EngineArgs, SpecConfig, WorkloadSpec
from spectune.measurement import Hardware, Versions

SCHEMA_VERSION = 1
TOLERANCE = 0.05
"""Each ratio of spectune's figure to vllm bench's should lie within this of 1."""


class Settings(BaseModel):
    """What was asked for, as resolved (model path, spec, load)."""

    model: str
    tiny_dir: str | None
    spec: SpecConfig
    workload: str
    num_prompts: int
    max_tokens: int
    concurrency: int
    rounds: int
    warmup_requests: int
    same_payload: bool
    prefix_caching: Literal["prime", "off"]
    run_timeout_seconds: float
    tolerance: float = TOLERANCE


class RequestRow(BaseModel):
    """One request as a tool saw it (ms)."""

    ttft_ms: float | None
    e2el_ms: float | None
    tpot_ms: float | None
    prompt_tokens: int | None
    output_tokens: int | None
    error: str | None = None


class RoundResult(BaseModel):
    """One tool's run of the prompts in one round."""

    tool: Literal["spectune", "vllm-bench"]
    round: int
    duration_seconds: float
    completed: int
    failed: int
    input_tokens: int
    output_tokens: int
    output_throughput: float = Field(description="Output tokens per second over the run.")
    median_tpot_ms: float | None
    median_ttft_ms: float | None
    median_e2el_ms: float | None
    acceptance_rate: float | None = Field(
        description="Accepted / drafted tokens over the measured window (fraction), from the server's "
        "counters: read by this script around spectune's window, by vllm bench around its own."
    )
    mean_acceptance_length: float | None
    server_generation_tokens: int = Field(
        description="vllm:generation_tokens counted by the server around the tool's run, warm-up included."
    )
    warmup_tokens: int = Field(description="Tokens the warm-up requests inside that count generated.")
    prefix_cache_hit_rate: float | None = Field(
        description="Share of prompt tokens found in vLLM's prefix cache during the tool's run, warm-up included."
    )
    server_mean_tpot_ms: float | None = Field(
        description="The server's own mean TPOT over the tool's requests, warm-up included "
        "(vllm:request_time_per_output_token_seconds): tells the server's speed from the client's view."
    )
    command: list[str] | None = None
    wall_seconds: float = Field(description="Wall time of the whole tool run, start-up included.")
    requests: list[RequestRow]
    tool_result: dict[str, Any] | None = Field(
        default=None, description="vllm bench's result JSON without its per-request arrays."
    )


class ToolSummary(BaseModel):
    """Medians over rounds, with the median absolute deviation (noise between rounds)."""

    rounds: int
    output_throughput: float
    output_throughput_mad: float
    median_tpot_ms: float | None
    median_tpot_mad_ms: float | None
    median_ttft_ms: float | None
    acceptance_rate: float | None
    server_mean_tpot_ms: float | None


class Comparison(BaseModel):
    """spectune / vllm-bench ratios of the medians over rounds."""

    output_throughput_ratio: float | None
    median_tpot_ratio: float | None
    output_throughput_within_tolerance: bool | None
    median_tpot_within_tolerance: bool | None
    noise_output_throughput: float | None = Field(
        description="Largest relative MAD of either tool's throughput over rounds (None with one round)."
    )
    noise_median_tpot: float | None
    server_mean_tpot_ratio: float | None = Field(
        description="The server's own mean TPOT during spectune's runs / during vllm bench's. Far from 1: "
        "the server itself was slower for one tool (machine noise, client CPU), not a measuring difference."
    )


class Report(BaseModel):
    schema_version: int = SCHEMA_VERSION
    started_at: dt.datetime
    finished_at: dt.datetime
    settings: Settings
    engine: EngineArgs = Field(description="Engine arguments as resolved for this platform.")
    workload: WorkloadSpec
    server_command: list[str]
    server_startup_seconds: float
    prompt_ids: list[str]
    versions: Versions
    hardware: Hardware
    rounds: list[RoundResult]
    summary: dict[str, ToolSummary]
    comparison: Comparison
    checks: list[str] = Field(description="Consistency problems between the tools (empty when none).")
    definitions: dict[str, str]


DEFINITIONS = {
    "output_throughput": "sum of completion_tokens (server usage) of successful requests / wall time "
    "from sending the first request to the last request's end; same for both tools.",
    "tpot": "per request (e2el - ttft) / (completion_tokens - 1), requests with >= 2 tokens; median over "
    "requests. Same formula in both tools (vllm/benchmarks/serve.py calculate_metrics). Two client "
    "details differ: vllm bench ends a request's latency at its last chunk that carries choices, "
    "spectune after the stream's end ([DONE], after the usage chunk); vllm bench's TTFT is the first "
    "chunk with choices, spectune's the first chunk with text or token ids.",
    "acceptance_rate": "accepted / draft tokens from the server's Prometheus counters around the measured "
    "window (warm-up excluded): read by this script for spectune, by vllm bench itself for vllm bench "
    "(same counters, same formula; vllm bench reports a percentage, stored here as a fraction).",
    "prefix_caching": "vLLM caches prompt prefixes across requests: with 'prime' every prompt is prefilled "
    "once before round 1, so every window of either tool finds its prompts cached; with 'off' the server "
    "has no prefix cache and every window prefills. Without either, the tool that runs first pays the prefills.",
    "server_mean_tpot_ms": "the server's own per-request (last token time - first token time) / "
    "(tokens - 1), mean over the tool's requests (warm-up included), from vllm:request_time_per_output_token_seconds.",
    "warmup": "each tool's window is preceded by the same warm-up (the first prompt, --warmup times), so "
    "neither starts on a server that sat idle while the other tool started up.",
    "ratio": "spectune / vllm-bench of the median over rounds; 1.0 = identical.",
}


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _mad(xs: list[float]) -> float | None:
    if not xs:
        return None
    m = statistics.median(xs)
    return statistics.median(abs(x - m) for x in xs)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarize_tool(rounds: list[RoundResult]) -> ToolSummary:
    thr = [r.output_throughput for r in rounds]
    tpot = [r.median_tpot_ms for r in rounds if r.median_tpot_ms is not None]
    ttft = [r.median_ttft_ms for r in rounds if r.median_ttft_ms is not None]
    acc = [r.acceptance_rate for r in rounds if r.acceptance_rate is not None]
    srv = [r.server_mean_tpot_ms for r in rounds if r.server_mean_tpot_ms is not None]
    return ToolSummary(
        rounds=len(rounds), output_throughput=statistics.median(thr), output_throughput_mad=_mad(thr) or 0.0,
        median_tpot_ms=_median(tpot), median_tpot_mad_ms=_mad(tpot), median_ttft_ms=_median(ttft),
        acceptance_rate=_median(acc), server_mean_tpot_ms=_median(srv),
    )


def compare(spec_sum: ToolSummary, bench_sum: ToolSummary, tolerance: float) -> Comparison:
    thr = _ratio(spec_sum.output_throughput, bench_sum.output_throughput)
    tpot = _ratio(spec_sum.median_tpot_ms, bench_sum.median_tpot_ms)

    def noise(pairs: list[tuple[float | None, float | None]]) -> float | None:
        rel = [mad / med for mad, med in pairs if mad is not None and med]
        return max(rel) if rel and spec_sum.rounds > 1 else None

    return Comparison(
        output_throughput_ratio=thr, median_tpot_ratio=tpot,
        output_throughput_within_tolerance=None if thr is None else abs(thr - 1) <= tolerance,
        median_tpot_within_tolerance=None if tpot is None else abs(tpot - 1) <= tolerance,
        noise_output_throughput=noise([(spec_sum.output_throughput_mad, spec_sum.output_throughput),
                                       (bench_sum.output_throughput_mad, bench_sum.output_throughput)]),
        server_mean_tpot_ratio=_ratio(spec_sum.server_mean_tpot_ms, bench_sum.server_mean_tpot_ms),
        noise_median_tpot=noise([(spec_sum.median_tpot_mad_ms, spec_sum.median_tpot_ms),
                                 (bench_sum.median_tpot_mad_ms, bench_sum.median_tpot_ms)]),
    )


def consistency_checks(rounds: list[RoundResult], expected_output: int) -> list[str]:
    """Both tools must have sent the same prompts and generated the same number of tokens."""
    out: list[str] = []
    for r in rounds:
        if r.failed:
            out.append(f"{r.tool} round {r.round}: {r.failed} request(s) failed")
        if r.output_tokens != expected_output:
            out.append(f"{r.tool} round {r.round}: {r.output_tokens} output tokens, expected {expected_output}")
        if r.server_generation_tokens - r.warmup_tokens != r.output_tokens:
            out.append(f"{r.tool} round {r.round}: client counted {r.output_tokens} output tokens, "
                       f"server {r.server_generation_tokens - r.warmup_tokens} (warm-up excluded)")
    inputs = {(r.tool, r.input_tokens) for r in rounds if not r.failed}
    if len({n for _, n in inputs}) > 1:
        out.append(f"prompt tokens differ between runs: {sorted(inputs)} (not the same prompts sent?)")
    return out


def _f(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def render(report: Report) -> str:
    lines = [
        f"model {report.settings.model} | spec {report.settings.spec.label()} | {report.settings.workload} "
        f"x{len(report.prompt_ids)} | max_tokens {report.settings.max_tokens} | concurrency "
        f"{report.settings.concurrency} | vLLM {report.versions.vllm}",
        "",
        f"{'tool':<11} {'round':>5} {'dur s':>7} {'out tok/s':>10} {'TPOT p50 ms':>12} {'TTFT p50 ms':>12} "
        f"{'accept':>7} {'srv TPOT':>9} {'out tok':>8} {'in tok':>7}",
    ]
    for r in report.rounds:
        lines.append(
            f"{r.tool:<11} {r.round:>5} {r.duration_seconds:>7.2f} {r.output_throughput:>10.2f} "
            f"{_f(r.median_tpot_ms):>12} {_f(r.median_ttft_ms):>12} {_f(r.acceptance_rate, '.3f'):>7} "
            f"{_f(r.server_mean_tpot_ms):>9} {r.output_tokens:>8} {r.input_tokens:>7}"
        )
    for tool, s in report.summary.items():
        lines.append(
            f"{tool:<11} {'med':>5} {'':>7} {s.output_throughput:>10.2f} {_f(s.median_tpot_ms):>12} "
            f"{_f(s.median_ttft_ms):>12} {_f(s.acceptance_rate, '.3f'):>7} {_f(s.server_mean_tpot_ms):>9}"
        )
    c = report.comparison
    tol = report.settings.tolerance

    def verdict(ratio: float | None, noise: float | None) -> str:
        if ratio is None:
            return "n/a"
        word = "within" if abs(ratio - 1) <= tol else "OUTSIDE"
        extra = "" if noise is None else f"; round-to-round noise {noise:.1%}"
        return f"{ratio:.3f} ({word} {tol:.0%}{extra})"

    lines += [
        "",
        f"ratio spectune / vllm-bench, output throughput: {verdict(c.output_throughput_ratio, c.noise_output_throughput)}",
        f"ratio spectune / vllm-bench, median TPOT:       {verdict(c.median_tpot_ratio, c.noise_median_tpot)}",
        f"server's own mean TPOT, spectune runs / vllm-bench runs: {_f(c.server_mean_tpot_ratio, '.3f')} "
        "(away from 1 = the server itself ran at another speed for one tool, not a measuring difference)",
    ]
    lines += [f"check: {msg}" for msg in report.checks]
    return "\n".join(lines)
