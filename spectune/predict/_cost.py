"""Cost model: time per output token of a candidate, from measured trials of the same hardware.

A decode step with a proposer drafting ``d`` tokens costs ``t0 * (1 + c * d)``, where ``t0`` is
one step of the target alone and ``c`` the cost of one drafted (and verified) token relative
to it (Leviathan et al. 2023, section 3.4, with ``d = k``). A step yields ``E`` tokens on
average (acceptance, :class:`~spectune.predict.AcceptanceProfile.tokens_per_step`), so::

    TPOT(proposer) = t0 * (1 + overhead + c * d) / E

``d`` is the drafted tokens per step over all steps
(:attr:`~spectune.predict.AcceptanceProfile.drafted_per_step`): ``k`` for a model draft, less
for n-gram lookup and suffix decoding, which draft only where they find a match and often fewer
than ``k`` tokens (suffix decoding's ``k`` is only a limit). ``overhead`` is what a speculative
step costs whatever it drafts (proposing, rejection sampling), fitted once a proposer has trials
at several ``d`` (:func:`fit_cost`).

Engines of one configuration differ in speed from one start to the next (on shared CPUs by
10-20 %, more than many configurations differ). Each trial carries a gauge of its engine's speed
apart from its configuration: the prefill of the same prompts at concurrency 1, by the engine
core's own timing for a proposer whose every trial has it (:attr:`CostPoint.prefill_ms`), else the
client's median TTFT (:attr:`CostPoint.gauge_ms`), which on a host short of CPU also carries the API
server's delivery of the first token (:func:`gauged_speeds`). Before fitting, each trial's time per token is brought to the
typical engine of its proposer by the ratio of the typical gauge to its own
(:func:`at_typical_speed`): a slow engine no longer reads as a dear configuration. Gauges are
compared within a proposer only (a draft model's prefill, and n-gram's first step, take their
own time). For n-gram lookup and suffix decoding, which draft on the CPU from the text, the
prefill does not depend on ``k`` and the typical gauge is the proposer's median; a model drafter
(a draft model, EAGLE, MTP) runs its ``k`` passes inside the prefill's step, before the first
token returns, so its typical gauge is a robust line over ``k`` (Theil-Sen).

How much the gauge tells depends on the machine: where engines drift, a start's prefill follows
its decode speed; on a steadier one the prefill wanders on its own, and scaling by it adds noise.
So the speeds count to a power in [0, 1] that the study's own trials choose
(:func:`gauge_weight`): the one under which the proposers' cost fits leave the least residual
(on the recorded landscapes' first starts: of the client's TTFT 0.13 on the steadier Xeon of
the default landscape, 0 on MT-Bench prompts, 0.75-1.0 on the others; of the engine's own
prefill 0.65 on the one landscape that recorded it).

``t0`` is the baseline's median TPOT. ``c`` is fitted per proposer (method and draft model,
falling back to the method with other models) by least squares over its measured trials, with
``E`` and ``d`` from each trial's own counters; its interval spans the per-trial estimates of
``c`` widened by each trial's measured noise (the spread of its windows, at least
:data:`REL_NOISE`); a fit resting on one configuration measured on one engine at least by how
much the study's engine starts differ (:data:`PRIOR_ENGINE_SPREAD` until it measured some
configuration twice): one slow engine start would otherwise price every other setting of its
proposer, and of the other model-free methods, as slow as itself. A model-free proposer (n-gram
lookup, suffix decoding) whose method has no trials yet takes the fit over the other model-free
methods' trials (``fit-model-free``): neither runs a model, so what a drafted token costs is
the target's verification of it, the same for both, and one measured suffix configuration tells
more about n-gram's cost than the prior does.
A proposer never measured otherwise gets the prior :data:`COST_PRIORS`, with the interval
``[c/3, 3c]`` and, at the interval's dear end, a fixed overhead of up to
:data:`PRIOR_OVERHEAD_HIGH`: the prior's ``c`` is what a drafted token costs a large model on a
GPU, while on a small model or a CPU a speculative step pays a price of its own whatever it drafts.

Output throughput at the study's concurrency is predicted as
``baseline_throughput * t0 / TPOT``: at a fixed number of requests in flight, throughput is
inversely proportional to the time per output token, as long as the prefill's share of the
time does not change (speculation does not touch the prefill).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from spectune.config import Method, SpecConfig
from spectune.errors import ConfigError
from spectune.predict._curve import CURVE_NOISE, StepCurve
from spectune.predict._gauge import (
    CostPoint,
    at_typical_speed,
    brought_to_speed,
    gauged_speeds,
)
from spectune.predict._measured import effective_k
from spectune.results import PRIOR_ENGINE_SPREAD

if TYPE_CHECKING:
    pass

__all__ = ["COST_PRIORS", "PRIOR_ENGINE_SPREAD", "PRIOR_OVERHEAD_HIGH", "CostModel", "Estimate", "ProposerCost",
           "fit_cost", "fit_cost_model", "gauge_weight"]

COST_PRIORS: Mapping[Method, float] = {
    # Model-free lookup: proposing is a string search on the CPU; c is the extra verification work.
    Method.NGRAM: 0.05,
    Method.SUFFIX: 0.05,
    # A separate draft model runs k forward passes: a small draft is some tenths of the target.
    Method.DRAFT_MODEL: 0.3,
    # Heads on the target's hidden states: one light layer per drafted token.
    Method.EAGLE: 0.1,
    Method.EAGLE3: 0.1,
    Method.MTP: 0.1,
    Method.MLP_SPECULATOR: 0.1,
    Method.MEDUSA: 0.05,
}
"""Prior ``c`` per method, used until the study has measured that method. Rough published orders
of magnitude (Leviathan et al. 2023 report c <= 0.05 for T5-small drafting for T5-XXL; separate
drafts at a tenth of the target's size, and heads, sit around 0.1-0.3), not measurements."""

PRIOR_SPREAD = 3.0
"""A prior ``c`` is believed within a factor of this either way."""

PRIOR_OVERHEAD_HIGH = 1.5
"""The most a speculative step's fixed work (proposing, rejection sampling, the scheduler's and
the sampler's bookkeeping) is believed to cost, relative to a step of the target alone, before
the study has measured the proposer: about nothing against a large model's step on a GPU, up to
one and a half against a small model's on a CPU (the cost fits of the recorded landscapes, in
``benchmarks/RESULTS.md``, put the fixed overhead at up to 1.35 of a step, the tiny draft's at
four requests in flight, and the model-free methods' at up to 0.71).
It widens only the dear end of the prior's interval: the estimate and the cheap end, which decide
what the search measures, keep no overhead."""

REL_NOISE = 0.02
"""Relative noise of one measured TPOT (as :data:`spectune.results.NOISE_FLOOR`)."""

def gauge_weight(t0_ms: float, points: Sequence[CostPoint]) -> float:
    """How far the engines' gauges tell their speed on this machine, from ``points`` (a study's
    trials): the power ``w`` in [0, 1] of the gauged speeds (:func:`at_typical_speed`) under which
    the proposers' cost fits (:func:`fit_cost`) leave the least squared log residual over the
    proposers with gauged trials (module docstring). 1: a trial whose gauge says its engine ran
    10 % fast ran its tokens 10 % fast; 0: the gauge varies apart from the decode speed, and
    scaling by it would add noise. 1 (as before the weight) while fewer than
    :data:`MIN_WEIGHT_POINTS` trials belong to proposers with a typical gauge.

    :func:`spectune.predict.predict_candidates` fits two cost models, on the trials' TPOT and on
    their throughput, and each weighs the gauge on its own points."""
    return _gauge_weight(t0_ms, points, gauged_speeds(points))


def _gauge_weight(t0_ms: float, points: Sequence[CostPoint], speeds: Sequence[float]) -> float:
    from scipy.optimize import minimize_scalar

    groups: dict[tuple[Method, str | None], list[int]] = {}
    for i, p in enumerate(points):
        groups.setdefault((p.method, p.model), []).append(i)
    # the proposers that have a typical gauge (engine_speeds: one at 1.0 can be its median)
    gauged = [([points[i] for i in g], [speeds[i] for i in g]) for g in groups.values()
              if any(speeds[i] != 1.0 for i in g)]
    if sum(len(g) for g, _ in gauged) < MIN_WEIGHT_POINTS:
        return 1.0

    def loss(w: float) -> float:
        total = 0.0
        for group, group_speeds in gauged:
            scaled = brought_to_speed(group, group_speeds, w)
            cost = fit_cost(t0_ms, scaled, weight=0.0)
            fitted = [max(cost.tpot_ms(t0_ms, q.d, q.tokens_per_step), 1e-9) for q in scaled]
            total += math.fsum(math.log(q.tpot_ms / f) ** 2 for q, f in zip(scaled, fitted, strict=True))
        return total

    w = float(minimize_scalar(loss, bounds=(0.0, 1.0), method="bounded", options={"xatol": WEIGHT_TOLERANCE}).x)
    return 0.0 if w < 2 * WEIGHT_TOLERANCE else 1.0 if w > 1.0 - 2 * WEIGHT_TOLERANCE else w


WEIGHT_TOLERANCE = 1e-3
"""How closely :func:`gauge_weight` finds its power (bounded Brent ends within this; a power
this near 0 or 1 is taken as 0 or 1)."""


MIN_WEIGHT_POINTS = 6
"""Gauged trials needed to weigh the gauge (:func:`gauge_weight`)."""



@dataclass(frozen=True)
class ProposerCost:
    """Cost of one proposer: ``c`` per drafted token (estimate and interval) and the fixed
    ``overhead`` of a speculative step (proposing, rejection sampling; 0 until it can be fitted),
    how many configurations it rests on, where it comes from (``fit``: this proposer's trials;
    ``fit-method``: the method's trials with other models; ``fit-model-free``: the other model-free
    methods' trials; ``step-cost``: the baseline's step-cost curve, :attr:`curve`; ``prior``:
    :data:`COST_PRIORS`)."""

    c: float
    low: float
    high: float
    n: int
    source: str
    overhead: float = 0.0
    overhead_high: float | None = None
    """The overhead at the interval's dear end (the prior's :data:`PRIOR_OVERHEAD_HIGH`); None: ``overhead``."""
    curve: StepCurve | None = None
    """Priced by the baseline's step-cost curve (source ``step-cost``): ``c`` is unused."""

    def tpot_ms(self, t0_ms: float, d: float, tokens_per_step: float) -> float:
        """``t0 (1 + overhead + c d) / E`` at this proposer's fitted cost."""
        return t0_ms * (1.0 + self.overhead + self.c * d) / tokens_per_step


MIN_OVERHEAD_POINTS = 3
"""Configurations, spanning at least one drafted token per step, needed to fit the overhead
beside ``c``."""


def per_configuration(points: Sequence[CostPoint]) -> list[CostPoint]:
    """One point per configuration (``label``; unlabelled points stay apart): a configuration
    measured on several engines gets its mean time per token, tokens and drafted tokens per step,
    and as noise the larger of its windows' (mean) and the spread between its engines (standard
    deviation over mean of the time per token)."""
    groups: dict[str, list[CostPoint]] = {}
    for i, p in enumerate(points):
        groups.setdefault(p.label or f"#{i}", []).append(p)
    out = []
    for group in groups.values():
        if len(group) == 1:
            out.append(group[0])
            continue
        times = [p.tpot_ms for p in group]
        mean = statistics.fmean(times)
        drafted = [p.drafted for p in group]
        out.append(dataclasses.replace(
            group[0], tpot_ms=mean, tokens_per_step=statistics.fmean(p.tokens_per_step for p in group),
            drafted=None if None in drafted else statistics.fmean(d for d in drafted if d is not None),
            noise=max(statistics.fmean(p.noise for p in group), statistics.stdev(times) / mean)))
    return out


def fit_cost(t0_ms: float, points: Sequence[CostPoint], *, source: str = "fit", weight: float = 1.0,
             engine_noise: float = 0.0) -> ProposerCost:
    """Least squares of ``TPOT E / t0 - 1 = overhead + c d`` over ``points`` (all of one proposer,
    or of one method; each brought to its proposer's typical engine, :func:`at_typical_speed`, by
    its speed to the power ``weight``; a
    configuration measured on several engines counts once, :func:`per_configuration`).

    With :data:`MIN_OVERHEAD_POINTS` points whose ``d`` span at least 1, both the overhead and
    ``c`` are fitted (a speculative step on a small model or a fast GPU pays a fixed price for
    proposing and rejection sampling, whatever it drafts), with ``c >= 0``: where the slope falls,
    ``c = 0`` and the overhead is the mean of ``y``; otherwise the overhead is 0 and
    ``c = sum(d y) / sum(d d)``. The interval of ``c`` spans the per-point estimates
    ``(y - overhead) / d``, each widened by its noise (at least :data:`REL_NOISE`). A fit on a
    single point, one configuration on one engine, is widened by at least ``engine_noise`` (how
    much engine starts differ, :func:`fit_cost_model`): its cost may be its engine's speed, and
    with nothing else measured the fit would price every other setting of the proposer by it.
    A fit on two configurations or more is not: its per-point estimates differ by their engines'
    speeds as well as by their configurations', and span both (each engine start is brought to a
    typical one by its gauge first, where the proposer has enough of them); widening each of
    them by the spread as well would keep every setting of a proposer alive on a machine whose
    engines differ, and the search from stopping.

    Raises:
        ValueError: no points, or ``t0 <= 0``.
    """
    if not points:
        raise ValueError("no measured trials to fit c on")
    if t0_ms <= 0:
        raise ValueError(f"baseline TPOT must be > 0, got {t0_ms}")
    alone = engine_noise if len(points) == 1 else 0.0
    points = per_configuration(at_typical_speed(points, weight))
    ds = [p.d for p in points]
    ys = [p.tpot_ms * p.tokens_per_step / t0_ms - 1.0 for p in points]
    overhead = 0.0
    c = math.fsum(d * y for d, y in zip(ds, ys, strict=True)) / math.fsum(d * d for d in ds)
    if len(points) >= MIN_OVERHEAD_POINTS and max(ds) - min(ds) >= 1.0:
        md, my = math.fsum(ds) / len(ds), math.fsum(ys) / len(ys)
        slope = (math.fsum((d - md) * (y - my) for d, y in zip(ds, ys, strict=True))
                 / math.fsum((d - md) ** 2 for d in ds))
        # least squares with c >= 0: a falling slope (drafting more made steps no dearer, within
        # noise) is a flat cost, the overhead alone
        c, overhead = (slope, my - slope * md) if slope >= 0.0 else (0.0, my)
    each = [(y - overhead) / d for d, y in zip(ds, ys, strict=True)]
    widen = [max(REL_NOISE, p.noise, alone) * p.tpot_ms * p.tokens_per_step / t0_ms / p.d for p in points]
    low = min(min(e - w for e, w in zip(each, widen, strict=True)), c)
    high = max(max(e + w for e, w in zip(each, widen, strict=True)), c)
    return ProposerCost(c=c, low=low, high=high, n=len(points), source=source, overhead=overhead)


@dataclass(frozen=True)
class Estimate:
    """A predicted value and its interval."""

    value: float
    low: float
    high: float


@dataclass
class CostModel:
    """``t0`` and the baseline throughput, and ``c`` per proposer; see the module docstring.

    Build with :func:`fit_cost_model`.
    """

    t0_ms: float
    baseline_throughput: float
    proposers: dict[tuple[Method, str | None], ProposerCost] = field(default_factory=dict)
    methods: dict[Method, ProposerCost] = field(default_factory=dict)
    model_free: ProposerCost | None = None
    """The fit over every model-free method's trials (n-gram, suffix), None without any."""
    priors: Mapping[Method, float] = field(default_factory=lambda: dict(COST_PRIORS))
    gauge_weight: float = 1.0
    """The power of the engines' gauged speeds the fits used (:func:`gauge_weight`)."""
    curve: StepCurve | None = None
    """The baseline's step-cost curve at the study's load: it prices the model-free methods not yet measured."""

    def cost(self, spec: SpecConfig) -> ProposerCost:
        """``c`` of the candidate's proposer: its own fit, else its method's, else (a model-free
        method) the other model-free methods', else the prior (a method without one of its own
        takes the n-gram's or the heads' prior, by what it drafts from).

        Raises:
            ConfigError: a method with neither measurements nor a prior (the baseline).
        """
        if (spec.method, spec.model) in self.proposers:
            return self.proposers[(spec.method, spec.model)]
        if spec.method in self.methods:
            fitted = self.methods[spec.method]
            return dataclasses.replace(fitted, source="fit-method")
        if spec.method.drafts_from_text and self.model_free is not None:
            return dataclasses.replace(self.model_free, source="fit-model-free")
        if spec.method.drafts_from_text and self.curve is not None:  # the target's forward over the drafts, measured
            return ProposerCost(0.0, 0.0, 0.0, 0, "step-cost", curve=self.curve)
        # a method of the engine's that spectune has no prior for (dflash, dspark, ngram_gpu, an
        # *_mtp): priced as the kind of proposer it is, a text lookup or a model on hidden states
        kind = Method.NGRAM if spec.method.drafts_from_text else Method.EAGLE3
        c = self.priors.get(spec.method, self.priors.get(kind) if spec.method is not Method.NONE else None)
        if c is None:
            raise ConfigError(f"no cost known for method {spec.method}")
        return ProposerCost(c, c / PRIOR_SPREAD, c * PRIOR_SPREAD, 0, "prior", overhead_high=PRIOR_OVERHEAD_HIGH)

    def tpot_ms(self, d: float, c: float, tokens_per_step: float, overhead: float = 0.0) -> float:
        """``t0 (1 + overhead + c d) / E``."""
        return self.t0_ms * (1.0 + overhead + c * d) / tokens_per_step

    def predict_tpot(self, spec: SpecConfig, tokens_per_step: Estimate, drafted: float | None = None) -> Estimate:
        """TPOT of ``spec`` given its tokens per step (an interval) and drafted tokens per step
        (default ``k``): low from the cheapest ``c`` and most tokens, high from the dearest
        ``c`` and fewest. The cheapest step costs no less than a step of the target alone: ``c``
        goes below 0 only as far as the overhead allows (the interval of a flat cost, ``c = 0``,
        spans the overheads its trials measured); the dear end pays the proposer's ``overhead_high``
        where it has one (the prior's)."""
        cost = self.cost(spec)
        d = drafted if drafted is not None else float(effective_k(spec) or 1)  # own-config k: assume 1
        if cost.curve is not None:  # t0 r(d) / E, within CURVE_NOISE, never below a step of the target alone
            step = self.t0_ms * cost.curve.ratio(d)
            cheapest = max(step * (1.0 - CURVE_NOISE), self.t0_ms)
            return Estimate(step / tokens_per_step.value, cheapest / tokens_per_step.high,
                            step * (1.0 + CURVE_NOISE) / tokens_per_step.low)
        o = cost.overhead
        floor = -max(o, 0.0) / d if d > 0 else 0.0
        return Estimate(
            self.tpot_ms(d, cost.c, tokens_per_step.value, o),
            self.tpot_ms(d, min(max(cost.low, floor), cost.c), tokens_per_step.high, o),
            self.tpot_ms(d, cost.high, tokens_per_step.low, o if cost.overhead_high is None else cost.overhead_high),
        )

    def throughput(self, tpot_ms: float) -> float:
        """Output throughput at the study's concurrency for a TPOT (see the module docstring)."""
        return self.baseline_throughput * self.t0_ms / tpot_ms


def fit_cost_model(
    t0_ms: float,
    baseline_throughput: float,
    points: Iterable[CostPoint],
    *,
    priors: Mapping[Method, float] = COST_PRIORS,
    engine_spread: float | None = None,
    curve: StepCurve | None = None,
) -> CostModel:
    """Fit ``c`` per proposer and per method on measured trials (``points``) of one study, each
    brought to its proposer's typical engine as far as the study's trials show the gauge tells
    (:func:`gauge_weight`). ``engine_spread``: how much the study's engine starts of one
    configuration differ (:func:`spectune.results.engine_spread`), None before it measured any
    twice (then :data:`PRIOR_ENGINE_SPREAD`); it widens fits that rest on one engine start.
    ``curve``: the baseline's step-cost curve at the study's load (:class:`StepCurve`).

    Raises:
        ValueError: ``t0 <= 0`` or ``baseline_throughput <= 0``.
    """
    if t0_ms <= 0 or baseline_throughput <= 0:
        raise ValueError(f"the baseline needs TPOT > 0 and throughput > 0, got {t0_ms}, {baseline_throughput}")
    pts = [p for p in points if p.k >= 1 and p.tokens_per_step > 0 and p.tpot_ms > 0]
    model = CostModel(t0_ms, baseline_throughput, priors=dict(priors), curve=curve)
    by_proposer: dict[tuple[Method, str | None], list[CostPoint]] = {}
    by_method: dict[Method, list[CostPoint]] = {}
    speeds = gauged_speeds(pts)  # once: a model drafter's typical gauge is a Theil-Sen fit
    model.gauge_weight = _gauge_weight(t0_ms, pts, speeds)
    for p in brought_to_speed(pts, speeds, model.gauge_weight):  # each brought to its proposer's typical engine
        by_proposer.setdefault((p.method, p.model), []).append(p)
        by_method.setdefault(p.method, []).append(p)
    noise = PRIOR_ENGINE_SPREAD if engine_spread is None else engine_spread
    model.proposers = {key: fit_cost(t0_ms, group, weight=0.0, engine_noise=noise)
                       for key, group in by_proposer.items()}
    model.methods = {key: fit_cost(t0_ms, group, weight=0.0, engine_noise=noise) for key, group in by_method.items()}
    if text := [p for key, group in by_method.items() if key.drafts_from_text for p in group]:
        model.model_free = fit_cost(t0_ms, text, weight=0.0, engine_noise=noise)
    return model

