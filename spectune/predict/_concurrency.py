"""Predictions at other concurrency levels, from a sweep (``workload.concurrency_levels``, or
``request_rate_levels``: a level at a request rate sits at the batch its baseline ran there, the
mean requests in flight while any was, :attr:`~spectune.measurement.LevelStats.batch`).

A decode step of the target with ``b`` requests in flight takes ``t0(b) = A + B b``: ``A`` reads
the weights once, ``B`` is the work per request (the roofline's first-order shape). ``A`` and
``B`` are fitted by least squares on the baseline's median TPOT at the levels of its sweep
(:func:`fit_step_time`; two levels at least). The share of a step that grows with the batch is
``s(b) = B b / (A + B b)``.

A speculative candidate's TPOT is ``t0 (1 + x) / E`` (:mod:`spectune.predict._cost`), with
``x = overhead + c d`` the speculative part of a step and ``E`` the tokens per step, which the
batch does not change. Verifying drafted tokens is per-request work, so it grows like ``s(b)``;
a proposer's own work (a draft model's forward passes) grows like a step. So::

    x(b) = x(b1) g(b),   g(b) = (rho + s(b)) / (rho + s(b1))

at the study's concurrency ``b1``, with ``rho >= 0`` the proposer's own work relative to
verification, fitted per method on the speculative trials' sweeps (each trial's ``x`` at its
levels against the baseline's ``t0`` at the same level, as a ratio to its own ``x(b1)``).
A method without sweeps of its own gets ``rho`` fitted on every method's sweeps pooled, and
``rho = 0`` (pure verification, the roofline) before any speculative trial swept.

Output throughput at ``b`` is ``thr0(b) t0(b) / TPOT(b)`` with ``thr0`` the baseline's measured
throughput at ``b``, or between levels ``b / t0(b)`` times the baseline's decode efficiency
(measured throughput over ``b / t0(b)``), interpolated linearly in ``b`` and held flat beyond
the measured levels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from spectune.config import Method
from spectune.predict._cost import Estimate
from spectune.predict._measured import measured_profile

if TYPE_CHECKING:
    from spectune.measurement import LevelStats, Measurement
    from spectune.predict._prediction import Prediction

__all__ = ["ConcurrencyModel", "LevelPrediction", "StepTime", "fit_concurrency", "fit_step_time"]

_RHO_GRID = (0.0, *(10 ** (e / 4) for e in range(-12, 13)))
"""Candidate values of ``rho`` (0, then 1e-3 .. 1e3 in quarter decades)."""

MIN_SPECULATIVE_PART = 0.02
"""A trial whose speculative part ``x(b1)`` is below this is too close to free to scale from."""


@dataclass(frozen=True)
class StepTime:
    """``t0(b) = a + slope b`` in milliseconds, fitted on the baseline's levels."""

    a: float
    slope: float
    levels: tuple[float, ...]

    def at(self, batch: float) -> float:
        return self.a + self.slope * batch

    def share(self, batch: float) -> float:
        """``s(b)``: the part of a step that grows with the batch."""
        t = self.at(batch)
        return self.slope * batch / t if t > 0 else 0.0


def fit_step_time(points: Sequence[tuple[float, float]]) -> StepTime:
    """Least squares of ``t0 = a + slope b`` over ``(b, t0)`` points; neither may be negative
    (a negative slope becomes a flat line, a negative intercept a line through the origin).

    Raises:
        ValueError: fewer than two distinct levels, or a time that is not positive.
    """
    levels = sorted({b for b, _ in points})
    if len(levels) < 2:
        raise ValueError(f"a step-time fit needs two concurrency levels at least, got {levels}")
    if any(t <= 0 or b < 1 for b, t in points):
        raise ValueError("concurrency levels must be >= 1 and step times > 0")
    xs, ys = [float(b) for b, _ in points], [t for _, t in points]
    mx, my = math.fsum(xs) / len(xs), math.fsum(ys) / len(ys)
    slope = math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / math.fsum((x - mx) ** 2 for x in xs)
    if slope <= 0:
        return StepTime(my, 0.0, tuple(levels))
    a = my - slope * mx
    if a < 0:
        slope = math.fsum(x * y for x, y in zip(xs, ys, strict=True)) / math.fsum(x * x for x in xs)
        a = 0.0
    return StepTime(a, slope, tuple(levels))


@dataclass(frozen=True)
class LevelPrediction:
    """A candidate at one concurrency level (a batch): TPOT and output throughput, with intervals."""

    concurrency: float
    tpot_ms: Estimate
    output_throughput: Estimate
    scale_source: str
    """``fit``: ``rho`` fitted on this method's sweeps; ``fit-pooled``: on every method's (this
    one has none yet); ``roofline``: ``rho = 0`` assumed (no sweep of any speculative trial);
    ``measured``: not predicted, measured there (:meth:`~spectune.predict.StudyInputs.at_concurrency`)."""
    name: str | None = None
    """The study's own level this stands for (``0.5/s``, ``c=4``), where it is one."""


@dataclass
class ConcurrencyModel:
    """The baseline's step time against the batch and ``rho`` per method; see the module docstring.

    Build with :func:`fit_concurrency`.
    """

    step: StepTime
    study_concurrency: float
    baseline_levels: dict[float, tuple[float, float]]
    """Measured ``batch -> (median TPOT ms, output tokens/s)`` of the baseline, the study's
    concurrency (its headline, what predictions there rest on) included."""
    batches: dict[float, float] = field(default_factory=dict)
    """The batch of each of the baseline's levels, by level key (a concurrency is its own)."""
    rho: dict[Method | None, tuple[float, int]] = field(default_factory=dict)
    """``method -> (rho, trials it rests on)``, fitted on TPOT; ``None``: every method's sweeps
    pooled, for a method with none of its own."""
    rho_throughput: dict[Method | None, tuple[float, int]] = field(default_factory=dict)
    """The same, fitted on output throughput."""

    def t0(self, batch: float) -> float:
        """The baseline's TPOT at ``batch``: measured where it was, else the fitted line."""
        measured = self.baseline_levels.get(batch)
        return measured[0] if measured else self.step.at(batch)

    def baseline_throughput(self, batch: float) -> float:
        """The baseline's output throughput at ``batch``, measured or interpolated."""
        if batch in self.baseline_levels:
            return self.baseline_levels[batch][1]
        eff = sorted((b, thr * t / (1000.0 * b)) for b, (t, thr) in self.baseline_levels.items())
        if batch <= eff[0][0]:
            e = eff[0][1]
        elif batch >= eff[-1][0]:
            e = eff[-1][1]
        else:
            (b0, e0), (b1, e1) = next((lo, hi) for lo, hi in zip(eff, eff[1:], strict=False) if lo[0] <= batch <= hi[0])
            e = e0 + (e1 - e0) * (batch - b0) / (b1 - b0)
        return e * 1000.0 * batch / self.step.at(batch)

    def scale(self, method: Method, batch: float, of: str = "tpot") -> tuple[float, str]:
        """``g(b)`` of ``method`` for TPOT (``of="tpot"``) or throughput, and where its ``rho``
        comes from."""
        fits = self.rho if of == "tpot" else self.rho_throughput
        rho, n = fits.get(method) or fits.get(None) or (0.0, 0)
        s1 = self.step.share(self.study_concurrency)
        g = (rho + self.step.share(batch)) / (rho + s1) if rho + s1 > 0 else 1.0
        return g, ("fit" if method in fits else "fit-pooled") if n else "roofline"

    def predict(self, prediction: Prediction, batch: float, name: str | None = None) -> LevelPrediction:
        """``prediction`` (made at the study's concurrency) moved to ``batch``.

        Each end of the intervals moves with its own pairing of cost and tokens per step, so
        that at the study's concurrency the prediction comes back unchanged.
        """
        g, source = self.scale(prediction.spec.method, batch)
        g_thr, _ = self.scale(prediction.spec.method, batch, "throughput")
        t1, thr1 = self.baseline_levels[self.study_concurrency]
        tb, thrb = self.t0(batch), self.baseline_throughput(batch)
        tok = prediction.tokens_per_step
        pairs = ((prediction.tpot_ms.value, tok.value), (prediction.tpot_ms.low, tok.high),
                 (prediction.tpot_ms.high, tok.low))
        tpot = [tb * (1.0 + _moved(t * e / t1 - 1.0, g)) / e for t, e in pairs]
        thr_pairs = ((prediction.output_throughput.value, tok.value), (prediction.output_throughput.high, tok.high),
                     (prediction.output_throughput.low, tok.low))
        thr = [thrb * e / (1.0 + _moved(thr1 * e / y - 1.0, g_thr)) if y > 0 else 0.0 for y, e in thr_pairs]
        return LevelPrediction(batch, Estimate(tpot[0], min(tpot), max(tpot)),
                               Estimate(thr[0], min(thr), max(thr)), source, name)


def _moved(x: float, g: float) -> float:
    """The speculative part ``x`` at another level: ``x g``. A part below 0 (a candidate measured
    faster than its tokens per step explain) is noise: it stays as it is rather than grow with
    the batch, so that ``1 + x`` stays positive at every level."""
    return x * g if x > 0 else x


def _baseline_levels(baseline: Measurement) -> dict[float, tuple[float, float]]:
    out = {}
    for level in baseline.levels or [baseline.level_at(baseline.headline)]:
        if level is not None and level.tpot_median_ms and level.output_throughput > 0:
            out[level.batch] = (level.tpot_median_ms, level.output_throughput)
    return out


def _fit_rho(ratios: Sequence[tuple[float, float, float]]) -> float:
    """``rho`` minimising the squared error of ``(rho + s) / (rho + s1)`` against measured ratios
    ``x(b) / x(b1)``, given as ``(s, s1, ratio)``."""
    def err(rho: float) -> float:
        return math.fsum(((rho + s) / (rho + s1) - r) ** 2 for s, s1, r in ratios if rho + s1 > 0)

    return min(_RHO_GRID, key=err)


def _level_tokens(e: float, head: LevelStats, level: LevelStats) -> float:
    """Tokens per step at ``level``, from the headline's ``e`` and each level's own counters: the
    accepted part scaled by the ratio of their mean acceptance lengths (a proposer that learns
    from earlier answers, suffix decoding, accepts more at the later levels)."""
    a, b = head.acceptance, level.acceptance
    if a is None or b is None or a.mean_acceptance_length <= 1.0:
        return e
    return 1.0 + (e - 1.0) * (b.mean_acceptance_length - 1.0) / (a.mean_acceptance_length - 1.0)


def fit_concurrency(baseline: Measurement, measured: Sequence[Measurement]) -> ConcurrencyModel | None:
    """The concurrency model of a study, or None when its baseline did not sweep two levels.

    ``measured`` are the study's speculative measurements; those with sweeps fit ``rho``: once on
    their TPOT, once on their throughput (``x`` as the throughput-equivalent speculative part,
    ``thr0(b) E / thr(b) - 1``, which carries what the prefill's share does at each level).
    """
    levels = _baseline_levels(baseline)
    key1 = baseline.headline
    base_head = baseline.level_at(key1)
    if len(levels) < 2 or base_head is None or base_head.batch not in levels:
        return None
    step = fit_step_time([(b, t) for b, (t, _) in levels.items()])
    batches = {lv.key: lv.batch for lv in baseline.levels}
    model = ConcurrencyModel(step, base_head.batch, levels, batches)
    s1 = step.share(base_head.batch)

    def at(lv: LevelStats) -> float:  # where a trial's level sits: the baseline's batch at that level
        return batches.get(lv.key, lv.batch)

    def x_tpot(lv: LevelStats, e: float) -> float | None:
        return lv.tpot_median_ms * e / model.t0(at(lv)) - 1.0 if lv.tpot_median_ms else None

    def x_throughput(lv: LevelStats, e: float) -> float | None:
        return model.baseline_throughput(at(lv)) * e / lv.output_throughput - 1.0 \
            if lv.output_throughput > 0 else None

    swept = [(m, profile.tokens_per_step, head) for m in measured
             if len(m.levels) >= 2 and (profile := measured_profile(m)) is not None
             and (head := m.level_at(key1)) is not None]
    for kind, x_of in (("tpot", x_tpot), ("throughput", x_throughput)):
        ratios: dict[Method, list[tuple[float, float, float]]] = {}
        counts: dict[Method, int] = {}
        for m, e, head in swept:
            x1 = x_of(head, e)
            if x1 is None or x1 < MIN_SPECULATIVE_PART:
                continue
            points = [(step.share(at(lv)), s1, x / x1) for lv in m.levels
                      if lv.key != key1 and (x := x_of(lv, _level_tokens(e, head, lv))) is not None]
            if points:
                ratios.setdefault(m.spec.method, []).extend(points)
                counts[m.spec.method] = counts.get(m.spec.method, 0) + 1
        fitted: dict[Method | None, tuple[float, int]] = {
            method: (_fit_rho(points), counts[method]) for method, points in ratios.items()}
        if ratios:  # every method's sweeps pooled: for a method not swept yet
            fitted[None] = (_fit_rho([p for points in ratios.values() for p in points]), sum(counts.values()))
        if kind == "tpot":
            model.rho = fitted
        else:
            model.rho_throughput = fitted
    return model
