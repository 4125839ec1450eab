"""Workers on one study on a virtual clock: guided search with 1 and with 3 workers on recorded landscapes.

The deterministic companion of ``fleet.py``: no threads and no sleeping. The slots of one worker
claim and measure trials with the worker's own code (the study's lock, Optuna, the storage, the
models are real); each trial takes its recorded engine seconds on a virtual clock (the n-th
start of a candidate replays its n-th recorded engine start, as
:meth:`spectune.landscape.Landscape.measurer` answers it), a slot told to wait asks again once
the next trial ends, and free slots ask in turn. So the figures are engine seconds, without
the seconds guided search itself takes to plan (which ``fleet.py``'s wall time includes), and
the same on every run.

For each landscape and number of workers: the trials run, and the engine seconds until a
configuration within 2 % of the landscape's best (by its mean over its recorded engines) was
measured, and until the study ended.

    .venv/bin/python benchmarks/fleet_replay.py                          # 9 landscapes, 1 and 3 workers
    .venv/bin/python benchmarks/fleet_replay.py --landscape tiny tiny_c4

Writes benchmarks/results/fleet_replay.json (with the date, the machine and its processor's features).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import math
import tempfile
from pathlib import Path
from typing import Any

from spectune.landscape import Landscape
from spectune.provenance import hardware, versions
from spectune.worker import replay_on_clock

HERE = Path(__file__).resolve().parent
WITHIN = 0.02
LANDSCAPES = ["tiny", "tiny_c4", "tiny_mtbench", "tiny_heads", "tiny_pinned", "tiny_epyc", "smollm2",
              "smollm2_heads", "smollm2_epyc"]
"""The recorded landscapes with several candidates' engine starts timed (one study each)."""


def replay(landscape: Landscape, storage: str, name: str, workers: int, trials: int,
           work: Path) -> list[tuple[float, str]]:
    """One guided study worked on by ``workers`` slots on the virtual clock: the trials in the order
    they ended, each with the engine second it ended."""
    config = landscape.config(storage=storage, study_name=name, sampler="guided", trials=trials,
                              log_dir=str(work / "logs"))
    return replay_on_clock(config, landscape.measurer(), landscape.engine_clock(), workers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--landscape", nargs="+", default=LANDSCAPES, help="benchmarks/landscapes/NAME.json")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "fleet_replay.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="spectune-fleet-replay-") as tmp:
        work = Path(tmp)
        for name in args.landscape:
            landscape = Landscape.load(HERE / "landscapes" / f"{name}.json")
            draft = f"landscape/{Path(landscape.draft).name}" if landscape.draft else None
            landscape = landscape.rebase(f"landscape/{Path(landscape.target).name}", draft)  # no weights read
            means = landscape.means("output_throughput")
            best = max(means.values())
            good = {label for label, v in means.items() if v >= best * (1 - WITHIN)}
            for workers in args.workers:
                study = f"{name}-{workers}"
                ended = replay(landscape, f"sqlite:///{work / (study + '.db')}", study, workers, args.trials, work)
                reached = next((i for i, (_, label) in enumerate(ended) if label in good), None)
                rows.append({"landscape": name, "workers": workers, "trials_run": len(ended),
                             "engine_seconds_to_best": None if reached is None else round(ended[reached][0], 1),
                             "trials_to_best": None if reached is None else reached + 1,
                             "engine_seconds_to_end": round(ended[-1][0], 1) if ended else None,
                             "within_2_percent": sorted(good), "measured_in_order": [label for _, label in ended]})
                r = rows[-1]
                print(f"{name:14s} {workers} worker(s): {r['trials_run']:2d} trials, best within 2 % at "
                      f"{r['engine_seconds_to_best']} s (trial {r['trials_to_best']}), "
                      f"ended at {r['engine_seconds_to_end']} s", flush=True)
    for row in rows:
        one = next(r for r in rows if r["landscape"] == row["landscape"] and r["workers"] == min(args.workers))
        a, b = one["engine_seconds_to_best"], row["engine_seconds_to_best"]
        row["to_best_fewest_workers_over_this"] = round(a / b, 2) if a and b else None
    ratios = [r["to_best_fewest_workers_over_this"] for r in rows if r["workers"] != min(args.workers)
              and r["to_best_fewest_workers_over_this"]]
    out = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "trials": args.trials,
        "geometric_mean_speedup_to_best": (round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 2)
                                           if ratios else None),
        "versions": versions().model_dump(), "hardware": hardware().model_dump(), "runs": rows,
    }
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
