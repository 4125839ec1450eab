"""The cost of a verification step on this hardware, timed on the baseline's engine.

A speculative step for ``B`` sequences with ``k`` drafts each is one forward over ``B(k+1)`` new
tokens on cached contexts. The baseline's engine times such forwards before any speculative engine
starts: ``B`` requests at once, each a cached prefix extended by ``n`` new tokens and asking for one
token, so that each request's prefill (vLLM's ``vllm:request_prefill_time_seconds``, by the engine
core's clock) is one forward over ``B n`` new tokens where the engine took them in one step: the
tokens it computed per step are its prompt tokens less those read from the prefix cache
(``vllm:prompt_tokens``, ``vllm:prompt_tokens_cached``) over its steps (the count of
``vllm:iteration_tokens_total``). The
points, time per forward against tokens per forward at each load, are the step-cost curve
(:class:`~spectune.measurement.StepCost`); :mod:`spectune.predict` prices candidates with it.

The prompts are token ids, not text, so that the new tokens are exactly ``n``: ids of a neutral
text, as the engine's own tokenizer gives them (vLLM's ``/tokenize``), valid in any vocabulary.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import aiohttp

from spectune.counters import SpecCounters, fetch_counters
from spectune.errors import EngineError
from spectune.measurement import Measurement, StepCost, StepCostPoint

if TYPE_CHECKING:
    from spectune.config import WorkloadSpec

__all__ = ["PROBE_ROUNDS", "measure_step_cost", "prefix_length", "probe_plan", "probe_tokens"]

PROBE_ROUNDS = 3
"""Batches sent at each point of the curve: their prefills are averaged."""

_TEXT = ("The river runs past the old mill, under two stone bridges and along a row of houses with green "
         "doors, then turns north through fields of barley toward the hills. ")
"""Neutral text whose token ids the probe's prompts are made of, unrelated to any workload."""

_PREFIX_BLOCK = 128
"""The cached prefix is a whole number of these tokens: every KV-cache block size vLLM uses divides
it, so the whole prefix is read from the cache."""


def probe_tokens(k_max: int) -> list[int]:
    """New tokens per request at which the curve is timed: a step with ``k`` drafts verifies
    ``k + 1`` tokens per sequence; from 1 (the baseline's decode) to ``k_max + 1``, doubling."""
    points, n = [1], 2
    while n < k_max + 1:
        points.append(n)
        n *= 2
    return sorted({*points, k_max + 1})


def prefix_length(prompt_tokens: float | None, max_tokens: int, room: int | None) -> int:
    """Cached context of each probe request: the workload's mean prompt and half its output (the
    context a decode step sees on average), in whole :data:`_PREFIX_BLOCK` s, at least one; at most
    what leaves ``room`` (the engine's ``max_model_len`` less the new tokens) free."""
    want = (prompt_tokens or 0) + max_tokens / 2
    length = max(_PREFIX_BLOCK, round(want / _PREFIX_BLOCK) * _PREFIX_BLOCK)
    if room is not None:
        length = min(length, max(room // _PREFIX_BLOCK * _PREFIX_BLOCK, 0) or room)
    return max(int(length), 1)


def probe_plan(workload: WorkloadSpec, m: Measurement, new_tokens: Sequence[int],
               max_model_len: int | None) -> tuple[list[int], int]:
    """The loads (requests at once) and the cached prefix of a curve for the baseline measured as
    ``m``: each concurrency level of the workload, or for request rates what each kept in flight;
    the prefix from its prompts and outputs (:func:`prefix_length`)."""
    if workload.by_rate:
        batches = sorted({max(1, round(lv.mean_in_flight or 1.0)) for lv in m.levels}
                         or {max(1, round(m.mean_in_flight or 1.0))})
    else:
        batches = sorted({workload.concurrency, *(workload.concurrency_levels or [])})
    room = max_model_len - max(new_tokens) - 2 if max_model_len else None
    return batches, prefix_length(m.input_tokens / max(m.num_requests, 1), workload.sampling.max_tokens, room)


def measure_step_cost(base_url: str, model: str, api_key: str | None, *, batches: Sequence[int],
                      new_tokens: Sequence[int], prefix: int, timeout: float = 120.0, seed: int = 0) -> StepCost:
    """Time one forward of ``b`` sequences of ``n`` new tokens on a cached ``prefix`` for each ``b``
    in ``batches`` and ``n`` in ``new_tokens`` (:data:`PROBE_ROUNDS` batches a point).

    Raises:
        EngineError: a probe request failed, or the engine reports no prefill timing.
    """
    return asyncio.run(_probe(base_url, model, api_key, batches, new_tokens, prefix, timeout, seed))


async def _probe(base_url: str, model: str, api_key: str | None, batches: Sequence[int], new_tokens: Sequence[int],
                 prefix: int, timeout: float, seed: int) -> StepCost:
    """:func:`measure_step_cost` over one HTTP session (the counters are read between the batches,
    while no request runs)."""
    rng = random.Random(seed)
    t0 = time.monotonic()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout), headers=headers) as session:
        pool = await _tokenize(session, base_url, model, _TEXT)
        head = [pool[i % len(pool)] for i in range(prefix)]
        await _send(session, base_url, model, [head])  # the prefix, into the cache
        points = []
        for b in batches:
            for n in new_tokens:
                before = fetch_counters(base_url)
                for _ in range(PROBE_ROUNDS):  # new tokens: not in the cache
                    await _send(session, base_url, model, [head + rng.choices(pool, k=n) for _ in range(b)])
                points.append(_point(b, n, fetch_counters(base_url) - before))
    return StepCost(points=points, prefix_tokens=prefix, seconds=time.monotonic() - t0)


def _point(batch: int, n: int, c: SpecCounters) -> StepCostPoint:
    """The point the counters ``c`` of its batches give.

    Raises:
        EngineError: the engine reports no prefill timing.
    """
    if c.prefills <= 0:
        raise EngineError("the engine reports no prefill timing (vllm:request_prefill_time_seconds): "
                          "no step-cost curve")
    return StepCostPoint(
        batch=batch, new_tokens=n,
        tokens=(c.prompt_tokens - c.cached_prompt_tokens) / c.steps if c.steps > 0 else float(batch * n),
        ms=1000.0 * c.prefill_seconds / c.prefills,
        cached_tokens=c.cached_prompt_tokens / c.prefills if c.cached_prompt_tokens > 0 else None)


async def _tokenize(session: aiohttp.ClientSession, base_url: str, model: str, text: str) -> list[int]:
    """The ids of ``text`` by the engine's tokenizer, without special tokens."""
    body = {"model": model, "prompt": text, "add_special_tokens": False}
    async with session.post(f"{base_url}/tokenize", json=body) as r:
        if r.status != 200:
            raise EngineError(f"the engine did not tokenize the probe's text: HTTP {r.status}: "
                              f"{(await r.text())[:200]}")
        ids = (await r.json()).get("tokens") or []
    if not ids:
        raise EngineError("the engine tokenized the probe's text to no tokens")
    return [int(i) for i in ids]


async def _send(session: aiohttp.ClientSession, base_url: str, model: str, prompts: list[list[int]]) -> None:
    """``prompts`` at once to the completions API, one greedy token each."""

    async def one(ids: list[int]) -> None:
        body = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0.0}
        async with session.post(f"{base_url}/v1/completions", json=body) as r:
            if r.status != 200:
                raise EngineError(f"a step-cost probe request failed: HTTP {r.status}: {(await r.text())[:200]}")
            await r.read()

    await asyncio.gather(*(one(ids) for ids in prompts))
