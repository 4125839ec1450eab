"""Speculation and the engine's batch knobs searched jointly, against speculation alone at the
engine's defaults, with the same engine-time budget, on SmolLM2-135M-Instruct and real engines.

For each concurrency level (``--concurrency``, default 1 and 8), two guided studies run with the
same spectune time budget (``--budget``, engine time summed over trials):

- ``alone``: no speculation, n-gram k 2/4 (lookup 2..4) and suffix decoding k 8/16, the engine
  at its defaults (float32 on a CPU without native bfloat16, spectune's CPU defaults);
- ``joint``: the same speculative candidates with ``max_num_seqs`` and
  ``max_num_batched_tokens`` as engine knobs (``--knobs``), which Optuna's sampler chooses.

Each study's choice (what ``spectune export`` would write), its throughput, its speedup over its
own baseline and the engine time and trials it spent are written to
``benchmarks/results/serving_knobs.json`` with the machine and its processor's features::

    .venv/bin/python benchmarks/serving_knobs.py                 # about 35 min on 2 cores
    .venv/bin/python benchmarks/serving_knobs.py --concurrency 8 --budget 6m
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DEFAULT_OUTPUT = REPO / "benchmarks" / "results" / "serving_knobs.json"
SPEC_METHODS = {
    "none": {},
    "ngram": {"num_speculative_tokens": [2, 4], "prompt_lookup_max": 4, "prompt_lookup_min": 2},
    "suffix": {"requires": ["arctic_inference"], "num_speculative_tokens": [8, 16]},
}
DEFAULT_KNOBS = {"max_num_seqs": [128, 4, 16], "max_num_batched_tokens": [2048, 512, 8192]}
"""First values: vLLM's defaults for an API server on a CPU (a study's baseline runs at them)."""


def _study(work: Path, target: str, concurrency: int, name: str, knobs: dict[str, Any] | None,
           budget: str, prompts: int, max_tokens: int) -> dict[str, Any]:
    from spectune.results import open_study
    from spectune.study import load_study_config
    from spectune.worker import run_study

    space = {"description": f"serving_knobs benchmark: {name}", "methods": SPEC_METHODS,
             **({"engine": knobs} if knobs else {})}
    (work / f"{name}.yaml").write_text(yaml.safe_dump(space, sort_keys=False))
    config = load_study_config(None, {
        "target": target, "space": str(work / f"{name}.yaml"), "storage": f"sqlite:///{work / 'studies.db'}",
        "study_name": name, "trials": 20, "time_budget": budget, "log_dir": str(work / "logs"),
        "workload": "humaneval"})
    config = config.model_copy(update={"workload": config.workload.model_copy(update={
        "num_prompts": prompts, "concurrency": concurrency, "sampling": config.workload.sampling.model_copy(
            update={"max_tokens": max_tokens, "temperature": 0.0})})})
    print(f"{name}: concurrency {concurrency}, budget {budget}", file=sys.stderr, flush=True)
    run_study(config, progress=lambda e: e.kind == "trial_end" and print(
        f"  {e.number} {e.state} {e.label} {e.values or e.reason}", file=sys.stderr, flush=True))
    view = open_study(config.storage, name)
    choice = view.best()
    ran = [r for r in view.rows if r.duplicate_of is None and r.state in ("COMPLETE", "FAIL")]
    seconds = sum((t.datetime_complete - t.datetime_start).total_seconds() for t in view.study.trials
                  if t.datetime_complete and t.datetime_start)
    return {"study": name, "concurrency": concurrency, "knobs": knobs, "chosen": choice.row.label,
            "value": choice.value, "speedup": choice.speedup, "reason": choice.reason,
            "engine_seconds": round(seconds, 1), "trials": len(ran),
            "measured": [{"config": r.label, "value": (r.values or [None])[0], "state": r.state} for r in ran]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, action="append", help="levels (default 1 and 8)")
    parser.add_argument("--budget", default="8m", help="spectune time budget of each study (default 8m)")
    parser.add_argument("--knobs", type=json.loads, default=DEFAULT_KNOBS, help="the joint study's engine knobs (JSON)")
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args()

    from spectune.checkpoints import prepare_smollm2
    from spectune.provenance import hardware, versions

    target = str(prepare_smollm2())
    levels = args.concurrency or [1, 8]
    work = Path(tempfile.mkdtemp(prefix="spectune-serving-"))
    try:
        runs = []
        for c in levels:
            prompts = max(8, 2 * c)  # two windows of at least c requests each
            runs.append(_study(work, target, c, f"alone-c{c}", None, args.budget, prompts, args.max_tokens))
            runs.append(_study(work, target, c, f"joint-c{c}", args.knobs, args.budget, prompts, args.max_tokens))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = {"measured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
           "command": "benchmarks/serving_knobs.py " + " ".join(sys.argv[1:]), "model": "SmolLM2-135M-Instruct",
           "budget": args.budget, "runs": runs, "comparison": [
               {"concurrency": c, "alone": a["value"], "joint": j["value"], "joint_over_alone": j["value"] / a["value"],
                "alone_chosen": a["chosen"], "joint_chosen": j["chosen"]}
               for c in levels for a in runs for j in runs
               if a["study"] == f"alone-c{c}" and j["study"] == f"joint-c{c}"],
           "hardware": hardware().model_dump(), "versions": versions().model_dump()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    for row in out["comparison"]:
        print(f"concurrency {row['concurrency']}: alone {row['alone']:.4g} tok/s ({row['alone_chosen']}), "
              f"joint {row['joint']:.4g} tok/s ({row['joint_chosen']}): {row['joint_over_alone']:.3f}x")
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
