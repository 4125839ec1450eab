"""What one trial measured: versions and hardware, latencies, windows, requests, levels and the
whole :class:`Measurement`; the keys that recognise a candidate measured before."""

from __future__ import annotations

import datetime as dt
import json
import statistics
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from spectune.config import EngineArgs, SpecConfig, WorkloadSpec

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "CPU_FEATURES",
    "BURSTY_DELIVERY",
    "AcceptanceStats",
    "AnswerMargins",
    "EngineTimingStats",
    "Hardware",
    "LatencyStats",
    "LevelStats",
    "Measurement",
    "PromptMargins",
    "RequestSample",
    "StepCost",
    "StepCostPoint",
    "Versions",
    "WindowStats",
    "candidate_key",
    "spec_key",
]


class StepCostPoint(BaseModel):
    """One point of the step-cost curve: ``batch`` requests at once, each a cached prefix and
    ``new_tokens`` new tokens, one output token each; the engine's steps held ``tokens`` tokens on
    average and a request's prefill took ``ms`` by the engine core's clock."""

    batch: int
    new_tokens: int
    tokens: float = Field(description="New tokens per engine step: prompt tokens computed (not read from the "
                          "prefix cache) over the steps (vllm:iteration_tokens_total's count); batch x new_tokens "
                          "where the engine does not report them.")
    ms: float = Field(description="Mean vllm:request_prefill_time_seconds of the point's requests, in ms.")
    cached_tokens: float | None = Field(default=None, description="Prompt tokens per request read from the "
                                        "prefix cache (vllm:prompt_tokens_cached); None where not reported.")


class StepCost(BaseModel):
    """The step-cost curve of an engine: what a verification step over ``B(k+1)`` new tokens on
    cached contexts costs on this hardware (:mod:`spectune.stepcost`)."""

    points: list[StepCostPoint]
    prefix_tokens: int = Field(description="Cached context tokens of each request.")
    seconds: float = Field(description="Engine time the probe took, after the measured windows.")

    def at(self, batch: int) -> list[StepCostPoint]:
        """The points at ``batch`` requests in flight, by tokens per step."""
        return sorted((p for p in self.points if p.batch == batch), key=lambda p: p.tokens)


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


class EngineTimingStats(BaseModel):
    """The engine core's own timing of the headline windows' requests (vLLM's
    ``vllm:request_prefill_time_seconds`` and ``vllm:request_time_per_output_token_seconds``
    histograms, by the engine core's monotonic timestamps): what the engine spent, whatever the
    API server and the network then did to the tokens' delivery."""

    requests: int = Field(description="Requests the histograms counted over the windows (vLLM counts a "
                          "one-token request's time per output token as 0, which the client's TPOT leaves out).")
    prefill_ms: float | None = Field(description="Mean time from a request's scheduling to its first token.")
    tpot_ms: float | None = Field(description="Mean over requests of their time per output token after the first.")


BURSTY_DELIVERY = 0.5
"""A trial's client timing is taken as bursty when the client's mean time per output token is
below this share of the engine core's: its tokens reached the client in bunches (an API server
short of CPU sends what has piled up at once), so the client's TTFT, TPOT and ITL are not the
engine's, while throughput, which counts tokens over the window, still is."""


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



class PromptMargins(BaseModel):
    """One prompt's answer as the baseline gave it with log-probabilities (:class:`AnswerMargins`)."""

    token_ids: list[int]
    margins: list[float | None] = Field(description="At each output position, the log-probability of its most "
                                        "likely token less that of the second (None: not given).")


class AnswerMargins(BaseModel):
    """The baseline's answers again, asked with log-probabilities after its timed windows (so
    that no timed figure carries their cost): how close the baseline's own choice was at each
    position, which tells a rounding difference from a changed answer
    (:func:`spectune.answers.compare`)."""

    seconds: float = Field(description="What asking cost: the pass's wall time on the engine.")
    window_seconds: float = Field(description="The timed windows' wall time on the same prompts, to set it against.")
    requests: dict[str, PromptMargins] = Field(description="By prompt id; a prompt whose request failed is absent.")


class LevelStats(BaseModel):
    """One level of a sweep (``workload.concurrency_levels`` or ``request_rate_levels``), on the
    trial's engine: its own prompts (disjoint from every other level's), its own counters."""

    concurrency: int = Field(description="Requests in flight: the level's, or at a request rate the most.")
    num_requests: int
    num_failed: int
    duration_seconds: float
    output_throughput: float
    tpot_median_ms: float | None
    ttft_median_ms: float | None
    acceptance: AcceptanceStats | None
    tpot_p99_ms: float | None = None
    ttft_p99_ms: float | None = None
    e2el_median_ms: float | None = None
    e2el_p99_ms: float | None = None
    engine_timing: EngineTimingStats | None = Field(
        default=None, description="The engine core's own timing of this level's requests (None where vLLM "
        "reports no such histograms, or in a measurement stored before levels kept it).")
    request_rate: float | None = Field(default=None, description="The level's request rate, where the levels "
                                       "are rates (``request_rate_levels``).")
    mean_in_flight: float | None = Field(
        default=None, description="Requests in flight on average while any was (their summed latency over the "
        "time the engine had work; None in a measurement stored before levels kept it).")
    requests: list[RequestSample] = Field(
        default_factory=list, description="The level's requests as the client saw them, without their texts and "
        "token ids: what pairs the level's prompts between configurations (empty for the headline level, whose "
        "requests are the measurement's, and in a measurement stored before levels kept them).")

    @property
    def key(self) -> float:
        """The level's key: its request rate where the levels are rates, else its concurrency."""
        return self.request_rate if self.request_rate is not None else self.concurrency

    @property
    def batch(self) -> float:
        """The batch the engine ran at this level: its concurrency; at a request rate, the
        measured mean in flight (at least 1), or the cap where it was not kept."""
        if self.request_rate is None:
            return self.concurrency
        return max(1.0, self.mean_in_flight) if self.mean_in_flight is not None else self.concurrency



class Measurement(BaseModel):
    """Everything one trial measured, and what produced it. Serialisable to JSON."""

    schema_version: int = SCHEMA_VERSION
    spec: SpecConfig
    engine: EngineArgs = Field(description="Engine arguments as resolved for this platform.")
    engine_defaults: dict[str, str] = Field(
        default_factory=dict,
        description="The engine arguments the platform filled in (the user set none), each with its value and why.")
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
    engine_timing: EngineTimingStats | None = Field(
        default=None, description="The engine core's own timing of the windows' requests; None where vLLM "
        "reports no such histograms.")
    peak_memory_bytes: int | None
    memory_kind: Literal["host_rss", "gpu_weights", "gpu_device", "gpu"] = Field(
        default="host_rss", description="What peak_memory_bytes measures: the resident memory of the engine's "
        "processes on the host (a CPU engine); on GPUs the weights of target and draft as the engine accounts "
        "for them (gpu_weights), else its devices' memory beyond what they held before it (gpu_device; gpu: "
        "the memory its processes held, in measurements stored before).")
    kv_cache_tokens: int | None = Field(default=None, description="Tokens the engine's KV cache holds "
                                        "(vllm:cache_config_info).")
    kv_cache_peak_usage: float | None = Field(default=None, description="The fullest the KV cache was seen "
                                              "during the windows (vllm:kv_cache_usage_perc, 0..1).")
    versions: Versions
    hardware: Hardware
    windows: list[WindowStats] = Field(description="One entry per repeat of the window.")
    requests: list[RequestSample] = Field(description="Requests of every window, in order.")
    levels: list[LevelStats] = Field(
        default_factory=list,
        description="A sweep's levels, the headline one (:attr:`headline`) included; empty without "
        "``concurrency_levels`` or ``request_rate_levels``. Requests of the other levels are not in ``requests``.",
    )
    mean_in_flight: float | None = Field(
        default=None, description="Requests in flight on average over the windows while any was (None in a "
        "measurement stored before it was kept).")
    answer_margins: AnswerMargins | None = Field(
        default=None, description="A baseline at temperature 0: its answers' margins, asked after the windows.")
    step_cost: StepCost | None = Field(
        default=None, description="A baseline's: the time of one forward against the new tokens it holds, "
        "timed on its engine after the windows (:mod:`spectune.stepcost`).")

    @property
    def bursty_delivery(self) -> bool | None:
        """Whether the tokens reached the client in bunches (:data:`BURSTY_DELIVERY`): its
        latency figures are then the delivery's, not the engine's. None without the engine's
        timing or the client's TPOT."""
        engine = self.engine_timing.tpot_ms if self.engine_timing is not None else None
        client = self.tpot_ms.mean
        if engine is None or engine <= 0 or client is None:
            return None
        return client < BURSTY_DELIVERY * engine

    @property
    def headline(self) -> float:
        """The headline level's key: the workload's request rate where its levels are rates,
        else the concurrency its windows ran at."""
        return self.workload.headline if self.workload.by_rate else self.concurrency

    def level_at(self, key: float) -> LevelStats | None:
        """The measured level of a sweep by its key (:attr:`LevelStats.key`: a concurrency, or a
        request rate), or the headline one; None if not measured."""
        for level in self.levels:
            if level.key == key:
                return level
        if key == self.headline:
            return LevelStats(
                concurrency=self.concurrency, num_requests=self.num_requests, num_failed=self.num_failed,
                duration_seconds=self.duration_seconds, output_throughput=self.output_throughput,
                tpot_median_ms=self.tpot_ms.median, ttft_median_ms=self.ttft_ms.median, acceptance=self.acceptance,
                tpot_p99_ms=self.tpot_ms.p99, ttft_p99_ms=self.ttft_ms.p99, e2el_median_ms=self.e2el_ms.median,
                e2el_p99_ms=self.e2el_ms.p99, engine_timing=self.engine_timing,
                request_rate=self.workload.request_rate if self.workload.by_rate else None,
                mean_in_flight=self.mean_in_flight,
            )
        return None


def spec_key(spec_json: dict[str, Any] | None) -> str:
    """Canonical text of a speculative configuration, to recognise it measured before."""
    return json.dumps(spec_json or {"method": "none"}, sort_keys=True, separators=(",", ":"))


def candidate_key(spec_json: dict[str, Any] | None, knobs: dict[str, Any] | None = None) -> str:
    """Canonical text of a candidate: its speculative configuration (:func:`spec_key`), with the
    values of the engine knobs a space tunes. Without knobs, the speculative configuration's key."""
    spec = spec_json or {"method": "none"}
    return spec_key({**spec, "engine": knobs} if knobs else spec)
