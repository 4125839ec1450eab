"""Workers on one study: a study of 12 trials with 1 and with 3 workers, on a recorded landscape.

Stand-in engines replay ``benchmarks/landscapes/<landscape>.json``: each trial sleeps its
recorded engine seconds times ``--time-scale`` (a waiting worker's polling too), then answers with its recorded Measurement
(:meth:`spectune.landscape.Landscape.measurer`). The workers are the slots of one
:func:`spectune.worker.run_worker` (threads), which choose and start trials through the study's
lock exactly as ``spectune worker`` processes on several machines do; ``--storage`` runs them on
a PostgreSQL database instead of a temporary SQLite file.

For each sampler and number of workers it reports the wall time (and the speed-up of several
workers over one), the engine seconds spent, the trials run, and the trials (in the order they
finished) and wall seconds until a configuration within 2 % of the landscape's best was
measured, and the final choice.

    .venv/bin/python benchmarks/fleet.py                      # tiny landscape, guided and grid, 1 and 3 workers
    .venv/bin/python benchmarks/fleet.py --storage postgresql+psycopg://postgres@127.0.0.1/test
    .venv/bin/python benchmarks/fleet.py --sampler guided --repeat 3   # each study 3 times: thread timing varies

With ``--repeat``, each study runs that many times in turn (1 and 3 workers alternating), and
the summary gives each figure's median over the repeats.

Writes benchmarks/results/fleet.json (with the date, the machine and its processor's features).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from spectune.errors import EngineError
from spectune.landscape import Landscape
from spectune.provenance import hardware, versions
from spectune.results import open_study
from spectune.study import create_study
from spectune.worker import POLL_SECONDS, Slot, run_worker

HERE = Path(__file__).resolve().parent
WITHIN = 0.02


def _run(landscape: Landscape, storage: str, name: str, sampler: str, workers: int, trials: int,
         scale: float, work: Path) -> dict[str, Any]:
    """One study; what finished when, and what it chose. The n-th trial of a candidate replays
    its n-th recorded engine start (in turn when it has fewer), as the landscape's measurer."""
    lock = threading.Lock()
    finished: list[tuple[float, str, float]] = []  # (wall seconds, label, engine seconds)
    t0 = time.monotonic()

    calls: dict[str, int] = {}
    engines = landscape.engines()

    def stand_in(engine_args: Any, spec: Any, *args: Any, **kwargs: Any) -> Any:
        from spectune.measurement import spec_key

        key = spec_key(spec.to_vllm())
        with lock:
            n = calls[key] = calls.get(key, -1) + 1
        point = engines[key][n % len(engines[key])]
        time.sleep(point.engine_seconds * scale)
        finished.append((time.monotonic() - t0, point.label, point.engine_seconds))
        if point.measurement is None:
            raise EngineError(point.error or "engine failed")
        return point.measurement

    config = landscape.config(storage=storage, study_name=name, sampler=sampler, trials=trials,
                              log_dir=str(work / "logs"))
    slots = [Slot((i,)) for i in range(workers)]
    run_worker(create_study(config), slots=slots, measure_fn=stand_in, poll_seconds=POLL_SECONDS * scale)
    wall = time.monotonic() - t0
    choice = open_study(storage, name).best()
    return {"wall_seconds": round(wall, 2), "finished": finished, "chosen": choice.row.label}


def _summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each (sampler, workers)'s median figures over the repeats; "to best" and its ratio to one
    worker's only where every repeat reached the best."""
    out = []
    for sampler, workers in dict.fromkeys((r["sampler"], r["workers"]) for r in rows):
        mine = [r for r in rows if r["sampler"] == sampler and r["workers"] == workers]
        reached = [r["wall_seconds_to_best"] for r in mine]
        to_best = statistics.median(reached) if None not in reached else None
        out.append({"sampler": sampler, "workers": workers, "repeats": len(mine),
                    "wall_seconds": statistics.median(r["wall_seconds"] for r in mine),
                    "trials_run": statistics.median(r["trials_run"] for r in mine),
                    "trials_run_each": [r["trials_run"] for r in mine], "wall_seconds_to_best": to_best,
                    "wall_seconds_to_best_each": reached})
    for row in out:
        one = next((r for r in out if r["sampler"] == row["sampler"] and r["workers"] == 1), None)
        row["to_best_one_worker_over_this"] = (round(one["wall_seconds_to_best"] / row["wall_seconds_to_best"], 2)
                                               if one and one["wall_seconds_to_best"] and row["wall_seconds_to_best"]
                                               else None)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--landscape", default="tiny", help="benchmarks/landscapes/NAME.json")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--sampler", nargs="+", default=["guided", "grid"])
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--time-scale", type=float, default=0.02, help="Stand-in seconds per recorded engine second.")
    parser.add_argument("--storage", default=None, help="A database URL (default: a temporary SQLite file per study).")
    parser.add_argument("--repeat", type=int, default=1, help="Run each study this many times.")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "fleet.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)

    landscape = Landscape.load(HERE / "landscapes" / f"{args.landscape}.json")
    draft = f"landscape/{Path(landscape.draft).name}" if landscape.draft else None
    landscape = landscape.rebase(f"landscape/{Path(landscape.target).name}", draft)  # no weights read
    objective = "output_throughput"
    means = landscape.means(objective)
    best = max(means.values())
    good = {label for label, v in means.items() if v >= best * (1 - WITHIN)}
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d%H%M%S")
    rows = []
    with tempfile.TemporaryDirectory(prefix="spectune-fleet-") as tmp:
        work = Path(tmp)
        for repeat, sampler, workers in ((r, s, w) for r in range(args.repeat)
                                         for s in args.sampler for w in args.workers):
            name = f"fleet-{sampler}-{workers}-{stamp}-{repeat}"
            storage = args.storage or f"sqlite:///{work / (name + '.db')}"
            run = _run(landscape, storage, name, sampler, workers, args.trials, args.time_scale, work)
            order = sorted(run["finished"])
            reached = next((i for i, (_, label, _) in enumerate(order) if label in good), None)
            rows.append({
                "sampler": sampler, "workers": workers, "repeat": repeat, "wall_seconds": run["wall_seconds"],
                "engine_seconds": round(sum(s for _, _, s in order), 1), "trials_run": len(order),
                "trials_to_best": None if reached is None else reached + 1,
                "wall_seconds_to_best": None if reached is None else round(order[reached][0], 2),
                "chosen": run["chosen"], "chosen_below_best": round(1 - means[run["chosen"]] / best, 4),
                "measured_in_order": [label for _, label, _ in order],
            })
            print(f"{sampler:6s} {workers} worker(s): {run['wall_seconds']:7.1f} s wall, {len(order):2d} trials, "
                  f"best within 2 % after {rows[-1]['trials_to_best']} trials ({rows[-1]['wall_seconds_to_best']} s); "
                  f"chose {run['chosen']}")
    for row in rows:
        one = next((r for r in rows if r["sampler"] == row["sampler"] and r["workers"] == 1
                    and r["repeat"] == row["repeat"]), None)
        row["speedup_over_one_worker"] = round(one["wall_seconds"] / row["wall_seconds"], 2) if one else None
    summary = _summary(rows)
    for row in summary:
        print(f"median of {args.repeat}: {row['sampler']:6s} {row['workers']} worker(s): {row['wall_seconds']} s wall, "
              f"{row['trials_run']} trials, best within 2 % after {row['wall_seconds_to_best']} s")
    out = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "landscape": args.landscape, "trials": args.trials, "time_scale": args.time_scale,
        "storage": "postgresql" if args.storage and args.storage.startswith("postgres") else "sqlite",
        "best": {"value": best, "within_2_percent": sorted(good)},
        "repeat": args.repeat, "versions": versions().model_dump(), "hardware": hardware().model_dump(),
        "summary": summary, "runs": rows,
    }
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
