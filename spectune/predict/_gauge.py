"""A trial's cost point, and how fast its engine ran: engines of one configuration differ by more
than configurations do on shared CPUs; the prefill of the same prompts at concurrency 1 gauges
each engine's speed (the engine core's own mean prefill where vLLM reports it, else the client's
median TTFT), so that each trial is brought to its proposer's typical engine before the cost
model is fitted (:mod:`spectune.predict._cost`)."""

from __future__ import annotations

import dataclasses
import statistics
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spectune.config import Method
from spectune.predict._measured import effective_k, measured_profile

if TYPE_CHECKING:
    from spectune.measurement import Measurement

__all__ = ["MAX_GAUGE_RATIO", "MIN_GAUGES", "CostPoint", "at_typical_speed", "engine_gauge_ms", "engine_prefill_ms",
           "engine_speed", "engine_speeds", "brought_to_speed", "gauged_speeds", "proposers_gauged_by_prefill"]


@dataclass(frozen=True)
class CostPoint:
    """One measured speculative trial, reduced to what the cost model fits."""

    method: Method
    model: str | None
    k: int
    tpot_ms: float
    tokens_per_step: float
    label: str = ""
    drafted: float | None = None
    """Drafted tokens per step (``d``); None means ``k``."""
    noise: float = 0.0
    """Relative noise of this trial's TPOT (spread of its windows)."""
    gauge_ms: float | None = None
    """How long this trial's engine took for what no configuration of its proposer changes, as
    the client saw it (the median TTFT at concurrency 1, :func:`engine_gauge_ms`); None where no
    such gauge is known."""
    prefill_ms: float | None = None
    """The same by the engine core's own timing (:func:`engine_prefill_ms`), the gauge
    :func:`gauged_speeds` prefers; None where vLLM reported none."""

    @property
    def d(self) -> float:
        return self.drafted if self.drafted is not None and self.drafted > 0 else float(self.k)

    @classmethod
    def from_measurement(cls, m: Measurement, *, throughput_of: Measurement | None = None) -> CostPoint | None:
        """The point of a speculative measurement; None for the baseline or without TPOT or counters.

        With ``throughput_of`` (the baseline), the time per token is the throughput-equivalent
        one, ``t0 * baseline throughput / throughput``: a cost model fitted on such points
        predicts output throughput, prefill and scheduling included, rather than TPOT.
        """
        spec = m.spec
        profile = measured_profile(m)
        k = effective_k(spec)
        if spec.is_baseline or profile is None or m.tpot_ms.median is None or not k:
            return None
        time_ms = m.tpot_ms.median
        if throughput_of is not None:
            t0 = throughput_of.tpot_ms.median
            if t0 is None or m.output_throughput <= 0:
                return None
            time_ms = t0 * throughput_of.output_throughput / m.output_throughput
        return cls(spec.method, spec.model, k, time_ms, profile.tokens_per_step, spec.label(),
                   drafted=profile.drafted_per_step, noise=_noise(m), gauge_ms=engine_gauge_ms(m),
                   prefill_ms=engine_prefill_ms(m))


MAX_GAUGE_RATIO = 1.5
"""A gauge further than this factor from its proposer's typical one is a hiccup of the prefill,
not the engine's speed, and is not scaled by: on the recorded landscapes two starts of one
configuration took up to 1.45x the TTFT of each other where their throughput followed, while a
few starts took 4-9x the typical TTFT at a typical throughput (where the engine core's own
timing was recorded, its prefill of such starts was typical: their TTFT was the API server's
delivery). ``benchmarks/search_efficiency.py starts LANDSCAPE`` prints each recorded start's TTFT
beside its prefill."""


def engine_gauge_ms(m: Measurement) -> float | None:
    """The trial's median TTFT where requests ran one at a time (its headline, or a sweep's
    level 1): the prefill of the workload's prompts, alone on the engine. With several requests
    in flight a prompt waits behind the others' decode steps, which speculation shortens: no
    gauge from those."""
    level = None if m.workload.by_rate else m.level_at(1)  # levels keyed by rate: none one at a time
    ttft = level.ttft_median_ms if level is not None else None
    return ttft if ttft is not None and ttft > 0 else None


def engine_prefill_ms(m: Measurement) -> float | None:
    """The engine core's own mean prefill of the trial's headline windows where requests ran one
    at a time (:attr:`~spectune.measurement.Measurement.engine_timing`): the gauge of
    :func:`engine_gauge_ms` without the API server's share (tokenising, delivering the first
    token). None where the headline windows ran at another concurrency (the TTFT still gauges a
    sweep from its level 1), or without the engine's histograms."""
    timing = m.engine_timing
    prefill = timing.prefill_ms if timing is not None and m.concurrency == 1 else None
    return prefill if prefill is not None and prefill > 0 else None


MIN_GAUGES = 3
"""A proposer's trials needed for a typical gauge: with two, a hiccup pulls the typical halfway
and the normal trial would be judged against it."""


def at_typical_speed(points: Sequence[CostPoint], weight: float = 1.0) -> list[CostPoint]:
    """``points`` with each time per token brought to its proposer's typical engine (multiplied by
    :func:`engine_speeds` to the power ``weight``: 1 trusts the gauge fully, 0 not at all)."""
    return list(points) if weight == 0.0 else brought_to_speed(points, gauged_speeds(points), weight)


def gauged_speeds(points: Sequence[CostPoint]) -> list[float]:
    """Each point's engine speed (:func:`engine_speeds`) by the engine core's own prefill for a
    proposer whose every point has it, else by the client's median TTFT: the engine's prefill
    leaves out what the API server adds, which on a host short of CPU is the delivery's (tokens
    sent in bursts), not the engine's. One gauge per proposer, since its points are compared with
    each other only and the two gauges are not on one scale; one trial without the engine's
    timing (a vLLM that did not report it) then costs its own proposer the better gauge, not the
    study."""
    by_prefill = proposers_gauged_by_prefill(points)
    return engine_speeds([(p.method, p.model, p.k, p.prefill_ms if (p.method, p.model) in by_prefill else p.gauge_ms)
                          for p in points])


def proposers_gauged_by_prefill(points: Sequence[CostPoint]) -> set[tuple[Method, str | None]]:
    """The proposers (method, draft model) that :func:`gauged_speeds` gauges by the engine core's
    own prefill rather than by the client's TTFT: those whose every point has it."""
    has: dict[tuple[Method, str | None], bool] = {}
    for p in points:
        has[(p.method, p.model)] = has.get((p.method, p.model), True) and bool(p.prefill_ms)
    return {proposer for proposer, every in has.items() if every}


def brought_to_speed(points: Sequence[CostPoint], speeds: Sequence[float], weight: float) -> list[CostPoint]:
    """Each point's time per token multiplied by its speed to the power ``weight``."""
    return [p if s == 1.0 or weight == 0.0 else dataclasses.replace(p, tpot_ms=p.tpot_ms * s**weight)
            for p, s in zip(points, speeds, strict=True)]


def engine_speeds(trials: Sequence[tuple[Method, str | None, int, float | None]]) -> list[float]:
    """How much faster than a typical engine of its proposer each trial's engine ran, from
    ``(method, model, k, gauge_ms)``: the typical gauge over its own (:func:`engine_speed`).

    A proposer's typical gauge comes from its trials: their median for proposers that draft from
    the text, a Theil-Sen line over ``k`` for model drafters (module docstring). A proposer with
    fewer than :data:`MIN_GAUGES` trials, or with a trial lacking a gauge, gets 1.0 for all.
    """
    groups: dict[tuple[Method, str | None], list[int]] = {}
    for i, (method, model, _, _) in enumerate(trials):
        groups.setdefault((method, model), []).append(i)
    speeds = [1.0] * len(trials)
    for (method, _), members in groups.items():
        gauges = [g for i in members if (g := trials[i][3]) is not None and g > 0]
        if len(gauges) < max(MIN_GAUGES, len(members)):  # too few, or one trial without a gauge
            continue
        typical = _typical_gauges(method, [trials[i][2] for i in members], gauges)
        for i, t in zip(members, typical, strict=True):
            speeds[i] = engine_speed(trials[i][3], t)
    return speeds


def _typical_gauges(method: Method, ks: Sequence[int], gauges: Sequence[float]) -> list[float]:
    """The typical gauge at each trial's ``k`` (see :func:`engine_speeds`)."""
    if method.drafts_from_text or len(set(ks)) < 2:
        return [statistics.median(gauges)] * len(gauges)
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import TheilSenRegressor

    x = [[float(k)] for k in ks]
    with warnings.catch_warnings():  # its spatial median may stop short of its tolerance: still a robust line
        warnings.simplefilter("ignore", ConvergenceWarning)
        return [float(v) for v in TheilSenRegressor(random_state=0).fit(x, gauges).predict(x)]


def engine_speed(gauge_ms: float | None, typical_ms: float | None) -> float:
    """How much faster than a typical engine a trial's engine ran, by its gauge
    (``typical / gauge``); 1.0 without a gauge or where it lies more than
    :data:`MAX_GAUGE_RATIO` from the typical one."""
    if not gauge_ms or not typical_ms or typical_ms <= 0:
        return 1.0
    speed = typical_ms / gauge_ms
    return speed if 1.0 / MAX_GAUGE_RATIO <= speed <= MAX_GAUGE_RATIO else 1.0


def _noise(m: Measurement) -> float:
    """The trial's relative noise as the study records it (MAD of its windows' throughput)."""
    from spectune.measurement import Objective, relative_noise

    return relative_noise(Objective.OUTPUT_THROUGHPUT, m) or 0.0


