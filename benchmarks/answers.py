"""Same answers: the figures behind spectune's answer check (``benchmarks/RESULTS.md``, "Same answers").

    python benchmarks/answers.py landscapes   # identical share by method and dtype, every stored landscape (no engine)
    python benchmarks/answers.py margins      # the rounding margins, and what asking for them costs (2 engine starts)
    python benchmarks/answers.py study        # a bfloat16 SmolLM2 demo study, its answers classified, and
                                              # spectune verify on its fastest speculative configuration

``margins`` serves SmolLM2-135M-Instruct's baseline in float32 and in bfloat16 (one engine each),
sends HumanEval prompts once timed (no log-probabilities) and twice more with them, at
concurrency 1 and at concurrency 8, and sets the margins (the log-probability of each
position's most likely token less the second's) of two numeric paths side by side where their
answers still agree: float32 at 1 against float32 at 8 (another batch shape), bfloat16 against
float32, bfloat16 at 1 against bfloat16 at 8. How far a margin moves between paths is how far
rounding moves it: its 99th percentile is the dtype's rounding margin
(:data:`spectune.answers.ROUNDING_MARGIN`). Each part writes its key of
``benchmarks/results/answers.json`` with the date and the machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench_common import workdir  # noqa: E402

from spectune._util import atomic_write_text  # noqa: E402

OUTPUT = REPO / "benchmarks" / "results" / "answers.json"
LANDSCAPES = REPO / "benchmarks" / "landscapes"


def _machine() -> dict[str, Any]:
    from spectune.provenance import hardware, versions

    return {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "hardware": hardware().model_dump(), "versions": versions().model_dump()}


def _save(key: str, value: dict[str, Any]) -> None:
    data = json.loads(OUTPUT.read_text()) if OUTPUT.is_file() else {}
    data[key] = {**_machine(), **value}
    atomic_write_text(OUTPUT, json.dumps(data, indent=1) + "\n")
    print(json.dumps(value, indent=1)[:4000])


# -- landscapes: identical share by method and dtype ---------------------------------------------


def _first_differences(base: Any, m: Any) -> list[int]:
    """Where each of ``m``'s answers that differs first leaves ``base``'s (output token)."""
    ref = {r.prompt_id: r.token_ids for r in base.requests if r.ok and r.token_ids is not None}
    out = []
    for r in m.requests:
        if r.ok and r.token_ids is not None and (a := ref.get(r.prompt_id)) is not None and a != r.token_ids:
            out.append(next((i for i, (x, y) in enumerate(zip(a, r.token_ids, strict=False)) if x != y),
                            min(len(a), len(r.token_ids))))
    return out


def landscapes(_: argparse.Namespace) -> None:
    """Every stored landscape's speculative points against its baseline's first start."""
    from spectune.answers import compare
    from spectune.landscape import Landscape

    out: dict[str, Any] = {}
    for path in sorted(LANDSCAPES.glob("*.json")):
        land = Landscape.load(path)
        bases = [p.measurement for p in land.points if p.label == "none" and p.measurement is not None]
        if not bases:
            continue
        by_method: dict[str, list[Any]] = {}
        for p in land.points:
            if p.measurement is None or p.measurement is bases[0]:
                continue
            if (f := compare(bases[0], p.measurement)) is not None:
                counts = by_method.setdefault("baseline again" if p.label == "none" else p.spec["method"], [0, 0, []])
                counts[0] += f.identical
                counts[1] += f.compared
                counts[2] += _first_differences(bases[0], p.measurement)
        dtype = bases[0].engine.dtype
        out[path.stem] = {"dtype": dtype, "cpu": bases[0].hardware.cpu, "methods": {
            m: {"identical": i, "compared": n, "share": round(i / n, 3),
                "first_difference_median": statistics.median(firsts) if firsts else None}
            for m, (i, n, firsts) in sorted(by_method.items())}}
    _save("landscapes", {"landscapes": out})


# -- margins: how far rounding moves a margin, and what asking costs ------------------------------


def _paths_agree(a: dict[str, Any], b: dict[str, Any]) -> list[float]:
    """|margin a - margin b| at each position where both answers agree up to and with it."""
    moves = []
    for pid in a.keys() & b.keys():
        ta, tb = a[pid]["token_ids"], b[pid]["token_ids"]
        for i, (x, y) in enumerate(zip(ta, tb, strict=False)):
            if x != y:
                break
            ma, mb = a[pid]["margins"][i], b[pid]["margins"][i]
            if ma is not None and mb is not None:
                moves.append(abs(ma - mb))
    return moves


def _quantiles(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    q = statistics.quantiles(xs, n=1000, method="inclusive")
    return {"positions": len(xs), "median": round(statistics.median(xs), 6), "p90": round(q[899], 6),
            "p99": round(q[989], 6), "p999": round(q[998], 6), "max": round(xs[-1], 6)}


def margins(args: argparse.Namespace) -> None:
    import time

    from spectune.checkpoints import prepare_smollm2
    from spectune.config import EngineArgs, SpecConfig, WorkloadSpec
    from spectune.engines import VLLMServer
    from spectune.load import run_load
    from spectune.workloads import load_prompts

    target = str(prepare_smollm2())
    workload = WorkloadSpec(source="humaneval", num_prompts=args.prompts, seed=0, concurrency=8,
                            sampling={"temperature": 0.0, "max_tokens": args.max_tokens})
    prompts = load_prompts(workload)
    runs: dict[str, dict[str, Any]] = {}
    costs: dict[str, Any] = {}
    with workdir() as tmp:
        for dtype in ("float32", "bfloat16"):
            engine = EngineArgs(model=target, dtype=dtype, max_model_len=1024)
            with VLLMServer(engine, SpecConfig(method="none"), log_path=tmp / f"{dtype}.log", startup_timeout=600) as server:
                def send(concurrency: int, logprobs: int | None) -> tuple[float, Any]:
                    t0 = time.perf_counter()
                    res = run_load(server.base_url, server.served_model_name, prompts, workload, concurrency=concurrency,
                                   api_key=server.api_key, logprobs=logprobs)
                    return time.perf_counter() - t0, res

                send(8, None)  # warm-up
                timed, _ = send(8, None)
                for c in (1, 8):
                    seconds, res = send(c, 2)
                    runs[f"{dtype} c{c}"] = {r.prompt_id: {"token_ids": r.token_ids, "margins": r.margins}
                                             for r in res.records if r.ok and r.margins is not None}
                    if c == 8:
                        costs[dtype] = {"timed_seconds": round(timed, 3), "with_logprobs_seconds": round(seconds, 3),
                                        "cost": round(seconds / timed - 1.0, 3)}
    pairs = {"float32 c1 vs float32 c8": ("float32 c1", "float32 c8"),
             "bfloat16 c8 vs float32 c8": ("bfloat16 c8", "float32 c8"),
             "bfloat16 c1 vs bfloat16 c8": ("bfloat16 c1", "bfloat16 c8")}
    moves = {name: _quantiles(_paths_agree(runs[a], runs[b])) for name, (a, b) in pairs.items()}
    every = [m for run in runs.values() for answer in run.values() for m in answer["margins"] if m is not None]
    _save("margins", {"model": "SmolLM2-135M-Instruct", "prompts": len(prompts), "max_tokens": args.max_tokens,
                      "moves": moves, "logprobs_cost": costs,
                      "margins_below": {f"{t:g}": round(sum(m <= t for m in every) / len(every), 4)
                                        for t in (0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)}})


# -- study: a bfloat16 demo study, its answers classified ----------------------------------------


def study(args: argparse.Namespace) -> None:
    import time

    from spectune.checkpoints import prepare_smollm2
    from spectune.export import export_best
    from spectune.results import open_study
    from spectune.verify import verify
    from spectune.study import CLEAR, load_study_config
    from spectune.worker import run_study

    target = str(prepare_smollm2())
    with workdir() as tmp:
        space = None
        if args.narrow:  # the demo space's fastest n-gram and suffix candidates alone
            space = tmp / "space.yaml"
            space.write_text("methods:\n  none: {}\n  ngram: {num_speculative_tokens: 6, prompt_lookup_max: 3, "
                             "prompt_lookup_min: 2}\n  suffix: {requires: [arctic_inference], num_speculative_tokens: 16}\n")
        config = load_study_config(REPO / "examples" / "demo.yaml", {
            "target": target, "storage": f"sqlite:///{tmp / 'answers.db'}", "study_name": "answers-bf16",
            "engine.dtype": args.dtype, "sampler": "grid", "trials": 3 if args.narrow else args.trials,
            "time_budget": CLEAR, "log_dir": str(tmp / "logs"), "space": str(space) if space else None,
            "workload.num_prompts": args.prompts, "workload.sampling": {"temperature": 0.0, "max_tokens": args.max_tokens}})
        t0 = time.perf_counter()
        run_study(config)
        view = open_study(config.storage, "answers-bf16")
        base = view.baseline()
        m = view.store.measurement(base.trial_id) if base else None
        trials = [{"config": r.label, "speedup": r.speedup, "fidelity": r.fidelity, "feasible": r.feasible,
                   "broken": list(r.broken)} for r in view.complete() if not r.is_baseline]
        choice = view.best()
        # spectune verify on the fastest speculative configuration, exported as a team that deploys it would
        fastest = max((r for r in view.complete() if not r.is_baseline), key=lambda r: r.values[0], default=None)
        verdict = None
        if fastest is not None:
            out = export_best(view, tmp / "best.yaml", trial=fastest.number)
            verdict = verify(out.path, log_dir=tmp / "logs").record()
        _save(f"study_{args.dtype}" + ("_narrow" if args.narrow else ""), {
            "prompts": args.prompts, "max_tokens": args.max_tokens,
            "engine_seconds": round(time.perf_counter() - t0, 1), "trials": trials,
            "margins_cost": {"seconds": m.answer_margins.seconds, "window_seconds": m.answer_margins.window_seconds}
            if m is not None and m.answer_margins is not None else None,
            "pick": choice.row.label, "reason": choice.reason, "verify": verdict})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="part", required=True)
    sub.add_parser("landscapes").set_defaults(run=landscapes)
    p = sub.add_parser("margins")
    p.add_argument("--prompts", type=int, default=40)
    p.add_argument("--max-tokens", type=int, default=96)
    p.set_defaults(run=margins)
    p = sub.add_parser("study")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--trials", type=int, default=9, help="the demo space's candidates without a draft")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=40)
    p.add_argument("--narrow", action="store_true", help="none, n-gram k=6 lookup 2..3 and suffix k=16 alone")
    p.set_defaults(run=study)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
