"""One trial: one candidate on one workload, on a real engine, measured.

engine start -> warm-up (excluded) -> counters -> measured window -> counters -> stop.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import math
import re
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import aiohttp

from spectune._util import ProgressHook
from spectune.config import EngineArgs, Prompt, SpecConfig, WorkloadSpec
from spectune.counters import KVWatch, SpecCounters, fetch_counters
from spectune.engines import DEFAULT_STARTUP_TIMEOUT, VLLMServer, check_runnable
from spectune.errors import (
    ConfigError,
    EngineCrashedError,
    EngineError,
    EngineTimeoutError,
)
from spectune.load import LoadProcess, LoadResult, RequestRecord, run_load
from spectune.measurement import (
    AcceptanceStats,
    AnswerMargins,
    EngineTimingStats,
    LatencyStats,
    LevelStats,
    Measurement,
    PromptMargins,
    RequestSample,
    StepCost,
    WindowStats,
)
from spectune.provenance import hardware, versions

__all__ = ["TrialHook", "measure", "plan_windows", "split_windows", "warmup_prompts"]

_logger = logging.getLogger(__name__)

TrialHook = ProgressHook
"""A trial's progress (:data:`~spectune._util.ProgressHook`): its phases are "start" (the engine
starting, open-ended), "warmup", "measure", for a baseline at temperature 0 "margins"
(requests, counted), and for a baseline asked to, "step cost" (the curve's points)."""


def window_stats(result: LoadResult) -> WindowStats:
    """Headline figures of one window's requests, from the client's timestamps and usage."""
    ok = result.succeeded
    d = result.duration
    tpot = LatencyStats.of([t for r in ok if (t := r.tpot) is not None])
    ttft = LatencyStats.of([r.ttft for r in ok if r.ttft is not None])
    e2el = LatencyStats.of([r.e2el for r in ok if r.e2el is not None])
    return WindowStats(
        duration_seconds=d,
        output_throughput=sum(r.output_tokens or 0 for r in ok) / d if d > 0 else 0.0,
        tpot_median_ms=tpot.median, tpot_p99_ms=tpot.p99, ttft_median_ms=ttft.median,
        ttft_p99_ms=ttft.p99, e2el_median_ms=e2el.median, e2el_p99_ms=e2el.p99,
    )


def level_stats(concurrency: int, result: LoadResult, acceptance: AcceptanceStats | None,
                engine_timing: EngineTimingStats | None = None, request_rate: float | None = None) -> LevelStats:
    """One level of a sweep: its window's figures and its own counters. ``request_rate``: the
    level's rate, where the levels are rates."""
    w = window_stats(result)
    n = len(result.records)
    return LevelStats(concurrency=concurrency, num_requests=n, num_failed=n - len(result.succeeded),
                      duration_seconds=w.duration_seconds, output_throughput=w.output_throughput,
                      tpot_median_ms=w.tpot_median_ms, ttft_median_ms=w.ttft_median_ms, acceptance=acceptance,
                      tpot_p99_ms=w.tpot_p99_ms, ttft_p99_ms=w.ttft_p99_ms, e2el_median_ms=w.e2el_median_ms,
                      e2el_p99_ms=w.e2el_p99_ms, engine_timing=engine_timing, request_rate=request_rate,
                      mean_in_flight=mean_in_flight([result]),
                      requests=[request_sample(r).model_copy(update={"text": "", "token_ids": None, "prompt_token_ids": None})
                                for r in result.records])


def mean_in_flight(results: Sequence[LoadResult]) -> float | None:
    """Requests in flight on average while any was: the requests' summed end-to-end latency over
    the time at least one was in flight (Little's law, idle gaps left out, so that a quiet
    request rate reads as the batch its engine ran, not as a fraction of one). None without an
    answered request."""
    busy, total = 0.0, 0.0
    for res in results:
        spans = sorted((r.start, r.start + r.e2el) for r in res.succeeded if r.e2el is not None)
        total += math.fsum(end - start for start, end in spans)
        edge = -math.inf
        for start, end in spans:  # the union of the spans
            busy += max(0.0, end - max(start, edge))
            edge = max(edge, end)
    return total / busy if busy > 0 else None


def request_sample(r: RequestRecord) -> RequestSample:
    """One request as the client saw it, in milliseconds."""
    def ms(x: float | None) -> float | None:
        return None if x is None else x * 1000.0

    return RequestSample(
        prompt_id=r.prompt_id, ok=r.ok, error=r.error, ttft_ms=ms(r.ttft), tpot_ms=ms(r.tpot),
        e2el_ms=ms(r.e2el), prompt_tokens=r.prompt_tokens, output_tokens=r.output_tokens,
        text=r.text, token_ids=r.token_ids, prompt_token_ids=r.prompt_token_ids,
    )


def _log_name(spec: SpecConfig) -> str:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    return f"{stamp}-{re.sub(r'[^A-Za-z0-9_.=-]+', '_', spec.label())}.log"


def summarize(
    results: Sequence[LoadResult], *, spec: SpecConfig, engine: EngineArgs, workload: WorkloadSpec,
    engine_defaults: dict[str, str] | None = None, acceptance: AcceptanceStats | None,
    engine_timing: EngineTimingStats | None = None, command: list[str], log_path: str | None,
    started_at: dt.datetime, startup_seconds: float, peak_memory_bytes: int | None,
    memory_kind: str = "host_rss", kv_cache_tokens: int | None = None, kv_cache_peak_usage: float | None = None,
) -> Measurement:
    """Turn the windows' request records and counters into a Measurement.

    Throughput is the median over windows; latency distributions pool every window's requests.
    """
    records = [r for res in results for r in res.records]
    ok = [r for r in records if r.ok]
    out_tokens = sum(r.output_tokens or 0 for r in ok)
    in_tokens = sum(r.prompt_tokens or 0 for r in ok)
    d = sum(res.duration for res in results)
    windows = [window_stats(res) for res in results]
    return Measurement(
        spec=spec, engine=engine, engine_defaults=engine_defaults or {}, workload=workload,
        concurrency=results[0].concurrency,
        command=command, log_path=log_path, started_at=started_at, startup_seconds=startup_seconds,
        duration_seconds=d, num_requests=len(records), num_failed=len(records) - len(ok),
        input_tokens=in_tokens, output_tokens=out_tokens,
        output_throughput=statistics.median(w.output_throughput for w in windows),
        request_throughput=len(ok) / d if d > 0 else 0.0,
        total_token_throughput=(in_tokens + out_tokens) / d if d > 0 else 0.0,
        ttft_ms=LatencyStats.of([r.ttft for r in ok if r.ttft is not None]),
        tpot_ms=LatencyStats.of([t for r in ok if (t := r.tpot) is not None]),
        itl_ms=LatencyStats.of([x for r in ok for x in r.itl]),
        e2el_ms=LatencyStats.of([r.e2el for r in ok if r.e2el is not None]),
        acceptance=acceptance, engine_timing=engine_timing, peak_memory_bytes=peak_memory_bytes,
        memory_kind=memory_kind,
        kv_cache_tokens=kv_cache_tokens, kv_cache_peak_usage=kv_cache_peak_usage,
        versions=versions(), hardware=hardware(engine.env.get("CUDA_VISIBLE_DEVICES")), windows=windows,
        requests=[request_sample(r) for r in records], mean_in_flight=mean_in_flight(results),
    )


def measure(
    engine: EngineArgs,
    spec: SpecConfig,
    workload: WorkloadSpec,
    prompts: Sequence[Prompt],
    *,
    log_dir: Path,
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT,
    window_timeout: float | None = None,
    progress: TrialHook | None = None,
    server_factory: Callable[..., VLLMServer] = VLLMServer,
    repeats: int = 1,
    answer_margins: bool = True,
    load_process: bool = False,
    step_cost: Sequence[int] = (),
) -> Measurement:
    """Start an engine with ``spec``, measure ``prompts`` through it, stop it.

    Raises:
        EngineStartError / EngineTimeoutError: the engine did not come up (it has been stopped).
        EngineCrashedError: the engine died during the run.
        EngineError: every request failed although the engine lives, or counters unreadable.
    The engine's process group is gone when this returns or raises, KeyboardInterrupt included.
    ``server_factory`` builds the server (same signature as :class:`VLLMServer`).

    The prompts are sent in ``repeats`` windows of disjoint prompts on the same engine, so
    that noise can be told from differences. No prompt is sent twice, and warm-up requests use
    neutral text of their own: proposers that learn from earlier requests (suffix decoding)
    would otherwise be measured on answers they have already seen. A sweep
    (``workload.concurrency_levels``) measures each other level after the headline windows, on
    a window of prompts of its own, with its own counters (:attr:`Measurement.levels`); a sweep of
    request rates (``workload.request_rate_levels``) sends each level at its rate.

    A baseline at temperature 0 then answers the headline prompts again, untimed, with
    log-probabilities (:attr:`Measurement.answer_margins`: what a study's answer check
    classifies differences with); ``answer_margins=False`` skips that pass. ``load_process``: the
    requests are sent from a process of their own (:class:`~spectune.load.LoadProcess`), as a
    worker measuring several engines at once asks.

    A baseline given ``step_cost`` (new tokens per request, :func:`~spectune.stepcost.probe_tokens`)
    times its engine's forwards last, at each load level (:attr:`Measurement.step_cost`); a probe
    that fails leaves it None, with a warning, and the measurement stands.

    Raises ConfigError before any engine starts when a level's window is smaller than the level,
    or when the engine here cannot run ``spec``'s method (:func:`~spectune.engines.check_runnable`).
    """
    hook = progress or (lambda phase, done, total: None)
    windows, sweep = plan_windows(prompts, workload, repeats)  # bad input: refused before the engine
    check_runnable(spec, engine.env)
    log_path = Path(log_dir) / _log_name(spec)
    started_at = dt.datetime.now(dt.timezone.utc)
    server = server_factory(engine, spec, log_path=log_path, startup_timeout=startup_timeout)
    hook("start", 0, 0)
    with contextlib.ExitStack() as stack:
        send = stack.enter_context(LoadProcess()).run_load if load_process else run_load
        stack.enter_context(server)  # stopped first: a window in flight in the load process ends with it
        run = _Run(server, workload, hook, window_timeout, len(prompts), send)
        try:
            run.warm_up()
            results, counters = run.windows(windows)
            levels = run.sweep(sweep)
        except TimeoutError as e:
            raise EngineTimeoutError(
                f"measured window exceeded {window_timeout:.0f} s", log_tail=server.log_tail(),
                log_path=str(log_path),
            ) from e
        except EngineError as e:
            if not isinstance(e, EngineCrashedError) and not _still_running(server):
                raise _crashed(server) from e
            raise
        if not server.is_running():
            raise _crashed(server)
        m = summarize(
            results, spec=spec, engine=server.args, engine_defaults=server.defaults,
            workload=workload, acceptance=AcceptanceStats(**vars(acc)) if (acc := counters.acceptance()) else None,
            engine_timing=EngineTimingStats(**vars(t)) if (t := counters.timing()) else None,
            command=server.command, log_path=str(log_path), started_at=started_at,
            startup_seconds=server.startup_seconds or 0.0,
            peak_memory_bytes=server.peak_memory_bytes(), memory_kind=server.memory_kind,
            kv_cache_tokens=run.kv.tokens, kv_cache_peak_usage=run.kv.peak,
        )
        if m.bursty_delivery:
            _logger.warning(
                "%s: its tokens reached the client in bursts (client TPOT %.3g ms, the engine core's %.3g ms): "
                "its TTFT, TPOT and ITL are the delivery's, not the engine's; its throughput holds",
                spec.label(), m.tpot_ms.mean, m.engine_timing.tpot_ms)  # type: ignore[union-attr]
        if sweep:
            headline = m.level_at(m.headline)
            assert headline is not None
            m.levels = sorted([headline, *levels], key=lambda lv: lv.key)
        if answer_margins and spec.is_baseline and workload.sampling.temperature == 0:
            m.answer_margins = run.margins([p for w in windows for p in w], m.duration_seconds)
        if step_cost and spec.is_baseline:
            m.step_cost = run.step_cost(step_cost, m)
        return m


class _Run:
    """The requests of one trial on its healthy engine: warm-up, headline windows, sweep levels."""

    def __init__(self, server: VLLMServer, workload: WorkloadSpec, hook: TrialHook, timeout: float | None,
                 total: int, send: Callable[..., LoadResult] = run_load) -> None:
        self.server = server
        self.send = send
        """:func:`run_load`, or a load process's (:class:`~spectune.load.LoadProcess`)."""
        self.model = server.served_model_name
        self.workload = workload
        self.hook = hook
        self.timeout = timeout
        self.total = total
        self.done = 0
        self.kv = KVWatch(server.base_url)

    def _load(self, prompts: Sequence[Prompt], workload: WorkloadSpec | None = None) -> LoadResult:
        done = self.done
        self.hook("measure", done, self.total)
        workload = workload or self.workload
        with self.kv.watching():
            result = self.send(self.server.base_url, self.model, prompts, workload, concurrency=workload.concurrency,
                              progress=lambda d, t: self.hook("measure", done + d, self.total), timeout=self.timeout,
                              api_key=self.server.api_key)
        self.done += len(prompts)
        return result

    def warm_up(self) -> None:
        """Neutral requests, before the counters are read: not measured."""
        if self.workload.warmup_requests:
            warm = warmup_prompts(self.workload.warmup_requests, self.workload.sampling.max_tokens)
            self.hook("warmup", 0, len(warm))
            self.send(self.server.base_url, self.model, warm, self.workload, concurrency=1, timeout=self.timeout,
                     api_key=self.server.api_key)

    def windows(self, windows: Sequence[Sequence[Prompt]]) -> tuple[list[LoadResult], SpecCounters]:
        """The headline windows and the engine's counters over them (acceptance, its own timing).

        Raises:
            EngineError: every request failed (the engine crashed, or refuses them).
        """
        before = fetch_counters(self.server.base_url)
        results = [self._load(window) for window in windows]
        if not any(res.succeeded for res in results):
            if not _still_running(self.server):
                raise _crashed(self.server)
            raise EngineError(
                f"all {sum(map(len, windows))} requests failed; first: {results[0].records[0].error}",
                log_tail=self.server.log_tail(), log_path=str(self.server.log_path),
            )
        return results, fetch_counters(self.server.base_url) - before

    def margins(self, prompts: Sequence[Prompt], window_seconds: float) -> AnswerMargins | None:
        """The headline prompts again with their two most likely tokens at each position, after
        the counters were read: untimed (:class:`~spectune.measurement.AnswerMargins`). None, with
        a warning, where no request answered; the measurement stands either way."""
        self.hook("margins", 0, len(prompts))
        t0 = time.perf_counter()
        try:
            res = self.send(self.server.base_url, self.model, prompts, self.workload, concurrency=self.workload.concurrency,
                           progress=lambda d, t: self.hook("margins", d, t), timeout=self.timeout,
                           api_key=self.server.api_key, logprobs=2)
        except TimeoutError:
            res = None
        answered = {r.prompt_id: PromptMargins(token_ids=r.token_ids, margins=r.margins)
                    for r in (res.records if res else []) if r.ok and r.token_ids is not None
                    and r.margins}  # a server that ignores logprobs gives none
        if not answered:
            first = (res.records[0].error or "no log-probabilities in the answers") if res and res.records \
                else f"timed out after {self.timeout} s"
            _logger.warning("the baseline's answers were not asked again with log-probabilities (%s): its answers' "
                            "differences will be unclassified", first)
            return None
        return AnswerMargins(seconds=time.perf_counter() - t0, window_seconds=window_seconds, requests=answered)

    def step_cost(self, new_tokens: Sequence[int], m: Measurement) -> StepCost | None:
        """The engine's step-cost curve at the workload's load levels (:mod:`spectune.stepcost`),
        after everything measured; None, with a warning, where the engine does not answer it."""
        from spectune.stepcost import measure_step_cost, probe_plan

        batches, prefix = probe_plan(self.workload, m, new_tokens, self.server.args.max_model_len)
        self.hook("step cost", 0, len(batches) * len(new_tokens))
        try:
            return measure_step_cost(self.server.base_url, self.model, self.server.api_key, batches=batches,
                                     new_tokens=new_tokens, prefix=prefix, timeout=self.timeout or 120.0)
        except (EngineError, aiohttp.ClientError, TimeoutError) as e:
            _logger.warning("the baseline's engine did not time its steps (%s): candidates are priced without "
                            "a step-cost curve", e)
            return None

    def sweep(self, sweep: dict[float, list[Prompt]]) -> list[LevelStats]:
        """Each other level of a sweep (a concurrency, or a request rate), on prompts and counters
        of its own."""
        levels = []
        for level, prompts in sweep.items():
            workload = self.workload.at_level(level)
            before = fetch_counters(self.server.base_url)
            res = self._load(prompts, workload)
            counters = fetch_counters(self.server.base_url) - before
            acc, timing = counters.acceptance(), counters.timing()
            levels.append(level_stats(workload.concurrency, res, AcceptanceStats(**vars(acc)) if acc else None,
                                      EngineTimingStats(**vars(timing)) if timing else None,
                                      request_rate=workload.request_rate if workload.by_rate else None))
        return levels


def _still_running(server: VLLMServer, grace: float = 5.0) -> bool:
    """Whether the engine lives, allowing a killed one ``grace`` seconds to be seen as dead:
    its clients see the connection reset before its parent sees the exit."""
    deadline = time.monotonic() + grace
    while server.is_running():
        if time.monotonic() > deadline:
            return True
        time.sleep(0.1)
    return False


WARMUP_TOKENS = 16
"""Output tokens of a warm-up request at most: enough to run prefill and decode steps, the
speculative ones included, once, without spending a whole request's time."""


def warmup_prompts(n: int, max_tokens: int = WARMUP_TOKENS) -> list[Prompt]:
    """Neutral warm-up requests, unrelated to any workload's prompts, of at most
    :data:`WARMUP_TOKENS` output tokens (fewer where ``max_tokens`` asks for fewer)."""
    tokens = min(max_tokens, WARMUP_TOKENS)
    return [Prompt(id=f"warmup-{i}", text=f"Warm-up request {i}: count from one to ten.", max_tokens=tokens)
            for i in range(n)]


def plan_windows(prompts: Sequence[Prompt], workload: WorkloadSpec,
                 repeats: int) -> tuple[list[list[Prompt]], dict[float, list[Prompt]]]:
    """The headline windows (at ``workload.headline``) and, for a sweep, one window per other
    level (of ``concurrency_levels`` or ``request_rate_levels``): all disjoint, so that no level
    sees another's prompts (a proposer that learns from earlier answers, suffix decoding, would
    be flattered).

    Raises:
        ConfigError: a level's window holds fewer prompts than the level keeps in flight.
    """
    others = [k for k in workload.levels if k != workload.headline]
    if not others:
        return split_windows(prompts, repeats), {}
    if len(prompts) < repeats + len(others):
        raise ConfigError(f"workload: {len(prompts)} prompts cannot fill {repeats} window(s) and "
                          f"{len(others)} other load level(s); raise num_prompts")
    slices = split_windows(prompts, repeats + len(others))
    sweep = dict(zip(others, slices[repeats:], strict=True))
    short = [] if workload.by_rate else [int(c) for c, window in sweep.items() if len(window) < c]
    if short:
        raise ConfigError(
            f"workload: concurrency level {max(short)} needs at least {max(short)} prompts of its own, but "
            f"{len(prompts)} prompts over {repeats} window(s) and {len(others)} other level(s) give "
            f"{len(sweep[max(short)])}; raise num_prompts to at least {max(short) * (repeats + len(others))}"
        )
    return slices[:repeats], sweep


def split_windows(prompts: Sequence[Prompt], repeats: int) -> list[list[Prompt]]:
    """``prompts`` in ``repeats`` disjoint windows of (nearly) equal size, in order."""
    n = max(1, min(repeats, len(prompts)))
    size, extra = divmod(len(prompts), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        out.append(list(prompts[start:end]))
        start = end
    return out


def _crashed(server: VLLMServer) -> EngineCrashedError:
    return EngineCrashedError(
        f"engine died during the run: {server.failure_reason()}",
        log_tail=server.log_tail(), log_path=str(server.log_path),
    )
