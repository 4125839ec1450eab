"""What a study optimises and how its figures compare: the objectives (:class:`Objective`), the SLOs
(:class:`SLO`), a figure's noise between windows and a speedup over the baseline."""

from __future__ import annotations

import math
import statistics
from enum import Enum
from typing import TYPE_CHECKING

from pydantic import ByteSize, Field

from spectune._util import StrictModel
from spectune.errors import EngineError

if TYPE_CHECKING:
    from spectune.measurement._models import LevelStats, Measurement

__all__ = ["NOISE_FLOOR", "SLO", "Objective", "relative_noise", "speedup"]


class Objective(str, Enum):
    """What a study optimises. Throughput is maximised, latencies minimised."""

    OUTPUT_THROUGHPUT = "output_throughput"
    TPOT_MEDIAN = "tpot_median_ms"
    TPOT_P99 = "tpot_p99_ms"
    TTFT_P99 = "ttft_p99_ms"
    E2EL_MEDIAN = "e2el_median_ms"
    E2EL_P99 = "e2el_p99_ms"

    @property
    def maximize(self) -> bool:
        return self is Objective.OUTPUT_THROUGHPUT

    @property
    def direction(self) -> str:
        return "maximize" if self.maximize else "minimize"

    def window_values(self, m: Measurement) -> list[float]:
        """This objective in each repeat of the window (for its noise)."""
        return [v for w in m.windows if (v := getattr(w, self.value)) is not None]

    def request_values(self, m: Measurement, level: float | None = None) -> dict[str, float]:
        """Each answered prompt's own figure for this objective, by prompt id (positive values
        only): its output tokens per second of its request's end-to-end latency for throughput,
        else its request's TPOT, TTFT or end-to-end latency. Candidates of one study answer the
        same prompts, so these pair up (:func:`spectune.results.paired_band`). ``level``: the
        requests of that level of a sweep (by key; default and the headline's: the windows')."""
        requests = m.requests
        if level is not None and level != m.headline:
            lv = m.level_at(level)
            requests = lv.requests if lv is not None else []
        out: dict[str, float] = {}
        for r in requests:
            if not r.ok:
                continue
            if self is Objective.OUTPUT_THROUGHPUT:
                v = r.output_tokens / r.e2el_ms if r.output_tokens and r.e2el_ms else None
            else:
                v = {"tpot": r.tpot_ms, "ttft": r.ttft_ms, "e2el": r.e2el_ms}[self.value.split("_")[0]]
            if v is not None and v > 0 and math.isfinite(v):
                out[r.prompt_id] = v
        return out

    def of(self, m: Measurement) -> float:
        """The measured value: the median over the windows; over a load mix
        (:attr:`WorkloadSpec.is_mix`), the weighted geometric mean of each level's value
        (:meth:`of_levels`), so that the whole's ratio between two configurations is their
        levels' ratios, each counted by its weight however large its figures are."""
        levels = self.of_levels(m)
        if levels is None:
            return self.of_headline(m)
        weights = m.workload.weights()
        return math.exp(math.fsum(weights[k] * math.log(v) for k, v in levels.items() if weights[k] > 0))

    def of_headline(self, m: Measurement) -> float:
        """The value at the measurement's headline concurrency: the median over its windows."""
        values = self.window_values(m)
        if not values:
            raise EngineError(f"no request produced a value for {self.value}")
        return float(statistics.median(values))

    def at_level(self, level: LevelStats) -> float | None:
        """This objective at one level of a sweep; None where the level has no such figure."""
        value = getattr(level, self.value)
        return float(value) if value is not None and value > 0 and math.isfinite(value) else None

    def of_levels(self, m: Measurement) -> dict[float, float] | None:
        """Each level's value of a load mix (the headline's from its windows, as :meth:`of_headline`);
        None when the workload is not a mix, or the measurement holds no levels or was stored
        before its levels kept this objective's figure.

        Raises:
            EngineError: a level that counts in the mix produced no value (every request failed).
        """
        if not m.workload.is_mix or not m.levels:
            return None
        weights = m.workload.weights()
        out: dict[float, float] = {}
        for k in m.workload.levels:
            level = m.level_at(k)
            value = self.of_headline(m) if k == m.headline else (self.at_level(level) if level else None)
            if value is not None:
                out[k] = value
            elif level is not None and level.num_failed < level.num_requests:
                return None  # answered, yet without the figure: stored before levels kept it
            elif weights[k] > 0:
                raise EngineError(f"no request produced a value for {self.value} at {m.workload.level_name(k)}")
        return out


def _worst_level(objective: Objective, m: Measurement) -> float:
    """A latency at its worst level of a load mix (levels without the figure left out), else
    its value."""
    if not (m.workload.is_mix and m.levels):
        return objective.of(m)
    others = (v for lv in m.levels if lv.key != m.headline and (v := objective.at_level(lv)) is not None)
    return max(objective.of_headline(m), *others)


class SLO(StrictModel):
    """Service-level limits. A trial that breaks any of them is infeasible."""

    ttft_p99_ms: float | None = Field(default=None, gt=0)
    tpot_median_ms: float | None = Field(default=None, gt=0)
    tpot_p99_ms: float | None = Field(default=None, gt=0)
    e2el_p99_ms: float | None = Field(default=None, gt=0)
    min_output_throughput: float | None = Field(default=None, gt=0)
    max_memory: ByteSize | None = Field(
        default=None, gt=0, description="The most memory the engine may take (70GiB, or bytes): on GPUs its "
        "weights, target and draft, as it accounts for them (the rest of gpu_memory_utilization is KV cache: "
        "min_kv_cache_tokens); its resident memory on a CPU (Measurement.memory_kind).")
    min_kv_cache_tokens: int | None = Field(default=None, gt=0, description="The fewest tokens its KV cache may hold.")

    def violations(self, m: Measurement) -> dict[str, float]:
        """Optuna constraint values by SLO name: <= 0 is satisfied, > 0 by how much it is broken
        (in the limit's own unit; the memory limits relative to the limit). A limit the engine
        gave no figure for (its KV cache's size, on an engine without the gauge) is not checked.
        Over a load mix a latency limit holds at every level, the throughput floor on the whole."""
        out: dict[str, float] = {}
        for name, limit in self:
            if limit is None:
                continue
            if name == "min_output_throughput":
                out[name] = limit - Objective.OUTPUT_THROUGHPUT.of(m) if m.workload.is_mix else limit - m.output_throughput
            elif name == "max_memory":
                if m.peak_memory_bytes is not None:
                    out[name] = m.peak_memory_bytes / limit - 1.0
            elif name == "min_kv_cache_tokens":
                if m.kv_cache_tokens is not None:
                    out[name] = 1.0 - m.kv_cache_tokens / limit
            else:
                out[name] = _worst_level(Objective(name), m) - limit
        return out


def relative_noise(objective: Objective, m: Measurement) -> float | None:
    """Median absolute deviation over the windows, relative to the median (None for 1 window)."""
    values = objective.window_values(m)
    if len(values) < 2:
        return None
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values)
    return mad / med if med else None


NOISE_FLOOR = 0.02
"""Relative noise assumed for a trial measured in one window only (no repeats to tell)."""


def speedup(maximize: bool, value: float, baseline: float) -> float:
    """How many times better than the baseline (> 1 is better, for either direction); nan when
    the ratio is undefined."""
    if maximize:
        return value / baseline if baseline > 0 else math.nan
    return baseline / value if value > 0 else math.nan
