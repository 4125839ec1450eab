"""Time the README's main job (`scripts/demo.sh`) from a cold cache, as a new user runs it.

Runs ``scripts/demo.sh`` with a fresh ``SPECTUNE_CACHE`` (so SmolLM2 is prepared and its draft
built from scratch) and a fresh SQLite storage, in a temporary folder that is removed after;
the venv must exist (``make setup``). Writes ``benchmarks/results/demo_time.json``: the total
wall time, the draft's own build time (from its marker file), each trial's wall time, state
and value (from the study's storage), the exported choice, and the machine.

    .venv/bin/python benchmarks/time_demo.py            # ~10-15 min on 2 cores
    .venv/bin/python benchmarks/time_demo.py --no-draft
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DEFAULT_OUTPUT = REPO / "benchmarks" / "results" / "demo_time.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-draft", action="store_true", help="SPECTUNE_NO_DRAFT=1: without the draft")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args()

    from spectune.provenance import hardware
    from spectune.results import open_study

    work = Path(tempfile.mkdtemp(prefix="spectune-demo-"))
    try:
        url = f"sqlite:///{work / 'demo.db'}"
        env = {**os.environ, "SPECTUNE_CACHE": str(work / "cache"), "SPECTUNE_STORAGE": url}
        if args.no_draft:
            env["SPECTUNE_NO_DRAFT"] = "1"
        env.pop("SPECTUNE_DRAFT", None)
        t0 = time.monotonic()
        proc = subprocess.run(["scripts/demo.sh"], cwd=REPO, env=env, capture_output=True, text=True, check=False)
        total = time.monotonic() - t0
        if proc.returncode != 0:
            raise SystemExit(f"scripts/demo.sh failed ({proc.returncode}): {proc.stderr[-2000:]}")
        view = open_study(url, "demo-smollm2-humaneval")
        trials = [{"number": t.number, "config": t.user_attrs.get("config"), "state": t.state.name,
                   "value": t.values[0] if t.values else None,
                   "predicted": t.user_attrs.get("predicted_output_throughput"),
                   "seconds": (t.datetime_complete - t.datetime_start).total_seconds()
                   if t.datetime_complete and t.datetime_start else None}
                  for t in view.study.trials]
        choice = view.best()
        draft_marker = next((work / "cache" / "models").glob("*-draft/spectune-draft.json"), None)
        draft = json.loads(draft_marker.read_text()) if draft_marker else None
        out = {
            "measured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "command": "scripts/demo.sh" + (" (SPECTUNE_NO_DRAFT=1)" if args.no_draft else ""),
            "total_seconds": round(total, 1),
            "draft_build_seconds": draft.get("build_seconds") if draft else None,
            "trials": trials,
            "trial_seconds": round(sum(t["seconds"] or 0 for t in trials), 1),
            "skipped_by_guided_search": len((view.study.user_attrs.get("guide") or {}).get("skipped") or []),
            "best": {"config": choice.row.label, "speedup": choice.speedup, "reason": choice.reason},
            "hardware": hardware().model_dump(),
            "stdout_tail": proc.stdout[-1500:],
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"demo: {out['total_seconds']:.0f} s in all (draft build {out['draft_build_seconds']} s), "
          f"{len(trials)} trials ({out['trial_seconds']:.0f} s); best {choice.row.label}: {choice.reason}")
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
