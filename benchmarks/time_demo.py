"""Time the README's main job (`scripts/demo.sh`) from a cold cache, as a new user runs it.

Runs ``scripts/demo.sh`` (``--draft`` passes it on) with a fresh ``SPECTUNE_CACHE`` (so SmolLM2
is prepared from scratch, and the draft built) and a fresh SQLite storage, in a temporary folder
that is removed after; the venv must exist (``make setup``). Its standard error is a pipe, so
every phase is a line with its elapsed time, kept here. Writes
``benchmarks/results/demo_time.json``: the total wall time, each phase line, each trial's wall
time, state, prediction and value (from the study's storage), the exported choice, whether it is
decided (a speedup whose noise band excludes 1.0x, or the baseline with a band under 5 %), and
the machine with its processor's features.

    .venv/bin/python benchmarks/time_demo.py            # ~8 min on 2 cores
    .venv/bin/python benchmarks/time_demo.py --draft --out benchmarks/results/demo_time_draft.json
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
DECIDED_BAND = 0.05
"""A baseline choice is decided when its noise band is narrower than this."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draft", action="store_true", help="scripts/demo.sh --draft: with the distilled draft")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args()

    from spectune.provenance import hardware
    from spectune.records import StudyRecord, TrialRecord
    from spectune.results import open_study

    work = Path(tempfile.mkdtemp(prefix="spectune-demo-"))
    study_name = "demo-smollm2-humaneval" + ("-draft" if args.draft else "")
    try:
        url = f"sqlite:///{work / 'demo.db'}"
        env = {**os.environ, "SPECTUNE_CACHE": str(work / "cache"), "SPECTUNE_STORAGE": url}
        env.pop("SPECTUNE_DRAFT", None)
        t0 = time.monotonic()
        proc = subprocess.run(["scripts/demo.sh", *(["--draft"] if args.draft else [])], cwd=REPO, env=env,
                              capture_output=True, text=True, check=False)
        total = time.monotonic() - t0
        if proc.returncode != 0:
            raise SystemExit(f"scripts/demo.sh failed ({proc.returncode}): {proc.stderr[-2000:]}")
        view = open_study(url, study_name)
        trials = []
        for t in view.study.trials:
            rec = TrialRecord.of(t)
            trials.append({"number": t.number, "config": rec.config, "state": t.state.name,
                           "value": t.values[0] if t.values else None, "predicted": rec.predicted,
                           "noise": rec.noise, "why": rec.guide_reason or rec.recheck or rec.role,
                           "seconds": (t.datetime_complete - t.datetime_start).total_seconds()
                           if t.datetime_complete and t.datetime_start else None})
        choice = view.best()
        decided = (choice.noise_band < DECIDED_BAND if choice.is_baseline
                   else choice.speedup is not None and choice.speedup - 1.0 > choice.noise_band)
        draft_marker = next((work / "cache" / "models").glob("*-draft/spectune-draft.json"), None)
        draft = json.loads(draft_marker.read_text()) if draft_marker else None
        out = {
            "measured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "command": "scripts/demo.sh" + (" --draft" if args.draft else ""),
            "total_seconds": round(total, 1),
            "draft_build_seconds": draft.get("build_seconds") if draft else None,
            "time_budget_seconds": (StudyRecord.of(view.study).spectune_config or {}).get("time_budget"),
            "phases": [line for line in proc.stderr.splitlines() if line.rstrip().endswith("]")],
            "trials": trials,
            "trial_seconds": round(sum(t["seconds"] or 0 for t in trials), 1),
            "skipped_by_guided_search": len((StudyRecord.of(view.study).guide or {}).get("skipped") or []),
            "best": {"config": choice.row.label, "speedup": choice.speedup, "noise_band": choice.noise_band,
                     "reason": choice.reason, "decided": decided},
            "hardware": hardware().model_dump(),
            "stdout_tail": proc.stdout[-3000:],
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"demo: {out['total_seconds']:.0f} s in all (draft build {out['draft_build_seconds']} s), "
          f"{len(trials)} trials ({out['trial_seconds']:.0f} s); best {choice.row.label}: {choice.reason}; "
          f"{'decided' if decided else 'not decided'}")
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
