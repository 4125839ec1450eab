"""Search efficiency: how few engine seconds spectune's guided search needs, on a real landscape.

Two steps:

``record``: measure every candidate of a space once on real vLLM engines (a grid study) and
keep the trials as a landscape file (:class:`spectune.landscape.Landscape`: the Measurements,
engine failures and the wall time of each trial). The default is the tiny landscape: 31
candidates (none, n-gram, the tiny draft, suffix decoding) on the project's tiny models, HumanEval
prompts, one request at a time::

    python benchmarks/search_efficiency.py record           # ~20 min on 2 cores
    python benchmarks/search_efficiency.py record --config my_study.yaml --out my.json
    python benchmarks/search_efficiency.py record --smollm2 --config benchmarks/landscapes/smollm2.yaml \
        --out benchmarks/landscapes/smollm2.json                                     # ~35 min

``evaluate``: replay studies on a landscape without engines (``run_study(measure_fn=...)``: the
real study loop, Optuna and storage, answered from the file) and compare

- guided search (spectune's default sampler), its predictions stored on its trials;
- grid search in the space's order, and random search and TPE with ``--seeds`` seeds each;

by the engine seconds spent until a configuration within ``--tolerance`` (2%) of the landscape's
best was measured (guided search is deterministic: its seeds only seed Optuna's fallback
sampler). Prediction errors, leave-one-out on the landscape: mean acceptance length of
each (proposer, k) predicted from the other trials and the baseline (replay, or truncation and
extrapolation from the same proposer at other k), and output throughput of each speculative
candidate predicted from all the others. Writes ``benchmarks/results/search_efficiency.json``::

    python benchmarks/search_efficiency.py evaluate                      # the tiny landscape
    python benchmarks/search_efficiency.py evaluate my.json --out my_results.json

Prints one line per figure. Ratios are guided / other (lower is better).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import shutil
import statistics
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from spectune._util import atomic_write_text, load_yaml_file  # noqa: E402
from spectune.landscape import Landscape  # noqa: E402

DEFAULT_CONFIG = REPO / "benchmarks" / "landscapes" / "tiny.yaml"
DEFAULT_LANDSCAPE = REPO / "benchmarks" / "landscapes" / "tiny.json"
DEFAULT_OUTPUT = REPO / "benchmarks" / "results" / "search_efficiency.json"


@contextlib.contextmanager
def _workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="spectune-bench-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _tiny_models(where: Path | None) -> tuple[str, str]:
    from spectune.checkpoints import build_tiny, default_cache_dir

    models = build_tiny(where or default_cache_dir() / "tiny")
    return str(models.target), str(models.draft)


# -- record ----------------------------------------------------------------------------------


def record(args: argparse.Namespace) -> None:
    from spectune.results import open_study
    from spectune.space import load_space
    from spectune.study import run_study

    data = load_yaml_file(args.config) or {}
    if args.smollm2:
        from spectune.checkpoints import prepare_smollm2
        from spectune.drafts import build_smollm2_draft

        data["target"], data["draft"] = str(prepare_smollm2()), str(build_smollm2_draft())
    elif "target" not in data:
        data["target"], data["draft"] = _tiny_models(args.models)
    space = load_space(data["space"]).resolve(data["target"], draft=data.get("draft"))
    n = len(space.enumerate())
    with _workdir() as work:
        url = f"sqlite:///{work / 'landscape.db'}"
        overrides = {"storage": url, "study_name": "landscape", "sampler": "grid", "trials": n,
                     "log_dir": str(work / "logs"), "confirm": 0}  # one engine per candidate
        from spectune._util import validate
        from spectune.study import StudyConfig

        config = validate(StudyConfig, {**data, **overrides}, str(args.config))
        print(f"recording {n} candidates of {data['space']} on {data['target']}", file=sys.stderr, flush=True)
        run_study(config, progress=lambda e: e.kind == "trial_end" and print(
            f"  {e.number}/{e.total} {e.state} {e.label} {e.values or e.reason}", file=sys.stderr, flush=True))
        landscape = Landscape.from_study(open_study(url, "landscape"))
    stored = {k: v for k, v in landscape.study_config.items() if k not in ("storage", "study_name", "log_dir")}
    landscape.model_copy(update={"study_config": stored}).save(args.out)
    print(f"{len(landscape.points)} candidates -> {args.out}")


# -- evaluate --------------------------------------------------------------------------------


def _trace(landscape: Landscape, config: Any, objective: str) -> dict[str, Any]:
    """Run one replayed study; what it measured in order, and its engine seconds."""
    from spectune.results import open_study
    from spectune.study import run_study

    spent: list[tuple[str, float]] = []
    run_study(config, measure_fn=landscape.measurer(spent))
    view = open_study(config.storage, config.study_name)
    predicted = [{"config": t.user_attrs.get("config"), "reason": t.user_attrs.get("guide_reason"),
                  "predicted": t.user_attrs[f"predicted_{objective}"],
                  "measured": t.values[0] if t.values else None}
                 for t in view.study.get_trials(deepcopy=False) if f"predicted_{objective}" in t.user_attrs]
    return {"measured": [label for label, _ in spent], "seconds": [s for _, s in spent],
            "guide": view.study.user_attrs.get("guide"), "predictions": predicted}


def _seconds_to_reach(trace: dict[str, Any], good: set[str]) -> float | None:
    """Engine seconds until the first configuration in ``good`` was measured (None: never)."""
    total = 0.0
    for label, seconds in zip(trace["measured"], trace["seconds"], strict=True):
        total += seconds
        if label in good:
            return total
    return None


def _strategy(landscape: Landscape, work: Path, name: str, seed: int, trials: int, objective: str) -> dict[str, Any]:
    config = landscape.config(storage=f"sqlite:///{work / f'{name}-{seed}.db'}", study_name=f"{name}-{seed}",
                              sampler=name, seed=seed, trials=trials, log_dir=str(work / "logs"))
    return _trace(landscape, config, objective)


def _prediction_errors(landscape: Landscape, objective: str) -> dict[str, Any]:
    """Leave-one-out errors of acceptance length (held-out k) and of the objective."""
    from spectune.predict import predict_candidates
    from spectune.predict._measured import effective_k, measured_profile, proposer_of

    points = [p for p in landscape.points if p.measurement is not None]
    base = next(p for p in points if p.spec.get("method", "none") == "none").measurement
    spec_points = [p for p in points if p.spec.get("method", "none") != "none"]
    accept, value = [], []
    for p in spec_points:
        m = p.measurement
        assert m is not None and base is not None
        profile = measured_profile(m)
        others = [q.measurement for q in spec_points if q is not p and q.measurement is not None]
        # acceptance at a held-out k: from the other k of the same proposer (or replay)
        same = [o for o in others if proposer_of(o.spec) == proposer_of(m.spec)]
        if profile is not None and effective_k(m.spec) and (same or m.spec.method.value in ("ngram", "suffix")):
            pred = predict_candidates([m.spec], base, same, objective=objective)[0]
            accept.append({"config": p.label, "source": pred.source, "measured": profile.mean_acceptance_length,
                           "predicted": pred.mean_acceptance_length,
                           "error": abs(pred.mean_acceptance_length / profile.mean_acceptance_length - 1.0)})
        pred = predict_candidates([m.spec], base, others, objective=objective)[0]
        measured = landscape.value(p, objective)
        assert measured is not None
        value.append({"config": p.label, "source": pred.source, "cost_source": pred.cost_source,
                      "measured": measured, "predicted": pred.value.value,
                      "low": pred.value.low, "high": pred.value.high,
                      "error": abs(pred.value.value / measured - 1.0)})
    return {"acceptance_length": accept, objective: value}


def _engine_speed(landscape: Landscape, objective: str) -> dict[str, Any]:
    """How fast each engine was, apart from its configuration: the median TTFT of the same
    prompts (speculation does not touch the prefill), and the objective of each method scaled by
    its engine's TTFT against the baseline's (min, max per method)."""
    points = [p for p in landscape.points if p.measurement is not None and p.measurement.ttft_ms.median]
    base = next(p for p in points if p.spec.get("method", "none") == "none").measurement
    assert base is not None and base.ttft_ms.median
    ttft = {p.label: p.measurement.ttft_ms.median for p in points}  # type: ignore[union-attr]
    scaled: dict[str, list[float]] = {}
    for p in points:
        value = landscape.value(p, objective)
        if value is not None:
            scaled.setdefault(p.spec.get("method", "none"), []).append(value * ttft[p.label] / base.ttft_ms.median)
    return {"ttft_ms_min": min(ttft.values()), "ttft_ms_max": max(ttft.values()),
            "ttft_scaled_by_method": {k: [min(v), max(v)] for k, v in scaled.items()}}


def evaluate(args: argparse.Namespace) -> None:
    from spectune.study import Objective, relative_noise

    landscape = Landscape.load(args.landscape)
    here = [landscape.target, *([landscape.draft] if landscape.draft else [])]
    if not all(Path(m).exists() for m in here):  # recorded elsewhere: no engine runs, names will do
        logging.getLogger("spectune.pairing").setLevel(logging.ERROR)
        draft = f"landscape/{Path(landscape.draft).name}" if landscape.draft else None
        landscape = landscape.rebase(f"landscape/{Path(landscape.target).name}", draft)
    objective = landscape.config().objectives[0]
    sign = 1.0 if objective.maximize else -1.0
    values = {p.label: v for p in landscape.points if (v := landscape.value(p, objective.value)) is not None}
    best_label = max(values, key=lambda k: sign * values[k])
    best = values[best_label]
    good = {k for k, v in values.items() if sign * (v - best) >= -args.tolerance * abs(best)}
    total = sum(p.engine_seconds for p in landscape.points)
    n = len(landscape.points)
    seeds = list(range(args.seeds))
    results: dict[str, Any] = {}
    with _workdir() as work:
        runs = {"guided": [_strategy(landscape, work, "guided", s, n, objective.value) for s in seeds],
                "grid": [_strategy(landscape, work, "grid", 0, n, objective.value)],
                "random": [_strategy(landscape, work, "random", s, n, objective.value) for s in seeds],
                "tpe": [_strategy(landscape, work, "tpe", s, n, objective.value) for s in seeds]}
    mean: dict[str, float | None] = {}  # None: some run never got there (null in the JSON)
    for name, traces in runs.items():
        reach = [_seconds_to_reach(t, good) for t in traces]
        mean[name] = None if None in reach else statistics.fmean(r for r in reach if r is not None)
        results[name] = {
            "seconds_to_reach": reach,
            "mean_seconds_to_reach": mean[name],
            "trials_to_reach": [next((i + 1 for i, lb in enumerate(t["measured"]) if lb in good), None) for t in traces],
            "measured": [len(t["measured"]) for t in traces],
            "total_seconds": [round(sum(t["seconds"]), 1) for t in traces],
            "found": [any(lb in good for lb in t["measured"]) for t in traces],
        }

    def ratio(other: str) -> float | None:  # null where guided search never got there (it stopped first)
        g, o = mean["guided"], mean[other]
        return g / o if g is not None and o else None

    errors = _prediction_errors(landscape, objective.value)
    out = {
        "landscape": str(args.landscape.relative_to(REPO) if args.landscape.is_relative_to(REPO) else args.landscape),
        "evaluated_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "objective": objective.value, "tolerance": args.tolerance, "seeds": seeds,
        "candidates": n, "landscape_engine_seconds": round(total, 1),
        "landscape_window_noise": statistics.fmean(relative_noise(objective, p.measurement) or 0.0
                                                   for p in landscape.points if p.measurement is not None),
        "engine_speed": _engine_speed(landscape, objective.value),
        "best": {"config": best_label, "value": best,
                 "speedup": best / values.get("none", best) if objective is Objective.OUTPUT_THROUGHPUT else None},
        "within_tolerance": sorted(good),
        "grid_engine_seconds_ratio": ratio("grid"),
        "random_engine_seconds_ratio": ratio("random"),
        "tpe_engine_seconds_ratio": ratio("tpe"),
        "guided_stop_seconds_ratio": statistics.fmean(results["guided"]["total_seconds"]) / total,
        "acceptance_length_error": statistics.fmean(e["error"] for e in errors["acceptance_length"]),
        "throughput_error": statistics.fmean(e["error"] for e in errors[objective.value]),
        "strategies": results,
        "guided_trace": runs["guided"][0],
        "prediction_errors": errors,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(out, indent=1) + "\n")
    print(f"landscape: {n} candidates, {total:.0f} engine seconds; best {best_label} ({best:.4g} {objective.value})")
    for name, r in results.items():
        took = f"{mean[name]:.0f} s" if mean[name] is not None else "did not"
        print(f"{name:>7}: {took} to reach within {args.tolerance:.0%} "
              f"(trials {r['trials_to_reach']}, measured {r['measured']})")
    print(f"mean window noise of the landscape (MAD / median): {out['landscape_window_noise']:.3f}")
    speed = out["engine_speed"]
    print(f"median TTFT of the same prompts across engines: {speed['ttft_ms_min']:.0f}-{speed['ttft_ms_max']:.0f} ms; "
          "scaled by it, " + ", ".join(f"{k} {v[0]:.3g}-{v[1]:.3g}" for k, v in speed["ttft_scaled_by_method"].items()))
    for key in ("grid_engine_seconds_ratio", "random_engine_seconds_ratio", "tpe_engine_seconds_ratio",
                "guided_stop_seconds_ratio", "acceptance_length_error", "throughput_error"):
        print(f"{key}: {out[key]:.3f}" if out[key] is not None else f"{key}: - (guided search did not reach it)")
    print(f"-> {args.out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="measure every candidate once on real engines")
    rec.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="study configuration (YAML)")
    rec.add_argument("--models", type=Path, default=None, help="folder for the tiny models (default: the cache)")
    rec.add_argument("--smollm2", action="store_true",
                     help="SmolLM2-135M-Instruct and its draft (prepared once) instead of the tiny models")
    rec.add_argument("--out", type=Path, default=DEFAULT_LANDSCAPE)
    ev = sub.add_parser("evaluate", help="compare search strategies on a recorded landscape")
    ev.add_argument("landscape", type=Path, nargs="?", default=DEFAULT_LANDSCAPE)
    ev.add_argument("--seeds", type=int, default=5)
    ev.add_argument("--tolerance", type=float, default=0.02)
    ev.add_argument("--out", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from spectune.errors import SpectuneError

    try:
        record(args) if args.command == "record" else evaluate(args)
    except SpectuneError as e:
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    main()
