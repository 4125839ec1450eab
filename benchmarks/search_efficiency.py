"""Search efficiency: how few engine seconds spectune's guided search needs, on a real landscape.

Two steps:

``record``: measure every candidate of a space on real vLLM engines (a grid study) and keep
the trials as a landscape file (:class:`spectune.landscape.Landscape`: the Measurements, engine
failures and the wall time of each trial). ``--starts N`` records the grid N times, so that each
candidate has N engine starts; ``--append`` adds them to the landscape already in ``--out``.
The default is the tiny landscape: 31 candidates (none, n-gram, the tiny draft, suffix
decoding) on the project's tiny models, HumanEval prompts, one request at a time::

    python benchmarks/search_efficiency.py record           # ~15-20 min per pass on 2 cores
    python benchmarks/search_efficiency.py record --starts 3  # the default landscape, 3 starts each
    python benchmarks/search_efficiency.py record --config my_study.yaml --out my.json
    python benchmarks/search_efficiency.py record --smollm2 --config benchmarks/landscapes/smollm2.yaml \
        --out benchmarks/landscapes/smollm2.json                                     # ~35 min
    python benchmarks/search_efficiency.py record --out benchmarks/landscapes/tiny_epyc.json \
        --starts 2 --append                                                         # ~40 min
    python benchmarks/search_efficiency.py record --config benchmarks/landscapes/tiny_pinned.yaml \
        --out benchmarks/landscapes/tiny_pinned.json --starts 2     # SPECTUNE_CPU_PIN=1, ~60 min

``evaluate``: replay studies on a landscape without engines (``run_study(measure_fn=...)``: the
real study loop, Optuna and storage, answered from the file; a candidate measured again gets
its next recorded engine start), with the landscape's models built or prepared here where the
project can (:func:`models_here`: the draft model's acceptance is then replayed as a study on
this machine would replay it), and compare:

- guided search (spectune's default sampler), its predictions stored on its trials, alone and
  with ``confirm: 2`` (``guided_confirm``);
- grid search in the space's order, and random search and TPE with ``--seeds`` seeds each;

by the engine seconds spent until a configuration within ``--tolerance`` (2%) of the landscape's
best was measured, and until one within the landscape's noise band of it
(:meth:`~spectune.landscape.Landscape.noise_band`: the ``_band`` figures; guided search is
deterministic, its seeds only seed Optuna's fallback sampler), and by the *regret* of the configuration each study finally chooses
(:meth:`spectune.results.StudyView.best`): how far below the best its value is. A candidate's
value is its mean over its recorded engine starts, so that on a landscape with several starts
per candidate the best is not just the luckiest engine. Prediction errors, leave-one-out on the
landscape: mean acceptance length of each (proposer, k) predicted from the other trials and the
baseline (replay, or truncation and extrapolation from the same proposer at other k), and output
throughput of each speculative candidate predicted from the others' first engine start,
against its mean (and against its first start). With several starts per candidate it also
writes how far one engine start lies from its candidate's mean (``engine_speed.spread``), how
far a prediction at each candidate's true value would lie from that mean
(``throughput_target_noise``, :func:`target_noise`: the part of the throughput error that is the
recording's own noise), and the cost model fitted on every first start (``cost_fit``). Writes
``benchmarks/results/search_efficiency.json``::

    python benchmarks/search_efficiency.py evaluate                      # the tiny landscape
    python benchmarks/search_efficiency.py evaluate my.json --out my_results.json
    python benchmarks/search_efficiency.py evaluate benchmarks/landscapes/smollm2.json --no-draft-replay \
        --out benchmarks/results/no_draft_replay/search_efficiency_smollm2.json   # the draft from its trials

Prints one line per figure. Ratios are guided / other (lower is better).
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
from typing import TYPE_CHECKING, Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from spectune._util import atomic_write_text, load_yaml_file  # noqa: E402
from spectune.landscape import Landscape  # noqa: E402

from bench_common import models_by_name, models_here, tiny_models, workdir  # noqa: E402
from prediction_errors import _cost_fit, _engine_speed, _prediction_errors, target_noise  # noqa: E402

if TYPE_CHECKING:
    pass

DEFAULT_CONFIG = REPO / "benchmarks" / "landscapes" / "tiny.yaml"
DEFAULT_LANDSCAPE = REPO / "benchmarks" / "landscapes" / "tiny.json"
DEFAULT_OUTPUT = REPO / "benchmarks" / "results" / "search_efficiency.json"


# -- record ----------------------------------------------------------------------------------


def record(args: argparse.Namespace) -> None:
    from spectune.results import open_study
    from spectune.worker import run_study

    if args.starts < 1:
        raise SystemExit(f"error: --starts {args.starts}: record the grid at least once")
    data = load_yaml_file(args.config) or {}
    if args.smollm2:
        from spectune.checkpoints import build_smollm2_draft, prepare_smollm2

        data["target"] = str(prepare_smollm2())
        space = Path(data.get("space", ""))
        if not space.is_file() or "${draft}" in space.read_text():  # distilled once, where the space runs a draft
            data["draft"] = str(build_smollm2_draft())
    elif "target" not in data:
        data["target"], data["draft"] = tiny_models(args.models)
    from spectune._util import validate
    from spectune.study import StudyConfig, resolved_space

    # the study's own space: drafts under the methods they serve, heads built beside the target
    n = len(resolved_space(validate(StudyConfig, {**data, "trials": 1}, str(args.config))).enumerate())

    def study_config(overrides: dict[str, Any]) -> StudyConfig:
        return validate(StudyConfig, {**data, **overrides, "sampler": "grid", "trials": n, "confirm": 0},
                        str(args.config))  # one engine per candidate and pass

    def kept(cfg: StudyConfig) -> dict[str, Any]:
        return {k: v for k, v in json.loads(cfg.model_dump_json()).items()
                if k not in ("storage", "study_name", "log_dir")}

    landscape = Landscape.load(args.out) if args.append and args.out.exists() else None
    if landscape is not None:  # the same study, checked before the first engine starts
        Landscape.combine([landscape, landscape.model_copy(update={"study_config": kept(study_config({}))})])
    with workdir() as work:
        for i in range(args.starts):
            url, name = f"sqlite:///{work / 'landscape.db'}", f"landscape-{i}"
            config = study_config({"storage": url, "study_name": name, "log_dir": str(work / "logs")})
            print(f"recording {n} candidates of {data['space']} on {data['target']} (pass {i + 1} of {args.starts})",
                  file=sys.stderr, flush=True)
            run_study(config, progress=lambda e: e.kind == "trial_end" and print(
                f"  {e.number}/{e.total} {e.state} {e.label} {e.values or e.reason}", file=sys.stderr, flush=True))
            recorded = Landscape.from_study(open_study(url, name))
            recorded = recorded.model_copy(update={"study_config": kept(config)})
            landscape = recorded if landscape is None else Landscape.combine([landscape, recorded])
            landscape.save(args.out)  # after each pass: an interrupted recording keeps the passes done
    assert landscape is not None
    starts = len(landscape.points) / len(landscape.engines())
    print(f"{len(landscape.engines())} candidates, {starts:.3g} engine starts each -> {args.out}")


# -- evaluate --------------------------------------------------------------------------------


def _trace(landscape: Landscape, config: Any, objective: str) -> dict[str, Any]:
    """Run one replayed study; what it measured in order, and its engine seconds."""
    from spectune.results import open_study
    from spectune.worker import run_study

    spent: list[tuple[str, float]] = []
    run_study(config, measure_fn=landscape.measurer(spent))
    view = open_study(config.storage, config.study_name)
    predicted = [{"config": t.user_attrs.get("config"), "reason": t.user_attrs.get("guide_reason"),
                  "predicted": t.user_attrs[f"predicted_{objective}"],
                  "measured": t.values[0] if t.values else None}
                 for t in view.study.get_trials(deepcopy=False) if f"predicted_{objective}" in t.user_attrs]
    choice = view.best()
    return {"measured": [label for label, _ in spent], "seconds": [s for _, s in spent],
            "chosen": choice.row.label, "guide": view.study.user_attrs.get("guide"), "predictions": predicted}


def _seconds_to_reach(trace: dict[str, Any], good: set[str]) -> float | None:
    """Engine seconds until the first configuration in ``good`` was measured (None: never)."""
    total = 0.0
    for label, seconds in zip(trace["measured"], trace["seconds"], strict=True):
        total += seconds
        if label in good:
            return total
    return None


def _strategy(landscape: Landscape, work: Path, name: str, seed: int, trials: int, objective: str,
              confirm: int = 0) -> dict[str, Any]:
    sampler = name.split("_")[0]
    config = landscape.config(storage=f"sqlite:///{work / f'{name}-{seed}.db'}", study_name=f"{name}-{seed}",
                              sampler=sampler, seed=seed, trials=trials, confirm=confirm, log_dir=str(work / "logs"))
    return _trace(landscape, config, objective)


def _strategy_results(runs: dict[str, list[dict[str, Any]]], good: set[str], near: set[str], values: dict[str, float],
                      best: float, sign: float) -> tuple[dict[str, Any], dict[str, float | None], dict[str, float | None]]:
    """Each strategy's runs scored: engine seconds until a configuration within the tolerance (``good``)
    and within the noise band (``near``) of the best was measured, and the regret of its choice; with
    the mean seconds of each (None where a run never got there)."""
    results: dict[str, Any] = {}

    def mean_of(reach: list[float | None]) -> float | None:  # None: some run never got there (null in the JSON)
        return None if None in reach else statistics.fmean(r for r in reach if r is not None)

    mean: dict[str, float | None] = {}
    mean_band: dict[str, float | None] = {}
    for name, traces in runs.items():
        reach, reach_band = ([_seconds_to_reach(t, target) for t in traces] for target in (good, near))
        mean[name], mean_band[name] = mean_of(reach), mean_of(reach_band)
        regret = [max(0.0, sign * (best - values[t["chosen"]]) / abs(best)) for t in traces]
        results[name] = {
            "seconds_to_reach": reach,
            "mean_seconds_to_reach": mean[name],
            "seconds_to_reach_band": reach_band,
            "mean_seconds_to_reach_band": mean_band[name],
            "trials_to_reach": [next((i + 1 for i, lb in enumerate(t["measured"]) if lb in good), None) for t in traces],
            "measured": [len(t["measured"]) for t in traces],
            "total_seconds": [round(sum(t["seconds"]), 1) for t in traces],
            "found": [any(lb in good for lb in t["measured"]) for t in traces],
            "chosen": [t["chosen"] for t in traces],
            "regret": regret,
            "mean_regret": statistics.fmean(regret),
        }

    return results, mean, mean_band


def _print_evaluation(out: dict[str, Any], results: dict[str, Any], mean: dict[str, float | None], tolerance: float,
                      best_label: str, objective: str) -> None:
    """One line per figure of ``evaluate``'s result."""
    n, starts, total, band = (out["candidates"], out["engine_starts_per_candidate"], out["landscape_engine_seconds"],
                              out["noise_band"])
    best, near = out["best"]["value"], out["within_noise_band"]
    print(f"landscape: {n} candidates, {starts:.3g} engine starts each, {total:.0f} engine seconds per grid; "
          f"best {best_label} ({best:.4g} {objective}{', mean over its starts' if starts > 1 else ''})")
    for name, r in results.items():
        took = f"{mean[name]:.0f} s" if mean[name] is not None else "did not"
        print(f"{name:>14}: {took} to reach within {tolerance:.0%} "
              f"(trials {r['trials_to_reach']}, measured {r['measured']}); chose with regret "
              + " ".join(f"{x:.1%}" for x in r["regret"]))
    print(f"mean window noise of the landscape (MAD / median): {out['landscape_window_noise']:.3f}")
    speed = out["engine_speed"]
    print(f"median TTFT of the same prompts across engines: {speed['ttft_ms_min']:.0f}-{speed['ttft_ms_max']:.0f} ms; "
          "brought to its method's typical engine by it, " + ", ".join(f"{k} {v[0]:.3g}-{v[1]:.3g}" for k, v in speed["ttft_scaled_by_method"].items()))
    if "spread" in speed:
        sp = speed["spread"]
        print(f"one engine start against its candidate's mean: {sp['single_engine_error']:.1%} "
              f"({sp['ttft_scaled_single_engine_error']:.1%} brought to a typical engine by its TTFT, "
              f"{sp['weighted_single_engine_error']:.1%} by the cost model's gauge at its weight, "
              f"{speed['gauge_weight']:.2f}"
              + (f", {e:.1%} by the engine's own prefill" if (e := sp["engine_prefill_scaled_single_engine_error"])
                 is not None else "") + "); max/min of one candidate's "
              f"starts: median {sp['max_over_min_median']:.3f}, largest {sp['max_over_min_largest']:.3f}"
              + (f"; correlation with the next start's deviation {c:.2f}"
                 if (c := sp["next_start_correlation"]) is not None else "")
              + "; mean deviation of each pass's starts " + " ".join(f"{b:+.1%}" for b in sp["pass_bias"]))
    print("cost of a speculative step, relative to the target's (first starts): " + ", ".join(
        f"{k} {v['overhead']:.2f} + {v['c']:.3f} per drafted token" for k, v in out["cost_fit"].items()))
    print(f"the landscape's noise band (twice one engine start's spread around its candidate's mean): {band:.1%}, "
          f"{len(near)} configurations within it of the best")
    for key in ("grid_engine_seconds_ratio", "random_engine_seconds_ratio", "tpe_engine_seconds_ratio",
                "grid_engine_seconds_ratio_band", "random_engine_seconds_ratio_band", "tpe_engine_seconds_ratio_band",
                "guided_stop_seconds_ratio", "guided_confirm_stop_seconds_ratio", "acceptance_length_error",
                "throughput_error", "throughput_error_first_engine", "throughput_target_noise"):
        print(f"{key}: {out[key]:.3f}" if out[key] is not None else f"{key}: - (one start per candidate)"
              if key == "throughput_target_noise" else f"{key}: - (a run never came within tolerance)")


def evaluate(args: argparse.Namespace) -> None:
    from spectune.measurement import Objective, relative_noise

    landscape = Landscape.load(args.landscape)
    landscape = models_by_name(landscape) if args.no_draft_replay else models_here(landscape)
    objective = landscape.config().objectives[0]
    sign = 1.0 if objective.maximize else -1.0
    values = landscape.means(objective.value)
    best_label = max(values, key=lambda k: sign * values[k])
    best = values[best_label]
    good = {k for k, v in values.items() if sign * (v - best) >= -args.tolerance * abs(best)}
    band = landscape.noise_band(objective.value, floor=args.tolerance)
    near = {k for k, v in values.items() if sign * (v - best) >= -band * abs(best)}  # within the noise band
    first = list(landscape.by_key().values())
    total = sum(p.engine_seconds for p in first)  # one engine start per candidate: the grid
    n = len(first)
    starts = len(landscape.points) / n
    seeds = list(range(args.seeds))
    with workdir() as work:
        runs = {"guided": [_strategy(landscape, work, "guided", s, n, objective.value) for s in seeds],
                "guided_confirm": [_strategy(landscape, work, "guided_confirm", s, n, objective.value, confirm=2)
                                   for s in seeds],
                "grid": [_strategy(landscape, work, "grid", 0, n, objective.value)],
                "random": [_strategy(landscape, work, "random", s, n, objective.value) for s in seeds],
                "tpe": [_strategy(landscape, work, "tpe", s, n, objective.value) for s in seeds]}
    results, mean, mean_band = _strategy_results(runs, good, near, values, best, sign)

    def ratio(other: str, means: dict[str, float | None] = mean) -> float | None:  # null: a run never got there
        g, o = means["guided"], means[other]
        return g / o if g is not None and o else None

    errors = _prediction_errors(landscape, objective.value)
    out = {
        "landscape": str(args.landscape.relative_to(REPO) if args.landscape.is_relative_to(REPO) else args.landscape),
        "draft_replay": not args.no_draft_replay,
        "evaluated_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "objective": objective.value, "tolerance": args.tolerance, "seeds": seeds,
        "candidates": n, "engine_starts_per_candidate": starts, "landscape_engine_seconds": round(total, 1),
        "landscape_window_noise": statistics.fmean(relative_noise(objective, p.measurement) or 0.0
                                                   for p in landscape.points if p.measurement is not None),
        "engine_speed": _engine_speed(landscape, objective.value, objective.maximize),
        "cost_fit": _cost_fit(landscape),
        "best": {"config": best_label, "value": best,
                 "speedup": best / values.get("none", best) if objective is Objective.OUTPUT_THROUGHPUT else None},
        "within_tolerance": sorted(good),
        "grid_engine_seconds_ratio": ratio("grid"),
        "random_engine_seconds_ratio": ratio("random"),
        "tpe_engine_seconds_ratio": ratio("tpe"),
        "noise_band": band,
        "within_noise_band": sorted(near),
        "grid_engine_seconds_ratio_band": ratio("grid", mean_band),
        "random_engine_seconds_ratio_band": ratio("random", mean_band),
        "tpe_engine_seconds_ratio_band": ratio("tpe", mean_band),
        "guided_stop_seconds_ratio": statistics.fmean(results["guided"]["total_seconds"]) / total,
        "guided_confirm_stop_seconds_ratio": statistics.fmean(results["guided_confirm"]["total_seconds"]) / total,
        "acceptance_length_error": statistics.fmean(e["error"] for e in errors["acceptance_length"]),
        "throughput_error": statistics.fmean(e["error"] for e in errors[objective.value]),
        "throughput_error_first_engine": statistics.fmean(e["error_first_engine"] for e in errors[objective.value]),
        "throughput_target_noise": target_noise(landscape, objective.value),
        "strategies": results,
        "guided_trace": runs["guided"][0],
        "prediction_errors": errors,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(out, indent=1) + "\n")
    _print_evaluation(out, results, mean, args.tolerance, best_label, objective.value)
    print(f"-> {args.out}")


def starts(args: argparse.Namespace) -> None:
    """Every recorded engine start of the landscape's candidates (those whose label contains one
    of ``--config``, all without it), in recording order: its objective, the client's median
    TTFT and the engine core's own prefill (:func:`spectune.predict.engine_prefill_ms`; - where
    not recorded) and its engine seconds; a failed start with its error. The per-start figures
    behind ``engine_speed`` of ``evaluate``, read from the file alone."""
    from spectune.predict import engine_prefill_ms

    landscape = Landscape.load(args.landscape)
    objective = landscape.config().objectives[0].value
    print(f"{'configuration':<34} {'start':>5} {objective:>18} {'TTFT ms':>8} {'prefill ms':>10} {'engine s':>8}")
    for engines in landscape.engines().values():
        label = engines[0].label
        if args.config and not any(c in label for c in args.config):
            continue
        for j, p in enumerate(engines, 1):
            m = p.measurement
            if m is None:
                print(f"{label:<34} {j:>5} failed: {p.error}")
                continue
            value, prefill = landscape.value(p, objective), engine_prefill_ms(m)
            print(f"{label:<34} {j:>5} {value:>18.4g} {m.ttft_ms.median or math.nan:>8.1f} "
                  f"{'-' if prefill is None else f'{prefill:.1f}':>10} {p.engine_seconds:>8.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="measure every candidate on real engines")
    rec.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="study configuration (YAML)")
    rec.add_argument("--models", type=Path, default=None, help="folder for the tiny models (default: the cache)")
    rec.add_argument("--smollm2", action="store_true",
                     help="SmolLM2-135M-Instruct and its draft (prepared once) instead of the tiny models")
    rec.add_argument("--out", type=Path, default=DEFAULT_LANDSCAPE)
    rec.add_argument("--starts", type=int, default=1,
                     help="record the grid this many times: that many engine starts per candidate")
    rec.add_argument("--append", action="store_true",
                     help="add the new engine starts to the landscape in --out, if there is one (same study)")
    ev = sub.add_parser("evaluate", help="compare search strategies on a recorded landscape")
    ev.add_argument("landscape", type=Path, nargs="?", default=DEFAULT_LANDSCAPE)
    ev.add_argument("--seeds", type=int, default=5)
    ev.add_argument("--tolerance", type=float, default=0.02)
    ev.add_argument("--out", type=Path, default=DEFAULT_OUTPUT)
    ev.add_argument("--no-draft-replay", action="store_true",
                    help="leave the models where they were recorded: the draft is predicted from its trials")
    st = sub.add_parser("starts", help="print every recorded engine start of a landscape's candidates")
    st.add_argument("landscape", type=Path, nargs="?", default=DEFAULT_LANDSCAPE)
    st.add_argument("--config", action="append",
                    help="only candidates whose label contains this (repeatable), e.g. 'none' or 'suffix k=16'")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from spectune.errors import SpectuneError

    try:
        {"record": record, "evaluate": evaluate, "starts": starts}[args.command](args)
    except SpectuneError as e:
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    main()
