#!/usr/bin/env python
"""The load generator's own overhead with several engines measured at once: one process whose
threads drive every engine (one interpreter lock, every stream chunk parsed under it) against a
load process per engine (:class:`spectune.load.LoadProcess`, what a worker with several slots uses).

Each engine is ``tests/fake_engine.py`` (a real process speaking vLLM's HTTP protocol), which
streams every request's tokens exactly ``--token-ms`` apart. What the client measures between
two tokens beyond that interval is the client's (and the machine's) own delay: the figure is
the median inter-token latency the client saw minus ``--token-ms``, per engine, for 1, 2, 4
... engines at once, each with ``--concurrency`` requests in flight. Rounds alternate the two
ways (A B A B) so that drift touches both.

    .venv/bin/python benchmarks/client_overhead.py                 # 1, 2, 4 engines, 32 in flight each
    .venv/bin/python benchmarks/client_overhead.py --engines 1,2 --requests 32 --rounds 1 --out /tmp/co.json

``--tokenizer DIR`` (a model folder: its tokenizer only) also runs ``vllm bench serve`` against one
engine at the same concurrency, each round, for the same figure from vLLM's own client (its
saved ``median_itl_ms`` and ``p99_itl_ms``).

Writes benchmarks/results/client_overhead.json with the date, the machine (processor and its
features) and versions. Every engine started here is stopped on every path.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
FAKE_ENGINE = REPO / "tests" / "fake_engine.py"


def _drive(servers: list[Any], way: str, prompts: list[Any], workload: Any) -> list[dict[str, float]]:
    """Send ``prompts`` to every server at once, from threads of this process or from a load
    process per server; each server's client-side figures."""
    from spectune.load import LoadProcess, run_load

    results: list[Any] = [None] * len(servers)
    processes = [LoadProcess() for _ in servers] if way == "processes" else []
    with contextlib.ExitStack() as stack:
        for p in processes:
            stack.enter_context(p)
        senders = [p.run_load for p in processes] if processes else [run_load] * len(servers)

        def one(i: int) -> None:
            s = servers[i]
            results[i] = senders[i](s.base_url, s.served_model_name, prompts, workload, api_key=s.api_key)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(servers))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    figures = []
    for res in results:
        ok = [r for r in res.records if r.ok]
        gaps = [g for r in ok for g in r.itl]
        figures.append({"itl_median_ms": statistics.median(gaps) * 1000, "itl_p99_ms": sorted(gaps)[int(0.99 * len(gaps))] * 1000,
                        "tokens_per_s": sum(r.output_tokens or 0 for r in ok) / res.duration, "failed": len(res.records) - len(ok)})
    return figures


def _vllm_bench(server: Any, tokenizer: Path, args: argparse.Namespace, work: Path, r: int) -> dict[str, float]:
    """``vllm bench serve`` against ``server``: random prompts, ``--max-tokens`` each, as many in
    flight as spectune sends; its median and p99 inter-token latency."""
    import subprocess

    from spectune.engines import vllm_cli

    out = work / f"bench-{r}"
    cmd = [*vllm_cli(), "bench", "serve", "--backend", "openai", "--endpoint", "/v1/completions",
           "--base-url", server.base_url, "--model", server.served_model_name, "--tokenizer", str(tokenizer),
           "--dataset-name", "random", "--random-input-len", "16", "--random-output-len", str(args.max_tokens),
           "--ignore-eos", "--num-prompts", str(args.requests), "--max-concurrency", str(args.concurrency),
           "--request-rate", "inf", "--percentile-metrics", "itl", "--metric-percentiles", "50,99", "--disable-tqdm",
           "--save-result", "--result-dir", str(out), "--result-filename", "bench.json"]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600,
                   env={**os.environ, "OPENAI_API_KEY": server.api_key, "TMPDIR": str(work)})
    data = json.loads((out / "bench.json").read_text())
    return {"itl_median_ms": data["median_itl_ms"], "itl_p99_ms": data["p99_itl_ms"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="1,2,4", help="engines measured at once, one run per count")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--requests", type=int, default=96, help="requests per engine per round")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--token-ms", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "client_overhead.json")
    parser.add_argument("--tokenizer", type=Path, help="a model folder: also run vllm bench serve against one engine")
    args = parser.parse_args(argv)
    counts = [int(x) for x in args.engines.split(",")]

    from spectune.config import EngineArgs, Prompt, SpecConfig, WorkloadSpec
    from spectune.engines import Platform, VLLMServer
    from spectune.provenance import hardware, versions

    os.environ.update({"FAKE_ENGINE_BEHAVIOUR": "serve", "FAKE_ENGINE_TOKEN_MS": str(args.token_ms)})
    stand_in = Platform(name="stand-in", serve_command=(sys.executable, str(FAKE_ENGINE), "--model"))
    prompts = [Prompt(id=f"p{i}", text=f"request {i}") for i in range(args.requests)]
    workload = WorkloadSpec(source="stand-in.jsonl", concurrency=args.concurrency, num_prompts=args.requests,
                            sampling={"max_tokens": args.max_tokens})
    rows = []
    with tempfile.TemporaryDirectory(prefix="spectune-client-overhead-") as work, contextlib.ExitStack() as stack:
        servers = [stack.enter_context(VLLMServer(EngineArgs(model=f"stand-in-{i}"), SpecConfig(),
                                                  log_path=Path(work) / f"e{i}.log", platform=stand_in,
                                                  startup_timeout=60)) for i in range(max(counts))]
        for n in counts:
            for r in range(args.rounds):
                for way in ("threads", "processes") if r % 2 == 0 else ("processes", "threads"):
                    figures = _drive(servers[:n], way, prompts, workload)
                    row = {"engines": n, "round": r, "way": way, "per_engine": figures,
                           "overhead_ms": statistics.median(f["itl_median_ms"] for f in figures) - args.token_ms,
                           "itl_p99_ms": max(f["itl_p99_ms"] for f in figures)}
                    rows.append(row)
                    print(f"{n} engine(s), round {r}, {way:9}: median ITL {row['overhead_ms'] + args.token_ms:.2f} ms "
                          f"(overhead {row['overhead_ms']:.2f} ms), worst p99 ITL {row['itl_p99_ms']:.1f} ms", flush=True)
        for r in range(args.rounds if args.tokenizer else 0):
            for way in ("threads", "vllm bench") if r % 2 == 0 else ("vllm bench", "threads"):
                if way == "vllm bench":
                    fig = _vllm_bench(servers[0], args.tokenizer, args, Path(work), r)
                else:
                    fig = _drive(servers[:1], "threads", prompts, workload)[0]
                rows.append({"engines": 1, "round": r, "way": way, "per_engine": [fig],
                             "overhead_ms": fig["itl_median_ms"] - args.token_ms, "itl_p99_ms": fig["itl_p99_ms"]})
                print(f"1 engine, round {r}, {way:10}: median ITL {fig['itl_median_ms']:.2f} ms, "
                      f"p99 {fig['itl_p99_ms']:.1f} ms", flush=True)
    summary = {}
    for n in counts:
        for way in ("threads", "processes", "vllm bench"):
            if same := [r["overhead_ms"] for r in rows if r["engines"] == n and r["way"] == way]:
                summary[f"{n} {way}"] = statistics.median(same)
    print("\nmedian client overhead per token (ms):")
    for key, value in summary.items():
        print(f"  {key:14} {value:6.2f}")
    record = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
              "hardware": hardware().model_dump(), "versions": versions().model_dump(), "summary_ms": summary, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
