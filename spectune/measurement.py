"""Measurement types: what one trial measured, what a study optimises, and how figures compare.

The bottom layer of spectune: every other part reads and writes these; nothing here starts an
engine, reads a file or talks to a database.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import statistics
from enum import Enum
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from spectune._util import StrictModel
from spectune.config import EngineArgs, SpecConfig, WorkloadSpec
from spectune.errors import EngineError

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "CPU_FEATURES",
    "INTERRUPTED",
    "RECHECK_BEST",
    "RECHECK_SURPRISE",
    "RECORD_VERSION",
    "NOISE_FLOOR",
    "SLO",
    "AcceptanceStats",
    "Hardware",
    "LatencyStats",
    "LevelStats",
    "Measurement",
    "Objective",
    "Placement",
    "RequestSample",
    "TrialRecord",
    "Versions",
    "WindowStats",
    "relative_noise",
    "spec_key",
    "speedup",
    "write_fields",
]


class Versions(BaseModel):
    spectune: str
    vllm: str | None
    torch: str | None
    python: str


class Hardware(BaseModel):
    platform: str
    cpu: str
    cpu_count: int
    memory_bytes: int | None
    gpus: list[str]
    """The GPUs the engine was given (``CUDA_VISIBLE_DEVICES``), not every GPU of the host."""
    cpu_features: list[str] = []
    """Processor features that change what speculation costs here (:data:`CPU_FEATURES`)."""


CPU_FEATURES = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
"""Where present, vectors and native bfloat16 make the CPU engine's step, and so the landscape,
differ between machines of one kind."""


SCHEMA_VERSION = 1

class LatencyStats(BaseModel):
    """Distribution of one latency over the window's successful requests, in milliseconds."""

    count: int
    mean: float | None
    median: float | None
    p90: float | None
    p99: float | None

    @classmethod
    def of(cls, seconds: Sequence[float]) -> LatencyStats:
        if not seconds:
            return cls(count=0, mean=None, median=None, p90=None, p99=None)
        ms = sorted(x * 1000.0 for x in seconds)

        def q(p: float) -> float:
            if len(ms) == 1:
                return ms[0]
            return statistics.quantiles(ms, n=100, method="inclusive")[int(p) - 1]

        return cls(count=len(ms), mean=statistics.fmean(ms), median=statistics.median(ms), p90=q(90), p99=q(99))


class AcceptanceStats(BaseModel):
    """Speculative acceptance over the measured window, from the engine's own counters."""

    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    acceptance_rate: float
    mean_acceptance_length: float
    per_position: list[float] = Field(description="P(first i+1 drafted tokens all accepted), i = 0..k-1")


class WindowStats(BaseModel):
    """Headline figures of one measured window (a trial measures ``repeats`` disjoint windows)."""

    duration_seconds: float
    output_throughput: float
    tpot_median_ms: float | None
    tpot_p99_ms: float | None
    ttft_median_ms: float | None
    ttft_p99_ms: float | None
    e2el_median_ms: float | None
    e2el_p99_ms: float | None



class LevelStats(BaseModel):
    """One concurrency level of a sweep (``workload.concurrency_levels``), on the trial's engine:
    its own prompts (disjoint from every other level's), its own counters."""

    concurrency: int
    num_requests: int
    num_failed: int
    duration_seconds: float
    output_throughput: float
    tpot_median_ms: float | None
    ttft_median_ms: float | None
    acceptance: AcceptanceStats | None



class RequestSample(BaseModel):
    """One request of the window, as the client saw it."""

    prompt_id: str
    ok: bool
    error: str | None = None
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    text: str = ""
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None



class Measurement(BaseModel):
    """Everything one trial measured, and what produced it. Serialisable to JSON."""

    schema_version: int = SCHEMA_VERSION
    spec: SpecConfig
    engine: EngineArgs = Field(description="Engine arguments as resolved for this platform.")
    workload: WorkloadSpec
    concurrency: int
    command: list[str]
    log_path: str | None
    started_at: dt.datetime
    startup_seconds: float
    duration_seconds: float
    num_requests: int
    num_failed: int
    input_tokens: int
    output_tokens: int
    output_throughput: float = Field(description="Output tokens per second over the window.")
    request_throughput: float
    total_token_throughput: float
    ttft_ms: LatencyStats
    tpot_ms: LatencyStats
    itl_ms: LatencyStats
    e2el_ms: LatencyStats
    acceptance: AcceptanceStats | None
    peak_memory_bytes: int | None
    versions: Versions
    hardware: Hardware
    windows: list[WindowStats] = Field(description="One entry per repeat of the window.")
    requests: list[RequestSample] = Field(description="Requests of every window, in order.")
    levels: list[LevelStats] = Field(
        default_factory=list,
        description="A sweep's concurrency levels, the headline one (``concurrency``) included; "
        "empty without ``concurrency_levels``. Requests of the other levels are not in ``requests``.",
    )

    def at_concurrency(self, concurrency: int) -> LevelStats | None:
        """The measured level ``concurrency`` of a sweep, or the headline one; None if not measured."""
        for level in self.levels:
            if level.concurrency == concurrency:
                return level
        if concurrency == self.concurrency:
            return LevelStats(
                concurrency=concurrency, num_requests=self.num_requests, num_failed=self.num_failed,
                duration_seconds=self.duration_seconds, output_throughput=self.output_throughput,
                tpot_median_ms=self.tpot_ms.median, ttft_median_ms=self.ttft_ms.median, acceptance=self.acceptance,
            )
        return None


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

    def of(self, m: Measurement) -> float:
        """The measured value: the median over the windows."""
        values = self.window_values(m)
        if not values:
            raise EngineError(f"no request produced a value for {self.value}")
        return float(statistics.median(values))


class SLO(StrictModel):
    """Service-level limits. A trial that breaks any of them is infeasible."""

    ttft_p99_ms: float | None = Field(default=None, gt=0)
    tpot_median_ms: float | None = Field(default=None, gt=0)
    tpot_p99_ms: float | None = Field(default=None, gt=0)
    e2el_p99_ms: float | None = Field(default=None, gt=0)
    min_output_throughput: float | None = Field(default=None, gt=0)

    def violations(self, m: Measurement) -> dict[str, float]:
        """Optuna constraint values by SLO name: <= 0 is satisfied, > 0 by how much it is broken."""
        out: dict[str, float] = {}
        for name, limit in self:
            if limit is None:
                continue
            if name == "min_output_throughput":
                out[name] = limit - m.output_throughput
            else:
                out[name] = Objective(name).of(m) - limit
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


def spec_key(spec_json: dict[str, Any] | None) -> str:
    """Canonical text of a candidate, to recognise the same configuration measured before."""
    return json.dumps(spec_json or {"method": "none"}, sort_keys=True, separators=(",", ":"))


# -- the trial record: spectune's attributes of one Optuna trial ---------------------------------

RECORD_VERSION = 1
"""Version of :class:`TrialRecord`'s layout in a trial's user attributes."""

INTERRUPTED = "interrupted"
"""``fail_reason`` of a trial stopped by Ctrl-C: measured again, not counted as finished."""

RECHECK_SURPRISE = "outside its predicted interval"
"""Why guided search measured a configuration again: its measurement fell outside its prediction."""
RECHECK_BEST = "the best when the search would stop"
"""Why guided search measured a configuration again: the best, before the search stops."""

_PREDICTION_KEYS = ("predicted_low", "predicted_high", "predicted_acceptance_length")


class Placement(StrictModel):
    """Where a trial ran: its worker's host and process, and the GPUs its engine was given."""

    host: str
    gpus: str | None = None
    pid: int | None = None

    def label(self) -> str:
        return f"{self.host} gpus {self.gpus}" if self.gpus else self.host


class TrialRecord(BaseModel):
    """Everything spectune keeps about one trial in Optuna's storage, as the trial's user
    attributes (one attribute per field, readable in optuna-dashboard); the full Measurement is
    in spectune's own table. Read with :meth:`of`, written with :meth:`write`: no other code
    reads or writes a trial's attributes by name.

    Fields that are None are not written. ``predicted`` is stored under ``predicted_<objective>``.
    Records of earlier versions are read too (``recheck`` was True for a surprise).
    """

    model_config = {"extra": "ignore"}

    record_version: int | None = None
    # the candidate, and where it ran
    config: str | None = Field(default=None, description="The candidate's label.")
    spec: dict[str, Any] | None = Field(default=None, description="vLLM's speculative config ({'method': 'none'}).")
    spec_key: str | None = None
    role: str | None = Field(default=None, description="'baseline' for the study's baseline trial.")
    placement: Placement | None = None
    # why it ran
    retry_of: int | None = Field(default=None, description="The interrupted trial this one measures again.")
    confirms: int | None = Field(default=None, description="The trial whose configuration this one measures again.")
    recheck: str | None = Field(default=None, description="Why guided search measured it again (RECHECK_*).")
    duplicate_of: int | None = Field(default=None, description="An earlier trial of the same candidate it reuses.")
    # guided search's prediction, before it ran
    predicted_objective: str | None = None
    predicted: float | None = None
    predicted_low: float | None = None
    predicted_high: float | None = None
    predicted_acceptance_length: float | None = None
    prediction_source: str | None = None
    guide_reason: str | None = None
    guide_step: int | None = None
    # how it ended
    fail_reason: str | None = None
    output_throughput: float | None = None
    tpot_median_ms: float | None = None
    ttft_p99_ms: float | None = None
    e2el_median_ms: float | None = None
    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    per_position_acceptance: list[float] | None = None
    startup_seconds: float | None = None
    failed_requests: int | None = None
    speedup: float | None = None
    noise: float | None = None
    constraints: dict[str, float] | None = None
    feasible: bool | None = None

    @classmethod
    def of(cls, trial: Any) -> TrialRecord:
        """The record of an Optuna trial (a FrozenTrial, or a running Trial)."""
        return cls.from_attrs(trial.user_attrs)

    @classmethod
    def from_attrs(cls, attrs: dict[str, Any]) -> TrialRecord:
        data = dict(attrs)
        if data.get("recheck") is True:  # spectune before records had versions
            data["recheck"] = RECHECK_SURPRISE
        elif data.get("recheck") is False:
            data["recheck"] = None
        for key in list(data):
            if key.startswith("predicted_") and key not in _PREDICTION_KEYS and key != "predicted_objective":
                data["predicted_objective"], data["predicted"] = key.removeprefix("predicted_"), data.pop(key)
        return cls.model_validate(data)

    def attrs(self) -> dict[str, Any]:
        """The fields that are set, as user attributes."""
        out = self.model_dump(mode="json", exclude_none=True, exclude={"predicted_objective", "predicted"})
        if self.predicted_objective is not None and self.predicted is not None:
            out[f"predicted_{self.predicted_objective}"] = self.predicted
        return out

    def write(self, trial: Any) -> None:
        """Set this record's fields (those not None) on an Optuna trial."""
        for key, value in self.attrs().items():
            trial.set_user_attr(key, value)

    # -- what the search reads ---------------------------------------------------------------
    @property
    def is_baseline(self) -> bool:
        return self.role == "baseline"

    @property
    def guided(self) -> bool:
        """Chosen by guided search, with a prediction."""
        return self.guide_reason is not None

    @property
    def measured_again(self) -> bool:
        """A re-measurement (a recheck or a confirmation): it spends no budget."""
        return self.confirms is not None

    @property
    def interrupted(self) -> bool:
        return self.fail_reason == INTERRUPTED

    def guide(self) -> TrialRecord:
        """Its prediction alone (a guided pick measured again keeps it)."""
        return TrialRecord(**{k: getattr(self, k) for k in (
            "predicted_objective", "predicted", *_PREDICTION_KEYS, "prediction_source", "guide_reason", "guide_step")})


def write_fields(trial: Any, **fields: Any) -> None:
    """Set some fields of a trial's :class:`TrialRecord` (validated as the record's)."""
    TrialRecord(**fields).write(trial)
