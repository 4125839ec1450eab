"""Predictions at other concurrency levels, checked on a recorded sweep.

The landscape comes from ``search_efficiency.py record`` with a workload that sweeps
``concurrency_levels`` (every engine measures each level on prompts of its own)::

    python benchmarks/search_efficiency.py record --config benchmarks/landscapes/tiny_sweep.yaml \
        --out benchmarks/landscapes/tiny_sweep.json                       # ~6 min on 2 cores
    python benchmarks/concurrency.py [LANDSCAPE.json] [--out RESULTS.json]

Each level ``h`` other than the headline one is held out in turn: with ``h`` removed from every
measurement, the concurrency model (:func:`spectune.predict.fit_concurrency`) is fitted and
each measured candidate, predicted from its own headline measurement, is moved to ``h`` and
compared with what its engine measured at ``h``. Three ways of moving it, on the same fitted
baseline:

- ``sweep``: spectune's model, ``rho`` fitted per method on the other levels;
- ``roofline``: ``rho = 0`` (verification only, what a study without sweeps assumes);
- ``constant_speedup``: the speedup at the headline level kept at every level.

Figures: mean absolute relative error of output throughput and of median TPOT per held-out
level and overall, and of the baseline's own (from the step-time line). Writes
``benchmarks/results/concurrency.json`` and prints one line per figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from spectune._util import atomic_write_text  # noqa: E402
from spectune.landscape import Landscape  # noqa: E402

DEFAULT_LANDSCAPE = REPO / "benchmarks" / "landscapes" / "tiny_sweep.json"
DEFAULT_OUTPUT = REPO / "benchmarks" / "results" / "concurrency.json"
WAYS = {"sweep": None, "roofline": 0.0, "constant_speedup": 1e12}
"""How each way sets ``rho`` (None: as fitted)."""


def _error(predicted: float, measured: float) -> float:
    return abs(predicted - measured) / measured


def _held_out(baseline: Any, speculative: list[Any], level: int) -> dict[str, Any]:
    from spectune.predict import fit_concurrency, measured_prediction

    def without(m: Any) -> Any:
        return m.model_copy(update={"levels": [lv for lv in m.levels if lv.concurrency != level]})

    model = fit_concurrency(without(baseline), [without(m) for m in speculative])
    if model is None:
        raise SystemExit(f"error: holding out concurrency {level} leaves fewer than two levels to fit on")
    truth = baseline.level_at(level)
    out: dict[str, Any] = {
        "fitted_on": list(model.step.levels),
        "step_time_ms": {"a": model.step.a, "slope": model.step.slope},
        "rho": {method.value if method else "pooled": rho for method, (rho, _) in model.rho.items()},
        "rho_throughput": {method.value if method else "pooled": rho for method, (rho, _) in model.rho_throughput.items()},
        "baseline": {"throughput_error": _error(model.baseline_throughput(level), truth.output_throughput),
                     "tpot_error": _error(model.t0(level), truth.tpot_median_ms)},
        "candidates": [],
    }
    errors: dict[str, dict[str, list[float]]] = {w: {"throughput": [], "tpot": []} for w in WAYS}
    for m in speculative:
        measured = m.level_at(level)
        if measured is None or not measured.tpot_median_ms:
            continue
        p = measured_prediction([m])
        if p is None:
            continue
        row: dict[str, Any] = {"config": m.spec.label(), "measured_throughput": measured.output_throughput,
                               "measured_tpot_ms": measured.tpot_median_ms}
        for way, rho in WAYS.items():
            variant = model if rho is None else dataclasses.replace(
                model, rho={m.spec.method: (rho, 1)}, rho_throughput={m.spec.method: (rho, 1)})
            at = variant.predict(p, level)
            row[way] = {"throughput": at.output_throughput.value, "tpot_ms": at.tpot_ms.value}
            errors[way]["throughput"].append(_error(at.output_throughput.value, measured.output_throughput))
            errors[way]["tpot"].append(_error(at.tpot_ms.value, measured.tpot_median_ms))
        out["candidates"].append(row)
    if not out["candidates"]:
        raise SystemExit(f"error: no speculative candidate was measured at concurrency {level}")
    for way, e in errors.items():
        out[way] = {"throughput_error": statistics.fmean(e["throughput"]), "tpot_error": statistics.fmean(e["tpot"])}
    return out


def evaluate(path: Path, out_path: Path) -> dict[str, Any]:
    landscape = Landscape.load(path)
    measured = [p.measurement for p in landscape.by_key().values() if p.measurement is not None]  # first starts
    baseline = next(m for m in measured if m.spec.is_baseline)
    speculative = [m for m in measured if not m.spec.is_baseline and m.acceptance is not None]
    levels = [lv.concurrency for lv in baseline.levels]
    if len(levels) < 3:
        raise SystemExit(f"error: {path}: the baseline swept {levels}; holding one out needs three levels at least")
    held = {str(h): _held_out(baseline, speculative, h) for h in levels if h != baseline.concurrency}
    result: dict[str, Any] = {
        "landscape": str(path.relative_to(REPO) if path.is_relative_to(REPO) else path),
        "recorded_on": {"versions": baseline.versions.model_dump(), "hardware": baseline.hardware.model_dump()},
        "levels": levels, "headline_concurrency": baseline.concurrency,
        "candidates": [m.spec.label() for m in speculative],
        "baseline_throughput": {str(lv.concurrency): lv.output_throughput for lv in baseline.levels},
        "held_out": held,
    }
    for way in WAYS:
        result[way] = {k: statistics.fmean(h[way][k] for h in held.values()) for k in ("throughput_error", "tpot_error")}
    result["baseline"] = {k: statistics.fmean(h["baseline"][k] for h in held.values())
                          for k in ("throughput_error", "tpot_error")}
    result["throughput_error"] = result["sweep"]["throughput_error"]
    out_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_path, json.dumps(result, indent=2) + "\n")
    for h, r in held.items():
        print(f"held out concurrency {h} (fitted on {r['fitted_on']}): " + ", ".join(
            f"{way} throughput error {r[way]['throughput_error']:.3f} tpot error {r[way]['tpot_error']:.3f}"
            for way in WAYS) + f"; baseline {r['baseline']['throughput_error']:.3f}")
    for way in (*WAYS, "baseline"):
        print(f"{way}: throughput_error {result[way]['throughput_error']:.3f} "
              f"tpot_error {result[way]['tpot_error']:.3f}")
    print(f"-> {out_path}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("landscape", type=Path, nargs="?", default=DEFAULT_LANDSCAPE)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args()
    from spectune.errors import SpectuneError

    try:
        evaluate(args.landscape.resolve(), args.out)
    except SpectuneError as e:
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    main()
