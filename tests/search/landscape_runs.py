"""Studies replayed on the recorded tiny landscape (benchmarks/landscapes/tiny_one_start.json): its values,
and stand-in engines that run slower once or on a second engine. The study loop, Optuna, the storage and the models
are real; only the engine runs are answered from the file (``run_study(measure_fn=...)``), and with several
slots of one worker on a virtual clock (:func:`replay_workers`)."""

from __future__ import annotations

from spectune.config import SpecConfig
from spectune.landscape import Landscape
from spectune.measurement import Measurement
from spectune.study import StudyConfig
from spectune.worker import replay_on_clock


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
    """Study ``config`` worked on by ``slots`` slots of one worker on a virtual clock (:func:`replay_on_clock`),
    each trial taking its recorded engine seconds: the trials in the order they ended, with the second each ended."""
    return replay_on_clock(config, landscape.measurer(), landscape.engine_clock(), slots)
