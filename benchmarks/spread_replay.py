"""The engine spread learned as a study learns it, replayed on every recorded landscape, before and after.

For each landscape of ``benchmarks/landscapes/`` (``--landscape`` picks some), ``--seeds`` guided
studies as ``landscapes.py`` replays them for decision quality (:func:`landscapes.decision_quality`:
every measurement an engine start drawn at random from the candidate's recorded ones, seeded),
one after the other in one storage as a team's studies on one machine: the spread the first
learns (the baseline measured twice before its first pick, its rechecks) comes from the
landscape's own engine starts, and the later ones start from it and add theirs. Compared, seed by seed, with
the same replays in ``--before`` (``landscapes.json`` as written by the code before the spread was
measured and remembered: a 10 % prior, never learned early): the engine seconds until the study
stopped (median), the share of studies whose exported interval holds the landscape's best mean
(``band_coverage``), the share whose pick is the best or within the landscape's noise band of it
(``same_pick_rate``), and the spread each study ended with (median, and its source). Writes
``benchmarks/results/spread_replay.json``::

    .venv/bin/python benchmarks/spread_replay.py                 # every landscape, 5 studies each: ~25 min on 2 cores
    .venv/bin/python benchmarks/spread_replay.py --landscape tiny --seeds 4
    .venv/bin/python benchmarks/spread_replay.py --no-early --out benchmarks/results/spread_replay_no_early.json
    .venv/bin/python benchmarks/spread_replay.py --markdown      # the table of the stored results
    .venv/bin/python benchmarks/spread_replay.py --prior         # the CPU prior's figure (spectune.noise.PRIORS)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import math
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from landscapes import LANDSCAPES, RESULTS, SKIP, decision_quality, grid_engine_seconds, start_space  # noqa: E402
from bench_common import models_here  # noqa: E402

from spectune._util import atomic_write_text  # noqa: E402
from spectune.landscape import Landscape  # noqa: E402

DEFAULT_OUTPUT = RESULTS / "spread_replay.json"
DEFAULT_BEFORE = RESULTS / "spread_before.json"


def compare(name: str, landscape: Landscape, before: dict[str, Any] | None, seeds: int) -> dict[str, Any]:
    """One landscape's replays now against ``before``'s first ``seeds`` (its decision record)."""
    grid = grid_engine_seconds(landscape)
    after = decision_quality(landscape, seeds, start_space(name), shared=True)
    objective = landscape.config().objectives[0]
    sign = 1.0 if objective.maximize else -1.0
    means = landscape.means(objective.value)

    def summary(d: dict[str, Any]) -> dict[str, Any]:
        ratios = d["stop_ratios"][:seeds]
        best, band = d["best"], d["noise_band"]  # as landscapes.decision_quality counts a same pick
        same = [c == best or sign * (means.get(c, -sign * math.inf) / means[best] - 1.0) >= -band
                for c in d["chosen"][:seeds]]
        return {"engine_seconds_median": statistics.median(ratios) * grid, "stop_ratio": statistics.median(ratios),
                "first_engine_seconds": ratios[0] * grid,
                "later_engine_seconds_median": statistics.median(ratios[1:]) * grid if len(ratios) > 1 else None,
                "band_coverage": statistics.fmean(d["band_covered"][:seeds]),
                "same_pick_rate": statistics.fmean(same), "chosen": d["chosen"][:seeds]}

    out = {"name": name, "seeds": seeds, "grid_engine_seconds": grid, "after": summary(after)}
    spreads = after.get("engine_spreads") or []
    out["after"]["spread_median"] = statistics.median(s["value"] for s in spreads) if spreads else None
    out["after"]["spread_sources"] = {src: sum(s["source"] == src for s in spreads) for src in ("study", "machine", "prior")}
    if before is not None:
        out["before"] = summary(before)
        out["same_choices"] = statistics.fmean(a == b for a, b in zip(out["after"]["chosen"], out["before"]["chosen"],
                                                                       strict=False))
    return out


def recorded_prior() -> dict[str, Any]:
    """The CPU prior's figure (:data:`spectune.noise.PRIORS`): the pooled spread of every recorded
    landscape's candidates measured on two engine starts or more, with how many starts and landscapes."""
    from spectune.noise import pooled_spread

    groups, used = [], []
    for path in sorted(LANDSCAPES.glob("*.json")):
        if path.stem in SKIP:
            continue
        landscape = Landscape.load(path)
        mine = [v for v in landscape.starts(landscape.config().objectives[0].value).values() if len(v) > 1]
        if mine:
            groups += mine
            used.append(path.stem)
    return {"value": pooled_spread(groups), "starts": sum(len(g) for g in groups), "landscapes": used}


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| landscape | studies | grid (s) | engine s to a decision, median: before → after "
             "| first study: before → after | later studies: before → after | band coverage before → after "
             "| same pick before → after | spread the studies ended with (median) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        a, b = r["after"], r.get("before") or {}

        def pair(key: str, fmt: str) -> str:
            def one(d: dict[str, Any]) -> str:
                return "-" if d.get(key) is None else format(d[key], fmt)
            return f"{one(b)} → {one(a)}"

        lines.append(f"| `{r['name']}` | {r['seeds']} | {r['grid_engine_seconds']:.0f} "
                     f"| {pair('engine_seconds_median', '.0f')} | {pair('first_engine_seconds', '.0f')} "
                     f"| {pair('later_engine_seconds_median', '.0f')} | {pair('band_coverage', '.2f')} "
                     f"| {pair('same_pick_rate', '.2f')} | {a['spread_median']:.1%} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--landscape", action="append", help="a landscape's name (default: every one)")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--before", type=Path, default=DEFAULT_BEFORE)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--markdown", action="store_true", help="print the table of --out and exit")
    parser.add_argument("--prior", action="store_true", help="print the CPU prior's figure from the recorded landscapes")
    parser.add_argument("--no-early", action="store_true",
                        help="the rule without its first step: the baseline is not measured twice before the first pick")
    args = parser.parse_args()
    if args.no_early:
        import spectune.search._rechecks as rules

        rules.LEARN_SPREAD_MIN_CANDIDATES = 10 ** 9
    if args.markdown:
        print(markdown(json.loads(args.out.read_text())["landscapes"]))
        return
    if args.prior:
        prior = recorded_prior()
        print(f"CPU prior: {prior['value']:.1%} over {prior['starts']} engine starts of {len(prior['landscapes'])} landscapes")
        return
    logging.disable(logging.INFO)
    before = {r["name"]: r.get("decision") for r in json.loads(args.before.read_text())} if args.before.exists() else {}
    names = args.landscape or sorted(p.stem for p in LANDSCAPES.glob("*.json") if p.stem not in SKIP)
    old = json.loads(args.out.read_text())["landscapes"] if args.out.exists() else []
    rows = {r["name"]: r for r in old}
    for name in names:
        print(f"{name}: {args.seeds} replayed studies", file=sys.stderr, flush=True)
        here = models_here(Landscape.load(LANDSCAPES / f"{name}.json"))  # as landscapes.py replays it
        rows[name] = compare(name, here, before.get(name), args.seeds)
        rows[name]["evaluated_at"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        out = {"landscapes": [rows[n] for n in sorted(rows)]}
        atomic_write_text(args.out, json.dumps(out, indent=1) + "\n")
    print(markdown([rows[n] for n in sorted(rows)]))


if __name__ == "__main__":
    main()
