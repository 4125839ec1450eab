"""Every recorded landscape in one table: search efficiency, prediction errors and decision quality.

For each landscape of ``benchmarks/landscapes/`` (``--landscape`` picks some), with one set of
settings for all:

1. ``search_efficiency.py evaluate`` on it (no engine: the study loop answered from the file),
   written to ``benchmarks/results/search_efficiency_<name>.json`` (``search_efficiency.json`` for
   the default ``tiny``): the engine seconds guided search needs to measure a configuration within
   2 % of the best, against the grid, random search and TPE (``--seeds`` seeds each), and the
   leave-one-out errors of acceptance length and throughput; and the same until a configuration
   within the landscape's noise band of the best was measured (``noise_band``, below, where it
   is wider than 2 %: configurations within it cannot be told from the best by the landscape's
   own engine starts): ``grid_ratio_band``, and over random search and TPE in the median over
   the seeds, as the goal asks (``random_median_ratio_band``, ``tpe_median_ratio_band``; 0 where
   the other strategy's median never got there); and guided search's engine seconds to within
   2 % and to within the band as a share of the exhaustive grid's, every candidate measured once
   (``grid_share``, ``grid_share_band``): the ratios to the grid depend on the order of its space,
   which puts a good configuration early or late;
2. decision quality: ``--decision-seeds`` guided studies, each answered by engine starts drawn at
   random from the landscape's recorded starts of each candidate (its measured noise), and what
   each would export: ``same_pick_rate`` is the share whose choice is the landscape's best or
   lies within its noise band of it (the band: twice the pooled spread of one engine start around
   its candidate's mean, at least 2 %); where no configuration beats the baseline beyond that band,
   ``baseline_pick_rate`` is the share that export the baseline (null elsewhere);
   ``prior_interval_hit_rate`` is the share whose first speculative trial measured a value inside
   the interval guided search predicted for it from the prior and the baseline alone;
   the same replays give, per landscape, ``engine_spreads`` (the engine spread each study ended
   with, and its source), ``stop_ratio`` (the median over the seeds of a study's
   engine seconds from its first trial until it stopped, rechecks included, over the grid's:
   every candidate's first recorded start once), ``band_coverage`` (the share of studies whose
   exported interval, the choice's value times exp(+-its band), holds the landscape's best mean) and
   ``regret_median`` (how far the choice's mean lies below the best mean, median over the
   seeds); and ``rival_rules``: successive halving and the rule of vLLM's closed
   ``tune_speculative_k`` replayed on the same kind of draws (:func:`rival_rules`). A landscape
   with a ``<name>_study_space.yaml`` (``smollm2_edit``) starts its studies from that narrower
   space, which guided search widens past its edges into the recorded domain, and replays them
   again kept to it (``kept``: same pick, regret and stop ratio, against the whole landscape's best);
3. ``prior_interval_coverage``: every speculative candidate predicted from one recorded engine
   start of the baseline alone (each start in turn), as a study predicts before its first
   speculative trial: the share of (start, candidate) pairs whose candidate mean lies inside the
   predicted interval.

Writes ``benchmarks/results/landscapes.json``: a list with one object per landscape (``name``,
``workload``, ``concurrency``, ``candidates``, ``grid_ratio``, ``random_ratio``, ``tpe_ratio``,
``noise_band``, ``grid_ratio_band``, ``grid_share``, ``grid_share_band``, ``random_median_ratio_band``,
``tpe_median_ratio_band``,
``acceptance_error_median``, ``acceptance_error_max``, ``throughput_error``, ``single_engine_error``
(the mean distance of one engine start from its candidate's mean, over the candidates with
several: the noise of the single starts the predictions are fitted on; null with one start each),
``throughput_target_noise`` (how far a prediction at each candidate's true value would lie from
its mean over the recorded starts, which ``throughput_error`` scores against:
``prediction_errors.target_noise``, the recording's own share of that error; null with one start each),
``same_pick_rate``, ``baseline_pick_rate``, ``prior_interval_hit_rate``, ``prior_interval_coverage``, and what these
rest on)::

    .venv/bin/python benchmarks/landscapes.py            # make bench-landscapes
    .venv/bin/python benchmarks/landscapes.py --landscape tiny_epyc --decision-seeds 20
    .venv/bin/python benchmarks/landscapes.py --markdown   # the table of landscapes.json, as RESULTS.md shows it

With ``--landscape``, the rows of the landscapes named replace theirs in ``--out`` and the others
are kept, each with its own ``evaluated_at``. ``--decision-only`` replays step 2 alone (the
stored evaluate results and prior coverage are kept)::

    .venv/bin/python benchmarks/landscapes.py --decision-only --decision-seeds 10
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from spectune._util import atomic_write_text  # noqa: E402
from spectune.landscape import Landscape  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
from rival_rules import grid_engine_seconds, regret_of, rival_rules  # noqa: E402
from landscapes_markdown import courses_markdown, decisions_markdown, edges_markdown, markdown, result_path  # noqa: E402

LANDSCAPES = REPO / "benchmarks" / "landscapes"
RESULTS = REPO / "benchmarks" / "results"
SKIP = {"tiny_sweep"}
"""Landscapes recorded for other benchmarks (a concurrency sweep), not for search efficiency."""


def _noisy_measurer(landscape: Landscape, seed: int, spent: list[float] | None = None):  # noqa: ANN202
    """Answers each call with an engine start of its candidate drawn at random (seeded); each
    call appends that start's engine seconds to ``spent``."""
    from spectune.errors import EngineError
    from spectune.measurement import spec_key

    engines, rng = landscape.engines(), random.Random(seed)

    def measure(engine: object, spec: Any, *args: object, **kwargs: object) -> Any:
        p = rng.choice(engines[spec_key(spec.to_vllm())])
        if spent is not None:
            spent.append(p.engine_seconds)
        if p.measurement is None:
            raise EngineError(p.error or "engine failed")
        return p.measurement

    return measure


def start_space(name: str) -> Path | None:
    """The space the replayed studies of landscape ``name`` start from, where it is not the
    landscape's own: ``<name>_study_space.yaml``, narrower than the recorded domain, whose edges
    a study widens into the recorded candidates (``smollm2_edit``); None elsewhere."""
    path = LANDSCAPES / f"{name}_study_space.yaml"
    return path if path.is_file() else None


def decision_quality(landscape: Landscape, seeds: int, space: Path | None = None, *,
                     extend: bool = True, shared: bool = False) -> dict[str, Any]:
    """What guided studies answered by randomly drawn engine starts export (module docstring),
    starting from ``space`` where given (the landscape's own elsewhere), widening its ranges
    past an edge unless ``extend`` is false. ``shared``: every study in one storage, one after
    the other, as a team's studies on one machine (each starts from the engine spread the
    earlier ones measured); else each in a storage of its own."""
    from spectune.results import open_study
    from spectune.worker import run_study

    objective = landscape.config().objectives[0]
    sign = 1.0 if objective.maximize else -1.0
    means = landscape.means(objective.value)
    best = max(means, key=lambda k: sign * means[k])
    band = landscape.noise_band(objective.value)
    base = means.get("none")
    decided = base is not None and sign * (means[best] / base - 1.0) > band
    grid = grid_engine_seconds(landscape)
    chosen: list[str] = []
    firsts: list[dict[str, Any] | None] = []
    stop_ratios: list[float] = []
    covered: list[bool] = []
    stopped: list[str | None] = []
    spreads: list[dict[str, Any]] = []
    widened: list[list[str]] = []
    with tempfile.TemporaryDirectory(prefix="spectune-landscapes-") as work:
        for seed in range(seeds):
            db = "d" if shared else f"d{seed}"
            config = landscape.config(storage=f"sqlite:///{work}/{db}.db", study_name=f"d{seed}", sampler="guided",
                                      seed=seed, trials=len(landscape.engines()), log_dir=f"{work}/logs", extend=extend,
                                      **({"space": str(space)} if space is not None else {}))
            spent: list[float] = []
            run_study(config, measure_fn=_noisy_measurer(landscape, seed, spent))
            view = open_study(config.storage, f"d{seed}")
            choice = view.best()
            chosen.append(choice.row.label)
            firsts.append(_first_speculative(view.study))
            stop_ratios.append(sum(spent) / grid)
            covered.append(band_holds(means[best], choice.value, choice.noise_band))
            stopped.append((view.study.user_attrs.get("guide") or {}).get("stop_reason"))
            spreads.append(view.spread().record())
            widened.append([e["param"] + " " + str(e["range"].get("high")) for e in view.study.user_attrs.get("extensions") or []])
    same = [c == best or sign * (means.get(c, -sign * math.inf) / means[best] - 1.0) >= -band for c in chosen]
    regret = [regret_of(means, best, c, sign) for c in chosen]
    hits = [f["inside"] for f in firsts if f is not None]
    return {"best": best, "noise_band": band, "beats_baseline_beyond_noise": decided, "chosen": chosen,
            "same_pick_rate": statistics.fmean(same),
            "baseline_pick_rate": None if decided else statistics.fmean(c == "none" for c in chosen),
            "prior_interval_hit_rate": statistics.fmean(hits) if hits else None, "first_speculative": firsts,
            "stop_ratios": stop_ratios, "stop_ratio": statistics.median(stop_ratios),
            "band_covered": covered, "band_coverage": statistics.fmean(covered),
            "regrets": regret, "regret_median": statistics.median(regret), "stop_reasons": stopped,
            "engine_spreads": spreads,
            **({"start_space": str(space.relative_to(REPO)), "extend": extend, "widened": widened} if space else {})}


def decisions(name: str, landscape: Landscape, seeds: int) -> dict[str, Any]:
    """:func:`decision_quality` from the landscape's start space; where it has one of its own
    (:func:`start_space`), also kept to it (``extend: false``) under ``kept``."""
    space = start_space(name)
    quality = decision_quality(landscape, seeds, space)
    if space is not None:
        kept = decision_quality(landscape, seeds, space, extend=False)
        quality["kept"] = {k: kept[k] for k in ("chosen", "same_pick_rate", "stop_ratio", "regret_median", "regrets")}
    return quality


def band_holds(truth: float, value: float, band: float) -> bool:
    """Whether the interval a study exports, ``value`` times exp(+-``band``) (the band is a
    half-width on the log, :func:`spectune.noise.interval`), holds ``truth``, the landscape's
    best mean."""
    return value > 0 and truth > 0 and abs(math.log(truth / value)) <= band


def prior_interval_coverage(landscape: Landscape) -> float | None:
    """Share of (baseline start, speculative candidate) pairs whose candidate mean lies inside the
    interval predicted from that baseline start alone (module docstring)."""
    from spectune.predict import predict_candidates

    objective = landscape.config().objectives[0].value
    means = landscape.means(objective)
    engines = [[p.measurement for p in starts if p.measurement is not None] for starts in landscape.engines().values()]
    bases = [m for starts in engines for m in starts if m.spec.is_baseline]
    specs = [starts[0].spec for starts in engines if starts and not starts[0].spec.is_baseline]
    inside = [pred.value.low <= means[pred.label] <= pred.value.high
              for base in bases for pred in predict_candidates(specs, base, [], objective=objective)]
    return statistics.fmean(inside) if inside else None


def _first_speculative(study: Any) -> dict[str, Any] | None:
    """The first speculative trial guided search ran: its interval, predicted from the prior and the
    baseline alone, and what it then measured (None if it ran none with an interval)."""
    from spectune.records import TrialRecord

    for trial in sorted(study.trials, key=lambda t: t.number):
        rec = TrialRecord.of(trial)
        if (rec.spec or {}).get("method", "none") == "none":
            continue
        value = trial.values[0] if trial.values else None
        if rec.predicted_low is None or rec.predicted_high is None or value is None:
            return None
        return {"config": rec.config, "low": rec.predicted_low, "high": rec.predicted_high, "measured": value,
                "inside": rec.predicted_low <= value <= rec.predicted_high}
    return None


def _median_ratio(result: dict[str, Any], other: str) -> float | None:
    """Guided search's median engine seconds to within the noise band of the best over ``other``'s
    (``evaluate``'s seeds; a seed that never got there counts as endless): below 1, guided search
    needs less in the median. None where guided's median never got there; 0 where only ``other``'s did not."""
    def median(name: str) -> float:
        reach = result["strategies"][name]["seconds_to_reach_band"]
        return statistics.median(math.inf if x is None else x for x in reach)

    guided, rival = median("guided"), median(other)
    return None if math.isinf(guided) else 0.0 if math.isinf(rival) else guided / rival


def _share(result: dict[str, Any], reach: str) -> float | None:
    """Guided search's engine seconds until it measured a configuration within the tolerance
    (``reach``: 2 %, or the noise band) as a share of the exhaustive grid's (every candidate
    once); None where it never got there."""
    seconds = result["strategies"]["guided"][reach]
    return None if seconds is None else seconds / result["landscape_engine_seconds"]


def _dtype(landscape: Landscape) -> str | None:
    """The dtype the landscape's engines ran (the study's setting where no engine recorded one)."""
    ran = next((p.measurement.engine.dtype for p in landscape.points if p.measurement is not None), None)
    return ran or (landscape.study_config.get("engine") or {}).get("dtype")


def row(name: str, landscape: Landscape, result: dict[str, Any], quality: dict[str, Any],
        coverage: float | None) -> dict[str, Any]:
    cfg = landscape.study_config
    wl = cfg.get("workload", {})
    accept = [e["error"] for e in result["prediction_errors"]["acceptance_length"]]
    hw = next((p.measurement.hardware for p in landscape.points if p.measurement is not None), None)
    from prediction_errors import target_noise  # beside this script: main puts it on the path

    return {
        "name": name, "workload": wl.get("source"), "concurrency": wl.get("concurrency"),
        "candidates": result["candidates"], "engine_starts_per_candidate": result["engine_starts_per_candidate"],
        "grid_ratio": result["grid_engine_seconds_ratio"], "random_ratio": result["random_engine_seconds_ratio"],
        "tpe_ratio": result["tpe_engine_seconds_ratio"],
        "noise_band": result["noise_band"], "grid_ratio_band": result["grid_engine_seconds_ratio_band"],
        "grid_share": _share(result, "mean_seconds_to_reach"),
        "grid_share_band": _share(result, "mean_seconds_to_reach_band"),
        "random_median_ratio_band": _median_ratio(result, "random"),
        "tpe_median_ratio_band": _median_ratio(result, "tpe"),
        "acceptance_error_median": statistics.median(accept) if accept else None,
        "acceptance_error_max": max(accept) if accept else None,
        "throughput_error": result["throughput_error"],
        "single_engine_error": result["engine_speed"].get("spread", {}).get("single_engine_error"),
        "throughput_target_noise": target_noise(landscape, landscape.config().objectives[0].value),
        "same_pick_rate": quality["same_pick_rate"], "baseline_pick_rate": quality["baseline_pick_rate"],
        "prior_interval_hit_rate": quality["prior_interval_hit_rate"],
        "prior_interval_coverage": coverage,
        "stop_ratio": quality.get("stop_ratio"), "band_coverage": quality.get("band_coverage"),
        "regret_median": quality.get("regret_median"),
        "decision": quality, "dtype": _dtype(landscape),
        "machine": hw.model_dump() if hw is not None else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--landscape", action="append", help="names under benchmarks/landscapes (default: all)")
    parser.add_argument("--seeds", type=int, default=7, help="seeds of random search and TPE (and guided's fallback)")
    parser.add_argument("--decision-seeds", type=int, default=20)
    parser.add_argument("--reuse", action="store_true",
                        help="read the stored evaluate results, and the decision quality and prior coverage of the "
                             "rows in --out, instead of rerunning them")
    parser.add_argument("--decision-only", action="store_true",
                        help="read the stored evaluate results and prior coverage (as --reuse) but replay the "
                             "decision-quality studies again (stop ratio, band coverage, regret)")
    parser.add_argument("--rivals-only", action="store_true",
                        help="replay only the rival rules (successive halving, the grid once, vLLM's tune_speculative_k "
                             "rule) for the rows in --out, with --decision-seeds seeds, and keep everything else")
    parser.add_argument("--out", type=Path, default=RESULTS / "landscapes.json")
    parser.add_argument("--markdown", action="store_true",
                        help="print the tables of --out and of the evaluate results as RESULTS.md shows them, "
                             "and evaluate nothing")
    args = parser.parse_args()
    if args.markdown:
        rows = json.loads(args.out.read_text())
        print(markdown(rows) + "\n" + decisions_markdown(rows) + "\n" + edges_markdown(rows) + "\n"
              + courses_markdown([r["name"] for r in rows]),
              end="")
        return
    if args.rivals_only:
        rows = json.loads(args.out.read_text())
        for r in rows:
            if not args.landscape or r["name"] in args.landscape:
                r["rival_rules"] = rival_rules(Landscape.load(LANDSCAPES / f"{r['name']}.json"), args.decision_seeds)
        atomic_write_text(args.out, json.dumps(rows, indent=1) + "\n")
        print(f"-> {args.out}")
        return
    names = args.landscape or sorted(p.stem for p in LANDSCAPES.glob("*.json") if p.stem not in SKIP)
    stored = {r["name"]: r for r in json.loads(args.out.read_text())} if args.out.exists() else {}
    when = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    payload = []
    for name in names:
        path, out = LANDSCAPES / f"{name}.json", result_path(name)
        reused = (args.reuse or args.decision_only) and out.exists() \
            and "noise_band" in json.loads(out.read_text())  # as this code writes it
        if not reused:
            print(f"{name}: evaluate", file=sys.stderr, flush=True)
            subprocess.run([sys.executable, str(REPO / "benchmarks" / "search_efficiency.py"), "evaluate", str(path),
                            "--seeds", str(args.seeds), "--out", str(out)], check=True, cwd=REPO)
        landscape = Landscape.load(path)
        from bench_common import models_here  # the same models as evaluate replays with

        here = models_here(landscape)
        old = stored.get(name, {})
        if args.decision_only and "prior_interval_coverage" in old:
            print(f"{name}: decision quality over {args.decision_seeds} seeds", file=sys.stderr, flush=True)
            r = {**row(name, here, json.loads(out.read_text()), decisions(name, here, args.decision_seeds),
                       old["prior_interval_coverage"]),
                 "rival_rules": rival_rules(here, args.decision_seeds),
                 "evaluated_at": when, "seeds": old.get("seeds"), "decision_seeds": args.decision_seeds}
        elif reused and "decision" in old:  # the stored replays of decision quality
            r = {**row(name, here, json.loads(out.read_text()), old["decision"], old["prior_interval_coverage"]),
                 **{k: old[k] for k in ("evaluated_at", "seeds", "decision_seeds", "rival_rules") if k in old}}
        else:
            print(f"{name}: decision quality over {args.decision_seeds} seeds", file=sys.stderr, flush=True)
            r = {**row(name, here, json.loads(out.read_text()), decisions(name, here, args.decision_seeds),
                       prior_interval_coverage(here)),
                 "rival_rules": rival_rules(here, args.decision_seeds), "evaluated_at": when, "seeds": args.seeds, "decision_seeds": args.decision_seeds}
        payload.append(r)
        print(f"{name}: grid {r['grid_ratio']}, random {r['random_ratio']}, tpe {r['tpe_ratio']} (within "
              f"{r['noise_band']:.1%}: grid {r['grid_ratio_band']}, random median {r['random_median_ratio_band']}, "
              f"TPE median {r['tpe_median_ratio_band']}), acceptance "
              f"{r['acceptance_error_median']} / {r['acceptance_error_max']}, throughput {r['throughput_error']:.3f}, "
              f"same pick {r['same_pick_rate']:.2f}, baseline pick {r['baseline_pick_rate']}, "
              f"first speculative trial inside the prior's interval {r['prior_interval_hit_rate']}, candidates "
              f"inside it {r['prior_interval_coverage']}; stop ratio {r['stop_ratio']}, band coverage "
              f"{r['band_coverage']}, median regret {r['regret_median']}", flush=True)
    if args.landscape:  # some landscapes: their rows replace theirs, the others stay
        payload += [r for name, r in stored.items() if name not in names]
    atomic_write_text(args.out, json.dumps(sorted(payload, key=lambda r: r["name"]), indent=1) + "\n")
    print(f"-> {args.out}")


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "benchmarks"))
    main()
