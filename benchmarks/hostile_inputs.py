"""Hostile inputs at scale: the generators of the hostile-input tests (``tests/hostile.py``),
run many more times, each case through ``spectune``'s real command line.

For each kind of input (prompt files in every format, search spaces, study YAMLs, ``vllm
bench`` result files for ``spectune import``, command-line values) it draws ``--cases`` cases
and counts how each ended: exit 0, exit 2 with one line and nothing written, or anything else
(the goal: none). A few cases of each kind also run as a real ``spectune`` process
(``--subprocess``), so that what reaches a terminal is checked as well. No engine starts.

Writes ``benchmarks/results/hostile_inputs.json``: the counts per kind, every problem found
(kind, outcome, arguments), the settings, spectune's versions and the machine::

    python benchmarks/hostile_inputs.py                      # 1200 cases of each kind
    python benchmarks/hostile_inputs.py --cases 100 --kind space --out /tmp/h.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import platform
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import hostile  # noqa: E402  (tests/hostile.py)
from hypothesis import given, seed, settings  # noqa: E402


class _CurrentStderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Log records go to whatever ``sys.stderr`` is when they are written (each case's own), as
    in a ``spectune`` process, so that a warning counts among a case's lines."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def _reason(stderr: str, harness: hostile.Harness) -> str:
    """An exit-2 line without its paths and values: what kind of input the case was refused for."""
    line = next((x for x in stderr.splitlines() if x.startswith("error: ")), stderr.strip()[:80] or "(help)")
    line = line.replace(str(harness.root), "ROOT")
    line = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", line)
    line = re.sub(r"ROOT/\S*|case\d+|\d+", "#", line)
    return line[:90]


def run_kind(kind: str, cases: int, subprocesses: int, harness: hostile.Harness, base_seed: int) -> dict[str, Any]:
    counts: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    problems: list[dict[str, Any]] = []
    seconds: list[float] = []

    def record(case: hostile.Case, outcome: hostile.Outcome, how: str) -> None:
        counts[outcome.verdict] += 1
        if outcome.verdict == "exit 2":
            errors[_reason(outcome.stderr, harness)] += 1
        if outcome.problem is not None:
            problems.append({"how": how, "problem": outcome.problem, "case": repr(case)[:2000],
                             "stderr": outcome.stderr[-2000:]})

    @seed(base_seed)
    @settings(hostile.hostile_settings(cases), derandomize=False)
    @given(case=hostile.STRATEGIES[kind])
    def in_process(case: hostile.Case) -> None:
        t0 = time.perf_counter()
        record(case, harness.run(case), "in process")
        seconds.append(time.perf_counter() - t0)

    def in_subprocess(case: hostile.Case) -> None:
        if any("\x00" in a for a in case.argv):  # no process takes a NUL in its arguments
            return
        record(case, harness.run(case, in_subprocess=True), "subprocess")

    start, cpu = time.perf_counter(), time.process_time()
    in_process()
    cpu_in_process = time.process_time() - cpu
    if subprocesses:
        seed(base_seed + 1)(settings(hostile.hostile_settings(subprocesses), derandomize=False)(
            given(case=hostile.STRATEGIES[kind])(in_subprocess)))()
    total = sum(counts.values())
    seconds.sort()
    return {"cases": total, "exit_0": counts["exit 0"], "exit_2": counts["exit 2"], "other": counts["other"],
            "wall_seconds": round(time.perf_counter() - start, 1),
            "cpu_seconds_in_process": round(cpu_in_process, 1),
            "median_ms_in_process": round(1000 * seconds[len(seconds) // 2], 1) if seconds else None,
            "top_errors": [{"error": e, "cases": n} for e, n in errors.most_common(15)], "problems": problems}


def _checkout() -> dict[str, Any]:
    """The commit that ran, and the files of spectune changed in the checkout beside it."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return ""

    changed = [line[3:] for line in git("status", "--porcelain", "--", "spectune", "tests/hostile.py").splitlines()]
    return {"commit": git("rev-parse", "--short", "HEAD") or None, "uncommitted": changed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=1200, help="Cases per kind, in process.")
    parser.add_argument("--subprocess", type=int, default=10, help="Cases per kind as a spectune process.")
    parser.add_argument("--kind", action="append", choices=hostile.KINDS, help="Only these kinds (repeatable).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "hostile_inputs.json")
    args = parser.parse_args()

    handler = _CurrentStderr()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.WARNING)

    from spectune.provenance import hardware, versions

    started = dt.datetime.now(dt.timezone.utc)
    kinds: dict[str, Any] = {}
    with hostile.harness_folder() as folder:
        for kind in args.kind or hostile.KINDS:
            harness = hostile.Harness(folder / kind)
            kinds[kind] = run_kind(kind, args.cases, args.subprocess, harness, args.seed)
            row = kinds[kind]
            print(f"{kind:9s} {row['cases']:6d} cases: exit 0 {row['exit_0']:5d}, exit 2 {row['exit_2']:5d}, "
                  f"other {row['other']:3d} ({row['wall_seconds']} s, {row['cpu_seconds_in_process']} s of CPU in process)",
                  flush=True)
    total = {k: sum(row[k] for row in kinds.values()) for k in ("cases", "exit_0", "exit_2", "other")}
    import hypothesis

    report = {
        "schema": 1, "started_at": started.isoformat(timespec="seconds"),
        "finished_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "settings": {"cases_per_kind": args.cases, "subprocess_per_kind": args.subprocess, "seed": args.seed},
        "total": total, "kinds": kinds, "checkout": _checkout(),
        "versions": {**versions().model_dump(), "hypothesis": hypothesis.__version__},
        "hardware": hardware().model_dump(), "platform": platform.platform(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"total {total['cases']} cases: exit 0 {total['exit_0']}, exit 2 {total['exit_2']}, other {total['other']}; "
          f"wrote {args.out}")


if __name__ == "__main__":
    main()
