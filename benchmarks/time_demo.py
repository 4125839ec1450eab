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
    .venv/bin/python benchmarks/time_demo.py --again    # then the same job as a second study in the storage

``--again`` runs the demo's study once more under another name in the same storage (``again``
in the output): a second study on the machine, which starts from the engine spread the first
one measured. For each study: its trials, engine seconds, whether it stopped by its own rule
before its budget, and the engine spread it used with its source.
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
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DEFAULT_OUTPUT = REPO / "benchmarks" / "results" / "demo_time.json"
DECIDED_BAND = 0.05
"""A baseline choice is decided when its noise band is narrower than this."""


def _study(view: Any) -> tuple[list[dict[str, Any]], Any, bool, dict[str, Any]]:
    """A finished study's trials, its choice, whether that is decided (an interval clear of 1.0x,
    or the baseline with a band under :data:`DECIDED_BAND`), and a summary: engine runs and
    seconds, how it ended, the engine spread it used."""
    from spectune.records import StudyRecord, TrialRecord

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
               else choice.interval is not None and choice.interval[0] > 1.0)
    record = StudyRecord.of(view.study)
    summary = {"engine_runs": len(trials), "engine_seconds": round(sum(t["seconds"] or 0 for t in trials), 1),
               "stopped_by_rule": bool((record.guide or {}).get("stop_reason")), "budget_ended": record.stopped,
               "engine_spread": view.spread().record(), "config": choice.row.label, "interval": choice.interval,
               "reason": choice.reason,
               "decided": decided, "trials": trials}
    return trials, choice, decided, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draft", action="store_true", help="scripts/demo.sh --draft: with the distilled draft")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--again", action="store_true", help="a second study of the same job in the same storage")
    args = parser.parse_args()

    from spectune.provenance import hardware
    from spectune.records import StudyRecord
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
        trials, choice, decided, record = _study(view)
        again = None
        if args.again:
            target = next(line.split(": ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("target model: "))
            t1 = time.monotonic()
            run = subprocess.run([str(REPO / ".venv" / "bin" / "spectune"), "optimize", "--config", "examples/demo.yaml",
                                  "--target", target, "--study", f"{study_name}-again"], cwd=REPO, env=env,
                                 capture_output=True, text=True, check=False)
            if run.returncode != 0:
                raise SystemExit(f"the second study failed ({run.returncode}): {run.stderr[-2000:]}")
            again = {"total_seconds": round(time.monotonic() - t1, 1),
                     **_study(open_study(url, f"{study_name}-again"))[3]}
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
            "study": record,
            "again": again,
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
    if again is not None:
        print(f"again: {again['engine_runs']} trials ({again['engine_seconds']:.0f} s), "
              f"{'stopped by its rule' if again['stopped_by_rule'] else 'ended on its budget'}; {again['reason']}; "
              f"spread {again['engine_spread']['value']:.1%} ({again['engine_spread']['source']})")
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
