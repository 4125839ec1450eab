"""Leave-one-out prediction errors on a recorded landscape, and how far its engine starts differ:
what ``search_efficiency.py evaluate`` writes beside the engine seconds (the recording's own share of
the throughput error, ``target_noise``; the cost model fitted on every first start; each start's
distance from its candidate's mean)."""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from spectune.landscape import Landscape, LandscapePoint  # noqa: E402

if TYPE_CHECKING:
    from spectune.measurement import Measurement



# -- record ----------------------------------------------------------------------------------


def _prediction_errors(landscape: Landscape, objective: str) -> dict[str, Any]:
    """Leave-one-out errors of acceptance length (held-out k) and of the objective (against the
    held-out candidate's mean over its engine starts, and its first start), predicted from the
    first engine start of every other candidate."""
    from spectune.predict import (
        effective_k,
        measured_profile,
        predict_candidates,
        proposer_of,
    )

    means = landscape.means(objective)
    points = [p for p in landscape.by_key().values() if p.measurement is not None]
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
        first = landscape.value(p, objective)
        assert first is not None
        measured = means[p.label]
        value.append({"config": p.label, "source": pred.source, "cost_source": pred.cost_source,
                      "measured": measured, "first_engine": first, "predicted": pred.value.value,
                      "low": pred.value.low, "high": pred.value.high,
                      "error": abs(pred.value.value / measured - 1.0),
                      "error_first_engine": abs(pred.value.value / first - 1.0)})
    return {"acceptance_length": accept, objective: value}


def target_noise(landscape: Landscape, objective: str) -> float | None:
    """How far, on average, a prediction exactly at each speculative candidate's true value
    would lie from the mean over its recorded engine starts, the measured value that
    ``throughput_error`` scores against: ``sqrt(2 / pi) * s / sqrt(n)``, the mean absolute
    deviation of a mean of ``n`` normal draws, with ``s`` the landscape's pooled spread of one
    start (:meth:`~spectune.landscape.Landscape.engine_spread`) and ``n`` the candidate's
    starts. A throughput error about this large is the recording's noise, not the predictor's:
    more starts per candidate shrink it. None on a landscape of one start per candidate."""
    spread = landscape.engine_spread(objective)
    if spread is None:
        return None
    starts = landscape.starts(objective)
    counts = [len(starts[p.key]) for p in landscape.by_key().values()
              if p.measurement is not None and not p.measurement.spec.is_baseline and starts[p.key]]
    return statistics.fmean(math.sqrt(2.0 / math.pi) * spread / math.sqrt(n) for n in counts) if counts else None


def _cost_fit(landscape: Landscape) -> dict[str, Any]:
    """The throughput cost model fitted on every candidate's first engine start, per method:
    ``c`` per drafted token, the fixed ``overhead`` of a speculative step (both relative to a step
    of the target alone) and how many configurations they rest on."""
    from spectune.predict import fit_cost_model

    t0, throughput, points = _first_start_points(landscape)
    model = fit_cost_model(t0, throughput, points)
    return {method.value: {"c": cost.c, "overhead": cost.overhead, "configurations": cost.n}
            for method, cost in model.methods.items()}


def _first_start_points(landscape: Landscape) -> tuple[float, float, list[Any]]:
    """The baseline's TPOT and throughput and the cost points of every candidate's first engine
    start, as a study that measured each once would fit them."""
    from spectune.predict import CostPoint

    measured = [p.measurement for p in landscape.by_key().values() if p.measurement is not None]
    base = next(m for m in measured if m.spec.is_baseline)
    assert base.tpot_ms.median is not None
    points = [c for m in measured if (c := CostPoint.from_measurement(m, throughput_of=base)) is not None]
    return base.tpot_ms.median, base.output_throughput, points


def _lag1(series: list[float]) -> float | None:
    """Lag-1 autocorrelation of ``series``: near 0 when each value is on its own, toward 1 when
    neighbours share a drift."""
    if len(series) < 3:
        return None
    mean = statistics.fmean(series)
    var = sum((x - mean) ** 2 for x in series)
    return sum((a - mean) * (b - mean) for a, b in zip(series, series[1:], strict=False)) / var if var else None


def _engine_speed(landscape: Landscape, objective: str, maximize: bool) -> dict[str, Any]:
    """How fast each engine was, apart from its configuration: the median TTFT of the same
    prompts, and the objective of each method brought to its proposer's typical engine by it, as
    the cost model does where the trials lack the engine's own timing
    (:func:`spectune.predict._cost.engine_speeds`; min, max per method; the baseline as measured). With several engine starts
    per candidate, ``spread``: the mean relative distance of one start from its candidate's mean
    (``single_engine_error``), the same after bringing each start to the typical engine
    (``ttft_scaled_single_engine_error``: smaller if TTFT tells a slow engine;
    ``engine_prefill_scaled_single_engine_error`` by the engine core's own prefill instead,
    :func:`spectune.predict.engine_prefill_ms`, None on a landscape recorded without it; and
    ``weighted_single_engine_error``, by the cost model's gauge (the engine's prefill for a
    proposer whose every first start has it, :func:`spectune.predict._gauge.gauged_speeds`) at the power it gives that gauge on
    the first starts, ``gauge_weight``, :func:`spectune.predict._cost.gauge_weight`), the largest
    max/min of one candidate's starts, and ``next_start_correlation``: the correlation of one
    start's deviation from its candidate's mean with that of the start recorded next, whatever
    its candidate (near 0: each engine is fast or slow on its own; toward 1: the machine drifts,
    and starts close in time share it), and ``pass_bias``: the mean of that deviation over each
    candidate's first start, second start, and so on (one per recording pass: a pass run while
    the machine was slower reads below 0, and a predictor fitted on it follows it)."""
    from spectune.predict import (
        effective_k,
        engine_gauge_ms,
        engine_prefill_ms,
        engine_speeds,
        gauge_weight,
    )
    from spectune.predict._gauge import proposers_gauged_by_prefill

    speed: dict[int, tuple[float, float]] = {}  # id of a point -> (objective, median TTFT)
    for p in landscape.points:
        value = landscape.value(p, objective)
        if value is not None and p.measurement is not None and p.measurement.ttft_ms.median:
            speed[id(p)] = (value, p.measurement.ttft_ms.median)
    gauged = [p for p in landscape.points if id(p) in speed and p.measurement is not None
              and not p.measurement.spec.is_baseline]

    def speeds_by(gauge: Callable[[Measurement], float | None]) -> dict[int, float]:
        return dict(zip(map(id, gauged), engine_speeds(
            [(m.spec.method, m.spec.model, effective_k(m.spec) or 0, gauge(m))
             for p in gauged if (m := p.measurement) is not None]), strict=True))

    engine, by_prefill = speeds_by(engine_gauge_ms), speeds_by(engine_prefill_ms)
    has_prefill = any(engine_prefill_ms(m) for p in gauged if (m := p.measurement) is not None)
    t0, _, first = _first_start_points(landscape)
    weight = gauge_weight(t0, first)  # of the gauge the cost model takes on the first starts (gauged_speeds):
    on_prefill = proposers_gauged_by_prefill(first)
    by_cost_model = {id(p): (by_prefill if (m.spec.method, m.spec.model) in on_prefill else engine)[id(p)]
                     for p in gauged if (m := p.measurement) is not None}

    def scaled(p: LandscapePoint, w: float = 1.0, speeds: dict[int, float] = engine) -> float:
        value, s = speed[id(p)][0], speeds.get(id(p), 1.0) ** w  # a fast engine's throughput down, its latency up
        return value / s if maximize else value * s

    by_method: dict[str, list[float]] = {}
    for p in landscape.points:
        if id(p) in speed:
            by_method.setdefault(p.spec.get("method", "none"), []).append(scaled(p))
    out: dict[str, Any] = {
        "ttft_ms_min": min(t for _, t in speed.values()), "ttft_ms_max": max(t for _, t in speed.values()),
        "ttft_scaled_by_method": {k: [min(v), max(v)] for k, v in by_method.items()}, "gauge_weight": weight}
    raw_err: list[float] = []
    scaled_err: list[float] = []
    weighted_err: list[float] = []
    prefill_err: list[float] = []
    ratios: list[float] = []
    deviations: list[tuple[Any, float]] = []  # (start time, how far that start lies from its mean)
    by_pass: dict[int, list[float]] = {}  # the same, by each candidate's j-th start (recording pass)
    for engines in landscape.engines().values():
        ok = [(p, speed[id(p)]) for p in engines if id(p) in speed]
        if len(ok) < 2:
            continue
        raw = [v for _, (v, _) in ok]
        raw_mean = statistics.fmean(raw)
        for values, errs in ((raw, raw_err), ([scaled(p) for p, _ in ok], scaled_err),
                             ([scaled(p, weight, by_cost_model) for p, _ in ok], weighted_err),
                             ([scaled(p, speeds=by_prefill) for p, _ in ok], prefill_err)):
            mean = statistics.fmean(values)
            errs.extend(abs(v / mean - 1.0) for v in values)
        deviations.extend((p.measurement.started_at, v / raw_mean - 1.0)
                          for p, (v, _) in ok if p.measurement is not None)
        for j, p in enumerate(engines):  # the j-th start of the candidate, counting those that failed
            if id(p) in speed:
                by_pass.setdefault(j, []).append(speed[id(p)][0] / raw_mean - 1.0)
        ratios.append(max(raw) / min(raw))
    if ratios:
        out["spread"] = {"candidates": len(ratios), "single_engine_error": statistics.fmean(raw_err),
                         "ttft_scaled_single_engine_error": statistics.fmean(scaled_err),
                         "weighted_single_engine_error": statistics.fmean(weighted_err),
                         "engine_prefill_scaled_single_engine_error": statistics.fmean(prefill_err)
                         if has_prefill else None,
                         "max_over_min_largest": max(ratios), "max_over_min_median": statistics.median(ratios),
                         "next_start_correlation": _lag1([d for _, d in sorted(deviations)]),
                         "pass_bias": [statistics.fmean(by_pass[j]) for j in sorted(by_pass)]}
    return out
