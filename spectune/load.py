"""Async streaming load generator for OpenAI-compatible servers (engine-neutral).

Each request is streamed; the client takes timestamps itself (time to first token, the gap
between chunks, end-to-end latency) and reads token counts from the ``usage`` the server
sends at the end of the stream, never from counting chunks. vLLM's ``return_token_ids``
extension is requested too, so the generated token ids are recorded (offline replay of
model-free proposers uses them); servers that ignore it are measured all the same. With
``logprobs``, each output position's margin between its two most likely tokens is kept too
(:attr:`RequestRecord.margins`): what tells a rounding difference from a changed answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from spectune.config import Prompt, WorkloadSpec

__all__ = ["LoadProcess", "LoadResult", "RequestRecord", "arrival_offsets", "run_load"]

_logger = logging.getLogger(__name__)

ProgressHook = Callable[[int, int], None]
"""Called with (requests done, requests in all) after each request."""


@dataclass
class RequestRecord:
    """What the client saw of one request. Times are seconds, taken with ``time.perf_counter``."""

    prompt_id: str
    ok: bool = False
    error: str | None = None
    start: float = 0.0
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    e2el: float | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    text: str = ""
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    finish_reason: str | None = None
    margins: list[float | None] | None = None
    """With ``logprobs``: at each output position, the log-probability of its most likely token
    less that of the second (None where the server gave fewer than two)."""

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first, as vLLM's benchmark defines it."""
        if self.ttft is None or self.e2el is None or not self.output_tokens or self.output_tokens < 2:
            return None
        return (self.e2el - self.ttft) / (self.output_tokens - 1)


@dataclass
class LoadResult:
    """All requests of one measured window, with the window's wall-clock duration."""

    records: list[RequestRecord]
    duration: float
    concurrency: int

    @property
    def succeeded(self) -> list[RequestRecord]:
        return [r for r in self.records if r.ok]

    @property
    def failed(self) -> list[RequestRecord]:
        return [r for r in self.records if not r.ok]


def _request_body(prompt: Prompt, model: str, workload: WorkloadSpec,
                  logprobs: int | None = None) -> tuple[str, dict[str, Any]]:
    s = workload.sampling
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": prompt.max_tokens or s.max_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    if s.seed is not None:
        body["seed"] = s.seed
    if s.ignore_eos:
        body["ignore_eos"] = True
    if s.stop:
        body["stop"] = s.stop
    if logprobs:  # tokens named by id: two tokens that decode alike stay two entries
        body["return_tokens_as_token_ids"] = True
    if workload.api == "chat":
        messages = [m.model_dump() for m in prompt.messages] if prompt.messages else [
            {"role": "user", "content": prompt.as_text()}
        ]
        if logprobs:
            body.update(logprobs=True, top_logprobs=logprobs)
        return "/v1/chat/completions", {**body, "messages": messages}
    if logprobs:
        body["logprobs"] = logprobs
    return "/v1/completions", {**body, "prompt": prompt.as_text()}


def _margin(values: list[float]) -> float | None:
    top = sorted((v for v in values if v is not None and math.isfinite(v)), reverse=True)
    return round(top[0] - top[1], 6) if len(top) >= 2 else None


def _chunk_margins(choice: dict[str, Any]) -> list[float | None]:
    """The margins of the positions a stream chunk's choice carries (completions: a mapping of
    token to log-probability per position; chat: a list of entries per position)."""
    lp = choice.get("logprobs") or {}
    if "content" in lp:
        return [_margin([t.get("logprob") for t in e.get("top_logprobs") or []]) for e in lp.get("content") or []]
    return [_margin(list((top or {}).values())) for top in lp.get("top_logprobs") or []]


def _chunk_text(choice: dict[str, Any]) -> str:
    if "delta" in choice:
        return (choice.get("delta") or {}).get("content") or ""
    return choice.get("text") or ""


async def _one_request(
    session: aiohttp.ClientSession, base_url: str, model: str, prompt: Prompt, workload: WorkloadSpec,
    logprobs: int | None = None,
) -> RequestRecord:
    path, body = _request_body(prompt, model, workload, logprobs)
    rec = RequestRecord(prompt_id=prompt.id)
    rec.start = t0 = time.perf_counter()
    last = t0
    texts: list[str] = []
    token_ids: list[int] = []
    margins: list[float | None] = []
    got_ids = False
    try:
        async with session.post(base_url + path, json=body) as resp:
            if resp.status != 200:
                detail = (await resp.text())[:300].replace("\n", " ")
                rec.error = f"HTTP {resp.status}: {detail}"
                return rec
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("prompt_token_ids") is not None:  # the chat API's: on the chunk, not its choice
                    rec.prompt_token_ids = list(chunk["prompt_token_ids"])
                if usage := chunk.get("usage"):
                    rec.prompt_tokens = usage.get("prompt_tokens")
                    rec.output_tokens = usage.get("completion_tokens")
                for choice in chunk.get("choices") or []:
                    piece = _chunk_text(choice)
                    ids = choice.get("token_ids")
                    if choice.get("prompt_token_ids") is not None:
                        rec.prompt_token_ids = list(choice["prompt_token_ids"])
                    if ids:
                        got_ids = True
                        token_ids.extend(ids)
                    if logprobs:
                        margins.extend(_chunk_margins(choice))
                    if piece or ids:
                        now = time.perf_counter()
                        if rec.ttft is None:
                            rec.ttft = now - t0
                        else:
                            rec.itl.append(now - last)
                        last = now
                        texts.append(piece)
                    if choice.get("finish_reason"):
                        rec.finish_reason = choice["finish_reason"]
        rec.e2el = time.perf_counter() - t0
        rec.text = "".join(texts)
        rec.token_ids = token_ids if got_ids else None
        rec.margins = margins if logprobs else None
        if rec.output_tokens is None:
            rec.error = "the server sent no usage"
        else:
            rec.ok = True
    except asyncio.TimeoutError:
        rec.error = f"request timed out after {workload.request_timeout:g} s"
    except (aiohttp.ClientError, json.JSONDecodeError, OSError) as e:
        rec.error = f"{type(e).__name__}: {e}"
    return rec


def arrival_offsets(n: int, rate: float | None, seed: int = 0, burstiness: float = 1.0) -> list[float]:
    """When each of ``n`` requests is due, in seconds from the window's start: all at once for a
    fixed concurrency (``rate`` None), else arrivals at ``rate`` per second, the first at 0, as
    vLLM's benchmark sends them: gamma-distributed gaps of shape ``burstiness`` and mean
    ``1 / rate`` drawn from ``seed`` (1: a Poisson process; below 1: bursts and lulls)."""
    if rate is None:
        return [0.0] * n
    rng = random.Random(seed)
    offsets, t = [], 0.0
    for _ in range(n):
        offsets.append(t)
        t += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
    return offsets


async def _run(
    base_url: str, model: str, prompts: Sequence[Prompt], workload: WorkloadSpec,
    concurrency: int, progress: ProgressHook | None, api_key: str | None, logprobs: int | None = None,
) -> LoadResult:
    timeout = aiohttp.ClientTimeout(total=workload.request_timeout, sock_connect=10)
    connector = aiohttp.TCPConnector(limit=concurrency)
    sem = asyncio.Semaphore(concurrency)
    done = 0
    due = arrival_offsets(len(prompts), workload.request_rate, workload.seed, workload.burstiness)

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    async with aiohttp.ClientSession(timeout=timeout, connector=connector, headers=headers) as session:

        async def bounded(p: Prompt, at: float) -> RequestRecord:
            nonlocal done
            if at > 0:  # a Poisson arrival: wait for its time, then for a free slot under the cap
                await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
            async with sem:
                rec = await _one_request(session, base_url, model, p, workload, logprobs)
            done += 1
            if progress is not None:
                progress(done, len(prompts))
            return rec

        t0 = time.perf_counter()
        records = await asyncio.gather(*(bounded(p, at) for p, at in zip(prompts, due, strict=True)))
        duration = time.perf_counter() - t0
    for rec in records:
        rec.start -= t0
    return LoadResult(records=list(records), duration=duration, concurrency=concurrency)


def run_load(
    base_url: str,
    model: str,
    prompts: Sequence[Prompt],
    workload: WorkloadSpec,
    *,
    concurrency: int | None = None,
    progress: ProgressHook | None = None,
    timeout: float | None = None,
    api_key: str | None = None,
    logprobs: int | None = None,
) -> LoadResult:
    """Send ``prompts`` with at most ``concurrency`` in flight, all at once or, with the
    workload's ``request_rate``, as Poisson arrivals (:func:`arrival_offsets`); return what the
    client saw.

    A request that fails is recorded with its error, never raised: the caller decides
    whether the window is usable. ``timeout`` bounds the whole window and raises
    ``TimeoutError`` (each request is bounded by ``workload.request_timeout`` as well).
    ``api_key``: sent as ``Authorization: Bearer``, as the server asks (:attr:`EngineServer.api_key
    <spectune.engines.EngineServer.api_key>`). ``logprobs``: ask for that many most likely tokens
    at each position and keep their margins (:attr:`RequestRecord.margins`); it slows the engine,
    so a timed window never asks.
    """
    c = concurrency or workload.concurrency
    run = _run(base_url.rstrip("/"), model, prompts, workload, c, progress, api_key, logprobs)
    return asyncio.run(asyncio.wait_for(run, timeout) if timeout else run)


class LoadProcess:
    """A process of its own that sends a trial's requests (:func:`run_load` there), for workers
    that measure several engines at once: their clients then share no interpreter lock, and
    one engine's stream parsing cannot delay another's timestamps. Progress is relayed back.

    Use as a context manager; the process starts at the first window (it inherits the CPUs the
    calling thread may run on) and ends with the block. Spawned, not forked: the worker's
    threads hold locks a forked child would inherit held.
    """

    def __init__(self) -> None:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        ctx = multiprocessing.get_context("spawn")
        self._progress = ctx.Queue()
        self._pool = ProcessPoolExecutor(1, mp_context=ctx, initializer=_child_init, initargs=(self._progress,))

    def __enter__(self) -> LoadProcess:
        return self

    def __exit__(self, kind: object, *_: object) -> None:
        # on an error (the engine stopped, a polite stop) the window in flight ends on its own
        self._pool.shutdown(wait=kind is None, cancel_futures=True)

    def run_load(self, base_url: str, model: str, prompts: Sequence[Prompt], workload: WorkloadSpec, *,
                 concurrency: int | None = None, progress: ProgressHook | None = None, timeout: float | None = None,
                 api_key: str | None = None, logprobs: int | None = None) -> LoadResult:
        """:func:`run_load` with these arguments, in the process."""
        import queue

        future = self._pool.submit(_child_run, base_url, model, list(prompts), workload, concurrency, timeout,
                                   api_key, logprobs)
        while True:
            try:
                item = self._progress.get(timeout=0.2)
            except queue.Empty:
                if future.done() and self._progress.empty():
                    break
                continue
            if item is None:  # the window's end
                break
            if progress is not None:
                progress(*item)
        return future.result()


_CHILD_PROGRESS: Any = None


def _child_init(progress: Any) -> None:  # runs in the load process
    global _CHILD_PROGRESS  # noqa: PLW0603 - the process's one channel back
    _CHILD_PROGRESS = progress


def _child_run(base_url: str, model: str, prompts: list[Prompt], workload: WorkloadSpec, concurrency: int | None,
               timeout: float | None, api_key: str | None, logprobs: int | None) -> LoadResult:
    try:
        return run_load(base_url, model, prompts, workload, concurrency=concurrency, timeout=timeout,
                        api_key=api_key, logprobs=logprobs, progress=lambda d, t: _CHILD_PROGRESS.put((d, t)))
    finally:
        _CHILD_PROGRESS.put(None)
