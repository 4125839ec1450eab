"""vLLM's speculative-decoding counters, read from Prometheus text, as acceptance figures; the
engine core's own timing of the requests (prefill, time per output token); and its KV cache's
gauges (size, usage).

Counters are cumulative over the server's life: read them before and after the measured
window and take the difference (:meth:`SpecCounters.__sub__`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from spectune._util import every
from spectune.errors import EngineError

__all__ = ["Acceptance", "EngineTiming", "KVCache", "KVWatch", "SpecCounters", "fetch_counters", "fetch_metrics", "parse_counters", "parse_kv_cache"]

_DRAFTS = "vllm:spec_decode_num_drafts"
_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
_GENERATED = "vllm:generation_tokens"
_PREFILL_TIME = "vllm:request_prefill_time_seconds"
_TPOT_TIME = "vllm:request_time_per_output_token_seconds"
_STEP_TOKENS = "vllm:iteration_tokens_total"
_PROMPT = "vllm:prompt_tokens"
_CACHED = "vllm:prompt_tokens_cached"
_CACHE_INFO = "vllm:cache_config_info"
_KV_USAGE = "vllm:kv_cache_usage_perc"


@dataclass(frozen=True)
class SpecCounters:
    """Raw counter values (summed over engines): drafts, draft and accepted tokens, per position;
    and the sums and counts of the engine core's per-request timing histograms."""

    num_drafts: float = 0.0
    num_draft_tokens: float = 0.0
    num_accepted_tokens: float = 0.0
    accepted_per_pos: tuple[float, ...] = ()
    generation_tokens: float = 0.0
    prefill_seconds: float = 0.0
    """Sum of ``vllm:request_prefill_time_seconds``: from a request's scheduling to its first token."""
    prefills: float = 0.0
    tpot_seconds: float = 0.0
    """Sum of ``vllm:request_time_per_output_token_seconds``: each request's decode time over its
    output tokens but the first."""
    tpot_requests: float = 0.0
    steps: float = 0.0
    """Engine steps (the count of ``vllm:iteration_tokens_total``)."""
    prompt_tokens: float = 0.0
    """``vllm:prompt_tokens``: prompt tokens of the requests prefilled, cached ones included."""
    cached_prompt_tokens: float = 0.0
    """``vllm:prompt_tokens_cached``: prompt tokens read from the prefix cache."""

    def __sub__(self, before: SpecCounters) -> SpecCounters:
        n = max(len(self.accepted_per_pos), len(before.accepted_per_pos))
        a = list(self.accepted_per_pos) + [0.0] * (n - len(self.accepted_per_pos))
        b = list(before.accepted_per_pos) + [0.0] * (n - len(before.accepted_per_pos))
        return SpecCounters(
            num_drafts=self.num_drafts - before.num_drafts,
            num_draft_tokens=self.num_draft_tokens - before.num_draft_tokens,
            num_accepted_tokens=self.num_accepted_tokens - before.num_accepted_tokens,
            accepted_per_pos=tuple(x - y for x, y in zip(a, b, strict=True)),
            generation_tokens=self.generation_tokens - before.generation_tokens,
            prefill_seconds=self.prefill_seconds - before.prefill_seconds,
            prefills=self.prefills - before.prefills,
            tpot_seconds=self.tpot_seconds - before.tpot_seconds,
            tpot_requests=self.tpot_requests - before.tpot_requests,
            steps=self.steps - before.steps,
            prompt_tokens=self.prompt_tokens - before.prompt_tokens,
            cached_prompt_tokens=self.cached_prompt_tokens - before.cached_prompt_tokens,
        )

    def timing(self) -> EngineTiming | None:
        """The engine core's mean prefill and time per output token over the requests that
        finished in the window; None when its histograms counted none (an engine without them)."""
        if self.prefills <= 0 and self.tpot_requests <= 0:
            return None
        return EngineTiming(
            requests=int(max(self.prefills, self.tpot_requests)),
            prefill_ms=1000.0 * self.prefill_seconds / self.prefills if self.prefills > 0 else None,
            tpot_ms=1000.0 * self.tpot_seconds / self.tpot_requests if self.tpot_requests > 0 else None,
        )

    def acceptance(self) -> Acceptance | None:
        """Acceptance figures, or None when nothing was drafted in the window."""
        if self.num_drafts <= 0 or self.num_draft_tokens <= 0:
            return None
        return Acceptance(
            num_drafts=int(self.num_drafts),
            num_draft_tokens=int(self.num_draft_tokens),
            num_accepted_tokens=int(self.num_accepted_tokens),
            acceptance_rate=self.num_accepted_tokens / self.num_draft_tokens,
            mean_acceptance_length=1.0 + self.num_accepted_tokens / self.num_drafts,
            per_position=[x / self.num_drafts for x in self.accepted_per_pos],
        )


@dataclass(frozen=True)
class Acceptance:
    """Acceptance over a window.

    ``per_position[i]`` is the share of drafts whose first ``i + 1`` tokens were all accepted
    (vLLM counts a position only when every earlier one was accepted), so it never increases.
    """

    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    acceptance_rate: float
    mean_acceptance_length: float
    per_position: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class EngineTiming:
    """How long the engine core itself took for the requests of a window, by its own monotonic
    timestamps (vLLM's ``vllm:request_prefill_time_seconds`` and
    ``vllm:request_time_per_output_token_seconds``): unlike what the client times, untouched by
    how the API server delivers the tokens (on a host short of CPU it may send a request's tokens
    in one burst at its end)."""

    requests: int
    prefill_ms: float | None
    """Mean time from a request's scheduling to its first token."""
    tpot_ms: float | None
    """Mean over requests of their time per output token after the first."""


_HISTOGRAMS = {f"{_PREFILL_TIME}_sum": "prefill_seconds", f"{_PREFILL_TIME}_count": "prefills",
               f"{_TPOT_TIME}_sum": "tpot_seconds", f"{_TPOT_TIME}_count": "tpot_requests",
               f"{_STEP_TOKENS}_count": "steps"}


def parse_counters(text: str) -> SpecCounters:
    """Sum vLLM's speculative counters, and its timing histograms' sums and counts, out of
    Prometheus exposition text."""
    totals = {_DRAFTS: 0.0, _DRAFT_TOKENS: 0.0, _ACCEPTED: 0.0, _GENERATED: 0.0, _PROMPT: 0.0, _CACHED: 0.0}
    timing = dict.fromkeys(_HISTOGRAMS.values(), 0.0)
    per_pos: dict[int, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (field_name := _HISTOGRAMS.get(sample.name)) is not None:
                timing[field_name] += sample.value
                continue
            # match on sample names: counters end in _total (their _created twins are skipped),
            # whether or not the parser attached them to a typed family
            base = sample.name.removesuffix("_total")
            if base == sample.name:
                continue
            if base == _PER_POS:
                pos = int(sample.labels.get("position", 0))
                per_pos[pos] = per_pos.get(pos, 0.0) + sample.value
            elif base in totals:
                totals[base] += sample.value
    positions = tuple(per_pos.get(i, 0.0) for i in range(max(per_pos) + 1)) if per_pos else ()
    return SpecCounters(
        num_drafts=totals[_DRAFTS],
        num_draft_tokens=totals[_DRAFT_TOKENS],
        num_accepted_tokens=totals[_ACCEPTED],
        accepted_per_pos=positions,
        generation_tokens=totals[_GENERATED],
        prompt_tokens=totals[_PROMPT],
        cached_prompt_tokens=totals[_CACHED],
        **timing,
    )


@dataclass(frozen=True)
class KVCache:
    """The engine's KV cache as its gauges say: capacity and how full it is now."""

    tokens: int | None
    """Tokens the KV cache holds: ``kv_cache_size_tokens`` of ``vllm:cache_config_info`` where vLLM
    reports it, else its blocks times the block size (summed over engines); None if unreported."""
    usage: float | None
    """``vllm:kv_cache_usage_perc`` (0..1; the largest over engines), None if unreported."""


def parse_kv_cache(text: str) -> KVCache:
    """The KV cache's size and usage out of Prometheus exposition text."""
    tokens: int | None = None
    usage: float | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == _CACHE_INFO:
                size = _int(sample.labels.get("kv_cache_size_tokens"))
                if size is None and (blocks := _int(sample.labels.get("num_gpu_blocks"))) is not None:
                    size = blocks * (_int(sample.labels.get("block_size")) or 0) or None
                if size is not None:
                    tokens = (tokens or 0) + size
            elif sample.name == _KV_USAGE:
                usage = max(usage or 0.0, sample.value)
    return KVCache(tokens, usage)


def _int(label: str | None) -> int | None:
    try:
        return int(label) if label not in (None, "", "None") else None
    except ValueError:
        return None


def fetch_metrics(base_url: str, timeout: float = 10.0) -> str:
    """GET ``/metrics`` as text. Raises EngineError when the server does not answer."""
    try:
        resp = httpx.get(f"{base_url.rstrip('/')}/metrics", timeout=timeout)
        resp.raise_for_status()
    except httpx.HTTPError as e:
        raise EngineError(f"cannot read {base_url}/metrics: {e}") from e
    return resp.text


def fetch_counters(base_url: str, timeout: float = 10.0) -> SpecCounters:
    """GET ``/metrics`` and parse its speculative counters. Raises EngineError when the server
    does not answer."""
    return parse_counters(fetch_metrics(base_url, timeout))


class KVWatch:
    """The engine's KV cache while requests run: its size, and the fullest it was seen (its usage
    gauge, read every ``interval`` seconds beside the load; an engine without the gauges leaves
    both None)."""

    def __init__(self, base_url: str, interval: float = 0.5) -> None:
        self.base_url = base_url
        self.interval = interval
        self.tokens: int | None = None
        self.peak: float | None = None

    def _read(self) -> None:
        try:
            kv = parse_kv_cache(fetch_metrics(self.base_url, timeout=5.0))
        except EngineError:  # a busy or dying engine: the load's own errors say what happened
            return
        self.tokens = kv.tokens if kv.tokens is not None else self.tokens
        if kv.usage is not None:
            self.peak = max(self.peak or 0.0, kv.usage)

    def watching(self) -> contextlib.AbstractContextManager[None]:
        """Read the gauges now and every :attr:`interval` seconds while the block runs."""
        return every(self.interval, self._read, "spectune-kv-cache")
