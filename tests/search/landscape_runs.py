"""Studies replayed on the recorded tiny landscape (benchmarks/landscapes/tiny_one_start.json): its values,
and stand-in engines that run slower once or on a second engine. The study loop, Optuna, the storage and the models
are real; only the engine runs are answered from the file (``run_study(measure_fn=...)``), and with several
slots of one worker on a virtual clock (:func:`replay_workers`)."""

from __future__ import annotations

import contextlib

from spectune.config import SpecConfig
from spectune.errors import EngineError
from spectune.landscape import Landscape
from spectune.measurement import Measurement
from spectune.study import StudyConfig


def landscape_values(landscape: Landscape) -> dict[str, float]:
    return {p.label: v for p in landscape.points if (v := landscape.value(p, "output_throughput")) is not None}

def scaled(m: Measurement, factor: float) -> Measurement:
    """``m`` as if its engine had run ``factor`` as fast (throughput times ``factor``, each window's
    TPOT divided by it)."""
    windows = [w.model_copy(update={"output_throughput": w.output_throughput * factor,
                                    "tpot_median_ms": (w.tpot_median_ms or 0.0) / factor}) for w in m.windows]
    return m.model_copy(update={"output_throughput": m.output_throughput * factor, "windows": windows})

def slower(landscape: Landscape, factor: float) -> Landscape:
    """The landscape as if every engine had run ``factor`` as fast."""
    points = [p.model_copy(update={"measurement": p.measurement and scaled(p.measurement, factor)})
              for p in landscape.points]
    return landscape.model_copy(update={"points": points})

def slow_once(landscape: Landscape, label: str, spent: list[tuple[str, float]], *, interrupt_after: bool = False):  # noqa: ANN202
    """The landscape's measurer, but ``label``'s first engine runs at 0.4x; with
    ``interrupt_after``, Ctrl-C when it is measured again."""
    inner = landscape.measurer(spent)
    calls: list[str] = []

    def measure(engine: object, spec: SpecConfig, *args: object, **kwargs: object) -> Measurement:
        calls.append(spec.label())
        if interrupt_after and calls.count(label) == 2:
            raise KeyboardInterrupt
        m = inner(engine, spec, *args, **kwargs)
        return scaled(m, 0.4) if spec.label() == label and calls.count(label) == 1 else m

    return measure

def second_engine(landscape: Landscape, factor: float, spent: list[tuple[str, float]],
                   baseline_factor: float = 1.0):  # noqa: ANN202
    """The landscape's measurer, but a speculative candidate's second engine runs ``factor`` as fast
    (:func:`scaled`), the baseline's ``baseline_factor`` as fast."""
    inner = landscape.measurer(spent)
    seen: set[str] = set()

    def measure(engine: object, spec: SpecConfig, *args: object, **kwargs: object) -> Measurement:
        m = inner(engine, spec, *args, **kwargs)
        again = spec.label() in seen
        seen.add(spec.label())
        return scaled(m, baseline_factor if spec.is_baseline else factor) if again else m

    return measure

def replay_workers(config: StudyConfig, landscape: Landscape, slots: int) -> list[tuple[float, str]]:
    """Study ``config`` worked on by ``slots`` slots of one worker, on a virtual clock: a trial takes its
    recorded engine seconds, a slot told to wait asks again once the next trial ends, and free slots ask in
    turn. Deterministic (no threads, no sleeping); the worker's own claim and measure do the rest. The trials
    in the order they ended, each with the virtual second it ended."""
    import heapq

    from spectune.measurement import spec_key
    from spectune.objective import TrialFunction
    from spectune.search import Stop, StudyStrategy, Wait
    from spectune.storage import StorageGuard
    from spectune.study import create_study
    from spectune.worker import Slot, _Worker

    ctx = create_study(config)
    guard = StorageGuard(ctx.url, config.storage_outage_limit)
    strategy = StudyStrategy(space=ctx.space, store=ctx.store, url=ctx.url, sampler=config.sampler,
                             objectives=len(config.objectives), trials=config.trials, confirm=config.confirm,
                             time_budget=config.time_budget, tolerance=config.tolerance)
    run = TrialFunction(config=config, study=ctx.study, storage=ctx.storage, store=ctx.store, engine=ctx.engine,
                        prompts=ctx.prompts, measure=landscape.measurer(), hook=lambda e: None, guard=guard)
    worker = _Worker(ctx, strategy, run, [Slot((i,)) for i in range(slots)], 0.0, guard)
    engines, starts = landscape.engines(), {}
    now, running, asking, ended = 0.0, [], list(range(slots)), []
    while True:
        waiting = []
        for i in asking:
            claimed = worker.claim(worker.slots[i])
            if isinstance(claimed, Wait):
                waiting.append(i)
            elif not isinstance(claimed, Stop):
                key = spec_key(claimed.spec.to_vllm())
                n = starts[key] = starts.get(key, -1) + 1  # the n-th start, as the measurer answers it
                seconds = engines[key][n % len(engines[key])].engine_seconds
                heapq.heappush(running, (now + seconds, claimed.trial.number, i, claimed))
        if not running:
            return ended
        now, _, i, claimed = heapq.heappop(running)
        with contextlib.suppress(EngineError):
            worker.measure(claimed, worker.slots[i])
        ended.append((now, claimed.spec.label()))
        asking = sorted({*waiting, i})
