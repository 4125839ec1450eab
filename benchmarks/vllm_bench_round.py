"""One round of ``vllm bench serve`` against a running server: its command line, the process run in a
group of its own and stopped by it, and its per-request results read back as spectune's rows."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any


from spectune.config import WorkloadSpec
from spectune.counters import SpecCounters, parse_counters
from spectune.engines import VLLMServer, summarize_failure, vllm_cli
from spectune.engines._watchdog import group_alive
from spectune.errors import EngineCrashedError, EngineError, SpectuneError

from vllm_bench_report import (  # noqa: E402 - beside this script
    RequestRow,
    RoundResult,
)

_logger = logging.getLogger("compare_vllm_bench")

# Keys of vllm bench's result JSON kept in the report (the per-request arrays are kept apart).
_BENCH_PER_REQUEST = ("input_lens", "output_lens", "ttfts", "latencies", "start_times")
_BENCH_DROPPED = ("itls", "generated_texts", "errors", "queue_times")


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


class BenchToolError(SpectuneError):
    """``vllm bench serve`` failed, timed out, or wrote no usable result."""


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
