"""A study worked on by several slots of one worker on a virtual clock: the order real workers
would take, in engine seconds, without engines, threads or sleeping (:func:`replay_on_clock`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from spectune.errors import EngineError
from spectune.search import Stop, Wait
from spectune.slots import Slot
from spectune.study import StudyConfig, create_study

if TYPE_CHECKING:

    from spectune.config import SpecConfig
    from spectune.measurement import Measurement

from spectune.worker._loop import _Claim, _Worker


def replay_on_clock(config: StudyConfig, measure_fn: Callable[..., Measurement],
                    seconds: Callable[[SpecConfig], float], slots: int) -> list[tuple[float, str]]:
    """Study ``config`` worked on by ``slots`` slots of one worker on a virtual clock, without
    engines, threads or sleeping: ``measure_fn`` answers each trial (a landscape's
    :meth:`~spectune.landscape.Landscape.measurer`), which takes ``seconds(spec)`` of the clock
    (called once per trial, in the order they start); a slot told to wait asks again once the
    next trial ends, and free slots ask in turn. The worker's own claim and measure do the rest,
    so that the order is the one real workers would take, in engine seconds. The trials in the
    order they ended, each with the virtual second it ended."""
    import heapq

    from spectune.objective import TrialFunction

    ctx = create_study(config)
    guard = ctx.guard()
    run = TrialFunction(ctx, measure=measure_fn, hook=lambda e: None, guard=guard)
    worker = _Worker(ctx, ctx.strategy(), run, [Slot((i,)) for i in range(slots)], 0.0, guard)
    now, asking = 0.0, list(range(slots))
    running: list[tuple[float, int, int, _Claim]] = []
    ended: list[tuple[float, str]] = []
    while True:
        waiting = []
        for i in asking:
            claimed = worker.claim(worker.slots[i])
            if isinstance(claimed, Wait):
                waiting.append(i)
            elif not isinstance(claimed, Stop):
                heapq.heappush(running, (now + seconds(claimed.spec), claimed.trial.number, i, claimed))
        if not running:
            return ended
        now, _, i, claimed = heapq.heappop(running)
        with contextlib.suppress(EngineError):
            worker.measure(claimed, worker.slots[i])
        ended.append((now, claimed.spec.label()))
        asking = sorted({*waiting, i})
