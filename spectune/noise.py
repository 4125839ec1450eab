"""How far two engine starts of one configuration differ, and the band a decision rests on.

One engine start of a configuration lands off its mean over many starts by the *engine spread*
(relative standard deviation). A study measures it where it runs a configuration on two engines
or more, pools that with what earlier studies in the same storage measured on the same machine
(:func:`machine_key`), and leans on a platform prior (:data:`PRIORS`), counted as
:data:`PRIOR_DOF` degrees of freedom, for the rest (:func:`estimate`). The band of a decision is a
half-width on the log of the gain, written as an interval (:func:`interval`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from spectune.measurement import Measurement, Objective

__all__ = ["BAND_Z", "PRIORS", "PRIOR_DOF", "PRIOR_ENGINE_SPREAD", "EngineSpread", "SpreadPrior", "engine_spread",
           "engine_spread_note", "estimate", "interval", "interval_text", "machine_key", "paired_band",
           "paired_gap_error", "pooled_spread", "prior_for"]


@dataclass(frozen=True)
class SpreadPrior:
    """The engine spread assumed on a platform before anything was measured, and from what."""

    value: float
    platform: str
    basis: str


PRIORS = {
    "cpu": SpreadPrior(0.18, "cpu", "the pooled spread of the recorded CPU landscapes with repeated engine starts "
                                    "(18.4 % over 692 starts of 12 landscapes: benchmarks/spread_replay.py --prior)"),
    "gpu": SpreadPrior(0.037, "gpu", "the top of the 1.5-3.7 % that published vLLM benchmarks measured between "
                                     "starts of one configuration on one GPU"),
}
"""The engine spread assumed on each platform until one is measured (:func:`prior_for`)."""

PRIOR_ENGINE_SPREAD = PRIORS["cpu"].value
"""The CPU prior: what a fit or band assumes when it is told no spread at all."""

PRIOR_DOF = 1.0
"""The prior counts as one degree of freedom beside the measured ones, as one more pair of starts
would (a configuration measured on two engines adds one): a single pair, which can land close by
chance, moves the figure halfway, and many pairs decide it."""

BAND_Z = 1.96
"""The paired band is a 95 % interval on the gap between the choice and the baseline."""

Source = Literal["study", "machine", "prior"]


def prior_for(platform: str | None) -> SpreadPrior:
    """The prior of ``platform`` (a :class:`~spectune.measurement.Hardware` platform); the CPU
    one for an unknown platform."""
    return PRIORS["gpu"] if platform in ("gpu", "cuda", "rocm") else PRIORS["cpu"]


@dataclass(frozen=True)
class EngineSpread:
    """The engine spread a study uses, and where it came from: ``study`` (its own configurations
    measured on two engines or more), ``machine`` (earlier studies in its storage on the same
    machine, with its own where it has some) or ``prior`` (nothing measured: :attr:`prior`)."""

    value: float
    source: Source
    starts: int
    """The engine starts behind the measured part (0 for the prior alone)."""
    prior: SpreadPrior

    @property
    def measured(self) -> float | None:
        """The figure where something was measured, None on the prior alone."""
        return None if self.source == "prior" else self.value

    def record(self) -> dict[str, Any]:
        """As ``show --json`` and the provenance give it."""
        return {"value": self.value, "source": self.source, "starts": self.starts,
                "prior": self.prior.value, "prior_basis": self.prior.basis}

    def note(self) -> str:
        """One sentence on the figure and where it came from."""
        if self.source == "prior":
            return (f"Engine starts of one configuration are assumed to differ by {self.value:.1%} "
                    f"({self.prior.platform} prior: {self.prior.basis}); nothing was measured twice yet.")
        where = "this study's" if self.source == "study" else "this machine's, over the studies in this storage,"
        return (f"Engine starts of one configuration differ by {self.value:.1%} here ({where} {self.starts} "
                f"engine starts of configurations measured twice or more, with the {self.prior.value:.1%} "
                f"{self.prior.platform.upper()} prior weighing as one more pair of starts).")


def _parts(groups: Iterable[Sequence[float]]) -> list[tuple[int, float, int]]:
    """(degrees of freedom, relative variance, starts) of each group of two values or more."""
    return [(len(v) - 1, statistics.variance(v) / mean ** 2, len(v))
            for v in groups if len(v) > 1 and (mean := statistics.fmean(v))]


def pooled_spread(groups: Iterable[Sequence[float]]) -> float | None:
    """The pooled relative standard deviation of ``groups`` (each the values of one configuration
    on its engines): each group's variance over its squared mean, weighted by its degrees of
    freedom, over the groups of two values or more; None without any (:func:`engine_spread`)."""
    parts = _parts(groups)
    dof = sum(n for n, _, _ in parts)
    return math.sqrt(sum(n * v for n, v, _ in parts) / dof) if dof else None


def engine_spread(configs: Sequence[Any]) -> float | None:
    """How much engine starts of one configuration differ within these configurations alone
    (each with ``values``, one per engine): :func:`pooled_spread`; None without any measured twice.

    Engines on one machine differ by more than the windows on one engine tell: a configuration
    measured on one engine may owe its lead to its engine. Guided search's re-measurements of
    surprises count too: chosen for a first engine far from its prediction, they inflate the
    figure, but on a machine where one engine start can land that far, a configuration
    measured once is that uncertain."""
    return pooled_spread([c.values for c in configs])


def estimate(own: Iterable[Sequence[float]], machine: Iterable[Sequence[float]], prior: SpreadPrior) -> EngineSpread:
    """The engine spread from a study's ``own`` groups (values of one configuration on its
    engines) and those ``machine`` earlier studies on the same machine measured: their pooled
    relative variance with the prior's counted as :data:`PRIOR_DOF` degrees of freedom."""
    mine, theirs = _parts(own), _parts(machine)
    parts = mine + theirs
    dof = sum(n for n, _, _ in parts)
    if not dof:
        return EngineSpread(prior.value, "prior", 0, prior)
    variance = (sum(n * v for n, v, _ in parts) + PRIOR_DOF * prior.value ** 2) / (dof + PRIOR_DOF)
    return EngineSpread(math.sqrt(variance), "machine" if theirs else "study", sum(s for _, _, s in parts), prior)


def machine_key(m: Measurement) -> str:
    """What makes engine starts comparable across studies: the platform, the processor (model,
    CPUs and features) or the GPUs' model, the engine's version, the dtype and the target model
    (a 30M-parameter model's engine starts differ by three times a 135M one's on the recorded
    landscapes)."""
    hw = m.hardware
    if hw.gpus:
        where = " + ".join(sorted({g.split(", ")[2] if g.count(", ") >= 3 else g for g in hw.gpus}))
    else:
        where = f"{hw.cpu} x{hw.cpu_count} [{' '.join(hw.cpu_features)}]"
    return f"{hw.platform} | {where} | vllm {m.versions.vllm} | {m.engine.dtype or 'auto'} | {m.engine.model}"


def interval(gain: float, band: float) -> tuple[float, float]:
    """The gain's interval: ``band`` is a half-width on its log."""
    return gain * math.exp(-band), gain * math.exp(band)


def interval_text(gain: float, band: float) -> str:
    """``1.57x, 1.27-1.94x``."""
    low, high = interval(gain, band)
    return f"{gain:.2f}x, {low:.2f}-{high:.2f}x"


def paired_band(a: Sequence[Measurement], b: Sequence[Measurement], objective: Objective, *,
                n_a: int, n_b: int, spread: float | None) -> float | None:
    """The half-width on the log of a 95 % interval on the gap between two configurations, each
    measured on the prompts of one workload: ``a`` and ``b`` on their engines (``n_a``, ``n_b``).

    Paired per prompt: each prompt's log ratio of ``a`` to ``b`` (its per-request figure,
    :meth:`Objective.request_values`, averaged over each one's engines), whose spread over the
    prompts says how far the gap on the prompts not sampled may lie from the gap on these (its
    standard error); how much one prompt is faster than another cancels out. Over a load mix
    whose levels kept their requests, each level's gap on its own prompts, weighted as the
    objective weighs them (:func:`paired_gap_error`). On top, the engine starts: each
    configuration's mean over its engines is off by ``spread`` / sqrt(engines)
    (:data:`PRIOR_ENGINE_SPREAD` when None). None when fewer than 3 prompts pair up."""
    found = paired_gap_error(a, b, objective)
    return band_of(found[0], n_a, n_b, spread) if found is not None else None


def band_of(error: float, n_a: int, n_b: int, spread: float | None) -> float:
    """The band's half-width from the paired gap's standard error and the engine starts'."""
    s = spread if spread is not None else PRIOR_ENGINE_SPREAD
    return BAND_Z * math.sqrt(error ** 2 + s ** 2 / max(n_a, 1) + s ** 2 / max(n_b, 1))


def paired_gap_error(a: Sequence[Measurement], b: Sequence[Measurement],
                     objective: Objective) -> tuple[float, bool] | None:
    """The standard error of the mean log gap per prompt between ``a`` and ``b``, and whether it
    covers a load mix: over a mix whose every weighted level kept its requests, the levels'
    errors weighted as :meth:`Objective.of` weighs their values (the whole's log is
    ``sum w_k log v_k``, each level on prompts of its own: ``sqrt(sum (w_k se_k)^2)``), else the
    headline level's. None when fewer than 3 prompts pair up at the headline level."""
    def per_prompt(ms: Sequence[Measurement], level: float | None) -> dict[str, float]:
        logs: dict[str, list[float]] = {}
        for m in ms:
            for pid, v in objective.request_values(m, level).items():
                logs.setdefault(pid, []).append(math.log(v))
        return {pid: statistics.fmean(v) for pid, v in logs.items() if len(v) == len(ms)}

    def error(level: float | None) -> float | None:
        pa, pb = per_prompt(a, level), per_prompt(b, level)
        gaps = [pa[pid] - pb[pid] for pid in pa.keys() & pb.keys()]
        return statistics.stdev(gaps) / math.sqrt(len(gaps)) if len(gaps) >= 3 else None

    if not a or not b:
        return None
    head = error(None)
    if head is None:
        return None
    first = a[0]
    if first.workload.is_mix and first.levels:
        weights = first.workload.weights()
        errors = {k: head if k == first.headline else error(k) for k, w in weights.items() if w > 0}
        if all(e is not None for e in errors.values()):
            return math.sqrt(math.fsum((weights[k] * e) ** 2 for k, e in errors.items() if e is not None)), True
    return head, False


def engine_spread_note(spread: EngineSpread | None) -> str | None:
    """The sentence ``show``, the reports and the export header say about the engine spread
    (:meth:`EngineSpread.note`; None without one)."""
    return spread.note() if spread is not None else None
