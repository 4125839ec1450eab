"""EAGLE-3 heads on real engines: acceptance per k, the replay's error, and speed against the
baseline, the draft and the model-free proposers.

For the tiny target (``spectune models build-tiny``, head included) or SmolLM2-135M-Instruct
(``--smollm2``: ``models prepare smollm2``, ``smollm2-draft`` and ``smollm2-eagle3``, each built
once), on the same prompts at temperature 0 in float32 (where speculation leaves the outputs
alone, so the replay can be scored against the engine):

1. one engine start per configuration and ``--starts`` pass: ``none``, the draft at ``--k``,
   n-gram and suffix at ``--k``, and the head at every k of ``--head-ks``; or, with
   ``--landscape FILE``, no engine: every start a recorded landscape holds (``tiny_heads.json``);
2. the head replayed offline once along the first head run's outputs
   (:func:`spectune.predict.head_chains`), and for each k its mean acceptance length and
   acceptance per position beside vLLM's counters;
3. writes ``--output`` (default ``benchmarks/results/heads_<target>.json``): settings, the
   head's marker (build time), the processor's features, every run, the replay's errors.

    python benchmarks/heads.py                      # tiny target, about 15 minutes on 2 cores
    python benchmarks/heads.py --smollm2 --head-ks 1,2,3,4,6,8
    python benchmarks/heads.py --landscape benchmarks/landscapes/tiny_heads.json   # no engine
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def _ks(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _from_landscape(args: argparse.Namespace) -> tuple[dict[str, list[Any]], str, str, str, int | None]:
    """Every recorded start of a landscape, by candidate label; its models where this machine has them."""
    from spectune.landscape import Landscape

    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_common import models_here

    landscape = models_here(Landscape.load(args.landscape))
    runs = {starts[0].label: [p.measurement for p in starts if p.measurement is not None]
            for starts in landscape.engines().values()}
    runs = {label: ms for label, ms in runs.items() if ms}
    head = next(m[0].spec.model for m in runs.values() if str(m[0].spec.method) == "eagle3")
    first = next(iter(runs.values()))[0]
    return runs, landscape.target, str(head), args.landscape.stem, first.engine.max_model_len


def _from_engines(args: argparse.Namespace) -> tuple[dict[str, list[Any]], str, str, str, int | None]:
    """One engine start per configuration and pass."""
    from spectune.checkpoints import build_tiny, default_cache_dir
    from spectune.config import EngineArgs, SpecConfig, WorkloadSpec
    from spectune.trial import measure
    from spectune.workloads import load_prompts

    if args.smollm2:
        from spectune.checkpoints import build_smollm2_draft, build_smollm2_eagle3, prepare_smollm2

        target, draft, head, name = prepare_smollm2(), build_smollm2_draft(), build_smollm2_eagle3(), "smollm2"
    else:
        models = build_tiny(args.models or default_cache_dir() / "tiny")
        target, draft, head, name = models.target, models.draft, models.eagle3, "tiny"
    wl = WorkloadSpec.model_validate({"source": args.prompts, "num_prompts": args.num_prompts,
                                      "sampling": {"max_tokens": args.max_tokens, "temperature": 0.0}})
    prompts = load_prompts(wl)
    engine = EngineArgs(model=str(target), dtype="float32", max_model_len=1024, kv_cache_memory_bytes=256 * 2**20)
    specs: dict[str, dict[str, Any]] = {
        "none": {}, "draft": {"method": "draft_model", "model": str(draft), "num_speculative_tokens": args.k},
        "ngram": {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_min": 1, "prompt_lookup_max": 4},
        "suffix": {"method": "suffix", "num_speculative_tokens": args.k},
    }
    configs = {c: specs[c] for c in args.configs.split(",") if c}
    configs.update({f"eagle3 k={k}": {"method": "eagle3", "model": str(head), "num_speculative_tokens": k}
                    for k in args.head_ks})
    runs: dict[str, list[Any]] = {c: [] for c in configs}
    work = Path(tempfile.mkdtemp(prefix="spectune-heads-"))
    try:
        for i in range(args.starts):
            for label, spec in configs.items():
                print(f"pass {i + 1}/{args.starts}: {label}", file=sys.stderr, flush=True)
                runs[label].append(measure(engine, SpecConfig.model_validate(spec), wl, prompts,
                                           log_dir=work / "logs", startup_timeout=600))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return runs, str(target), str(head), name, engine.max_model_len


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smollm2", action="store_true", help="SmolLM2-135M-Instruct instead of the tiny target")
    p.add_argument("--models", type=Path, default=None, help="tiny models' folder (default: the cache's)")
    p.add_argument("--prompts", default="humaneval")
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--k", type=int, default=3, help="k of the draft, n-gram and suffix")
    p.add_argument("--head-ks", type=_ks, default=_ks("1-8"))
    p.add_argument("--configs", default="none,draft,ngram,suffix")
    p.add_argument("--starts", type=int, default=1, help="engine starts per configuration")
    p.add_argument("--landscape", type=Path, default=None, help="read the runs from a recorded landscape")
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args()

    sys.path.insert(0, str(REPO))
    from spectune.checkpoints import HEAD_MARKER
    from spectune.predict import head_chains, replay_head

    started = dt.datetime.now(dt.timezone.utc)
    if args.landscape is not None:
        runs, target, head, name, max_len = _from_landscape(args)
        output = args.output or REPO / "benchmarks" / "results" / f"heads_{args.landscape.stem}.json"
    else:
        runs, target, head, name, max_len = _from_engines(args)
        output = args.output or REPO / "benchmarks" / "results" / f"heads_{name}.json"
    heads = sorted((m[0].spec.num_speculative_tokens or 0, label) for label, m in runs.items()
                   if m and str(m[0].spec.method) == "eagle3")
    first = runs[heads[0][1]][0]
    chains = head_chains(first.requests, str(head), str(target), dtype=first.engine.dtype, depth=max(k for k, _ in heads))
    base = statistics.mean(m.output_throughput for m in runs["none"]) if runs.get("none") else None
    rows: dict[str, Any] = {}
    for label, ms in runs.items():
        acc = [m.acceptance for m in ms if m.acceptance]
        tput = statistics.mean(m.output_throughput for m in ms)
        row: dict[str, Any] = {
            "output_throughput": [round(m.output_throughput, 1) for m in ms],
            "speedup_vs_none": round(tput / base, 3) if base else None,
            "mean_acceptance_length": [round(a.mean_acceptance_length, 4) for a in acc],
            "acceptance_per_position": [[round(x, 4) for x in a.per_position] for a in acc],
        }
        spec = ms[0].spec
        if str(spec.method) == "eagle3" and acc:
            rep = replay_head(chains, spec.num_speculative_tokens or 1, max_model_len=max_len)
            predicted = rep.profile()
            row["replay"] = {"mean_acceptance_length": round(predicted.mean_acceptance_length, 4),
                             "per_position": [round(x, 4) for x in predicted.per_position],
                             "error": round(predicted.mean_acceptance_length
                                            / statistics.fmean(a.mean_acceptance_length for a in acc) - 1, 4)}
        row["method"] = str(spec.method)
        rows[label] = row
        print(f"{label:14} {tput:8.1f} tok/s  {row['speedup_vs_none'] or '-':>6}x  "
              f"acc.len {row['mean_acceptance_length'][:1]}  replay {row.get('replay', {}).get('error', '-')}")
    best = {}
    for method in ("none", "draft_model", "ngram", "suffix", "eagle3"):
        found = [(r["speedup_vs_none"], label) for label, r in rows.items() if r["method"] == method]
        if found and base:
            speedup, label = max(found)
            best[method] = {"label": label, "speedup_vs_none": speedup,
                            "mean_acceptance_length": rows[label]["mean_acceptance_length"][:1]}
    print("best of each proposer: " + "; ".join(f"{m} {b['label']} {b['speedup_vs_none']}x" for m, b in best.items()))
    report = {
        "schema_version": 1, "best_per_proposer": best, "started_at": started.isoformat(), "finished_at": dt.datetime.now(dt.timezone.utc).isoformat(),
        "settings": {"target": name, "landscape": str(args.landscape) if args.landscape else None,
                     "workload": first.workload.model_dump(mode="json"), "dtype": first.engine.dtype,
                     "starts": max(len(m) for m in runs.values())},
        "head_marker": json.loads((Path(head) / HEAD_MARKER).read_text(encoding="utf-8"))
        if (Path(head) / HEAD_MARKER).is_file() else None,
        "hardware": first.hardware.model_dump(mode="json") if first.hardware else None,
        "versions": first.versions.model_dump(mode="json") if first.versions else None, "runs": rows,
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {output}", file=sys.stderr)


if __name__ == "__main__":
    main()
