"""A landscape: every candidate of a space measured on real engines, kept as a file.

Recorded from a grid study (:meth:`Landscape.from_study`), a landscape answers a study again
without engines: :meth:`Landscape.measurer` replays each candidate's recorded Measurement (or
its recorded engine failure) in :func:`spectune.study.run_study`, so that search strategies
(guided, TPE, random, grid) can be compared on the same real numbers, counting the engine
seconds each one would have spent. The benchmark ``benchmarks/search_efficiency.py`` and the
tests of guided search use it.

A candidate may hold several engine starts (grid studies recorded more than once and
:meth:`Landscape.combine`-d): a replayed study then gets the first engine the first time it
measures the candidate, the second the next time (a confirmation, a re-measurement), and so
on in turn, as a real study gets a fresh engine each time.

Model paths are kept as recorded; :meth:`Landscape.rebase` points them at another copy of the
same checkpoints (tiny models are rebuilt deterministically on each machine).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import statistics
from collections.abc import Callable
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

from pydantic import Field

from spectune._util import StrictModel, atomic_write_text, validate
from spectune.config import SpecConfig
from spectune.errors import ConfigError, EngineError
from spectune.measurement import Measurement, spec_key
from spectune.records import StudyRecord, TrialRecord

if TYPE_CHECKING:
    from spectune.results import StudyView
    from spectune.study import StudyConfig

__all__ = ["Landscape", "LandscapePoint"]

FORMAT_VERSION = 1


class LandscapePoint(StrictModel):
    """One candidate: its recorded Measurement or engine failure, and what measuring it cost."""

    spec: dict[str, Any] = Field(description="vLLM's speculative_config, {'method': 'none'} for the baseline.")
    label: str
    engine_seconds: float = Field(ge=0, description="Wall time of the trial: engine start, warm-up, windows, stop.")
    measurement: Measurement | None = None
    error: str | None = None

    @property
    def key(self) -> str:
        return spec_key(None if self.spec.get("method", "none") == "none" else self.spec)


class Landscape(StrictModel):
    """Every candidate of one study's space, measured on one or more engines (see the module
    docstring); ``points`` holds one point per engine start, the first recorded first."""

    format_version: int = FORMAT_VERSION
    recorded_at: dt.datetime
    study_config: dict[str, Any] = Field(description="The StudyConfig the grid study ran with.")
    points: list[LandscapePoint]

    # -- making and keeping ---------------------------------------------------------------

    @classmethod
    def from_study(cls, view: StudyView) -> Landscape:
        """The landscape of a finished grid study: each candidate's first finished trial.

        Raises:
            ConfigError: the study was not made by spectune or has no completed trial.
        """
        cfg = StudyRecord.of(view.study).spectune_config
        if not isinstance(cfg, dict):
            raise ConfigError(f"study {view.name} carries no spectune configuration")
        points: dict[str, LandscapePoint] = {}
        ids = view.store.trial_ids(view.name)
        for t in view.study.get_trials(deepcopy=False):
            r = TrialRecord.of(t)
            if t.state.name not in ("COMPLETE", "FAIL") or r.duplicate_of is not None:
                continue
            if t.state.name == "FAIL" and (r.fail_reason is None or r.interrupted):
                continue
            if t.datetime_start is None or t.datetime_complete is None:
                continue
            m = view.store.measurement(ids.get(t.number)) if t.state.name == "COMPLETE" else None
            if t.state.name == "COMPLETE" and m is None:
                continue
            point = LandscapePoint(
                spec=r.spec or {"method": "none"}, label=r.config or "?",
                engine_seconds=(t.datetime_complete - t.datetime_start).total_seconds(),
                measurement=m, error=r.fail_reason if m is None else None,
            )
            points.setdefault(point.key, point)
        if not any(p.measurement for p in points.values()):
            raise ConfigError(f"study {view.name} has no completed trial to make a landscape of")
        return cls(recorded_at=dt.datetime.now(dt.UTC), study_config=cfg, points=list(points.values()))

    def save(self, path: Path) -> None:
        atomic_write_text(path, self.model_dump_json(indent=None) + "\n")

    @classmethod
    def load(cls, path: Path) -> Landscape:
        """Raises ConfigError naming the file when it is missing or not a landscape."""
        try:
            data = json.loads(path.read_text())
        except OSError as e:
            raise ConfigError(f"{path}: cannot read the landscape: {e.strerror or e}") from e
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: line {e.lineno}: not JSON: {e.msg}") from e
        return validate(cls, data, str(path))

    # -- reading -------------------------------------------------------------------------

    @property
    def target(self) -> str:
        return str(self.study_config["target"])

    @property
    def draft(self) -> str | None:
        return self.study_config.get("draft")

    def point(self, spec: SpecConfig) -> LandscapePoint | None:
        """The candidate's first recorded engine start."""
        return self.by_key().get(spec_key(spec.to_vllm()))

    def by_key(self) -> dict[str, LandscapePoint]:
        """Each candidate's first recorded engine start, in recording order."""
        return {k: engines[0] for k, engines in self.engines().items()}

    def engines(self) -> dict[str, list[LandscapePoint]]:
        """Each candidate's recorded engine starts, in recording order."""
        out: dict[str, list[LandscapePoint]] = {}
        for p in self.points:
            out.setdefault(p.key, []).append(p)
        return out

    @classmethod
    def combine(cls, landscapes: list[Landscape]) -> Landscape:
        """One landscape with the engine starts of all of these, which must be of the same study
        (target, draft, engine, workload, windows, space and objectives) recorded more than once
        on the same kind of machine.

        Raises:
            ConfigError: the landscapes differ in one of those, naming it.
        """
        if not landscapes:
            raise ConfigError("no landscape to combine")
        first = landscapes[0]
        for other in landscapes[1:]:
            for key in ("target", "draft", "engine", "workload", "repeats", "space", "objectives", "slo"):
                if first.study_config.get(key) != other.study_config.get(key):
                    raise ConfigError(f"cannot combine landscapes of different studies: their {key} differ")
            if first.hardware() != other.hardware():
                raise ConfigError(f"cannot combine landscapes of different machines: {first.hardware()} "
                                  f"and {other.hardware()}")
        return first.model_copy(update={"points": [p for ls in landscapes for p in ls.points]})

    def hardware(self) -> dict[str, Any] | None:
        """The machine of the first measured engine start (platform, CPU, cores, GPUs)."""
        m = next((p.measurement for p in self.points if p.measurement is not None), None)
        if m is None:
            return None
        hw = m.hardware.model_dump(mode="json")
        return {k: hw.get(k) for k in ("platform", "cpu", "cpu_count", "gpus")}

    def starts(self, objective: str) -> dict[str, list[float]]:
        """Each candidate's ``objective`` on each of its measured engine starts, by its key (as
        :meth:`engines`: labels may collide); empty for a candidate whose engines all failed."""
        return {key: [v for p in starts if (v := self.value(p, objective)) is not None]
                for key, starts in self.engines().items()}

    def means(self, objective: str) -> dict[str, float]:
        """Each candidate's ``objective`` by its label: the mean over its measured engine starts."""
        engines = self.engines()
        return {engines[key][0].label: statistics.fmean(values)
                for key, values in self.starts(objective).items() if values}

    def engine_spread(self, objective: str) -> float | None:
        """The pooled relative standard deviation of one engine start of a candidate, as a study
        reckons its own (:func:`spectune.results.pooled_spread`); None for a landscape of one
        start per candidate."""
        from spectune.results import pooled_spread

        return pooled_spread(self.starts(objective).values())

    def noise_band(self, objective: str, *, floor: float = 0.02) -> float:
        """How far two candidates' means may lie apart and still be told apart by nothing but
        engine starts: twice the pooled relative spread of one engine start around its candidate's
        mean (over the candidates with several measured starts), at least ``floor`` (the noise of
        one measurement; ``floor`` alone for a landscape of one start per candidate). The spread
        here is each start's squared distance from its candidate's mean, averaged over the
        starts; :meth:`engine_spread` divides by the degrees of freedom instead, as a study does,
        and is larger by up to sqrt(2) with two starts per candidate."""
        dev = []
        for values in self.starts(objective).values():
            if len(values) > 1:
                mean = statistics.fmean(values)
                dev += [(v / mean - 1.0) ** 2 for v in values]
        return max(floor, 2.0 * math.sqrt(statistics.fmean(dev))) if dev else floor

    def value(self, point: LandscapePoint, objective: str) -> float | None:
        """The point's measured value of ``objective`` (None for an engine failure)."""
        from spectune.measurement import Objective

        return None if point.measurement is None else Objective(objective).of(point.measurement)

    def config(self, **overrides: Any) -> StudyConfig:
        """The recorded StudyConfig with ``overrides`` (storage, sampler, study_name, trials...)."""
        from spectune.study import StudyConfig

        return validate(StudyConfig, {**self.study_config, **overrides}, "landscape study config")

    def rebase(self, target: str, draft: str | None = None) -> Landscape:
        """The same landscape with the recorded target (and draft) paths replaced by these; the
        other checkpoints recorded beside the target (a head built there) move beside the new one."""
        old = {self.target: target}
        if self.draft is not None and draft is not None:
            old[self.draft] = draft
        was, now = PurePath(self.target).parent, PurePath(target).parent

        def move(value: Any) -> Any:
            if not isinstance(value, str):
                return value
            if value in old:
                return old[value]
            path = PurePath(value)
            return str(now / path.name) if path.is_absolute() and path.parent == was else value

        points = []
        for p in self.points:
            spec = {k: move(v) if k == "model" else v for k, v in p.spec.items()}
            m = p.measurement
            if m is not None:
                m = m.model_copy(update={
                    "spec": m.spec.model_copy(update={"model": move(m.spec.model)}),
                    "engine": m.engine.model_copy(update={"model": move(m.engine.model)}),
                })
            points.append(p.model_copy(update={"spec": spec, "measurement": m}))
        cfg = {**self.study_config, "target": target}
        if draft is not None:
            cfg["draft"] = draft
        return self.model_copy(update={"study_config": cfg, "points": points})

    # -- replaying -----------------------------------------------------------------------

    def engine_clock(self) -> Callable[[SpecConfig], float]:
        """How long each trial takes on a virtual clock (:func:`spectune.worker.replay_on_clock`):
        the n-th call for a candidate gives its n-th recorded engine start's seconds (in turn when
        it has fewer), the start :meth:`measurer` answers that trial with."""
        engines = self.engines()
        calls: dict[str, int] = {}

        def seconds(spec: SpecConfig) -> float:
            key = spec_key(spec.to_vllm())
            n = calls[key] = calls.get(key, -1) + 1
            return engines[key][n % len(engines[key])].engine_seconds

        return seconds

    def measurer(self, spent: list[tuple[str, float]] | None = None) -> Callable[..., Measurement]:
        """A stand-in for :func:`spectune.trial.measure` that answers from this landscape.

        The n-th call for a candidate answers from its n-th recorded engine start, in turn when
        it has fewer. Each call appends ``(label, engine_seconds)`` to ``spent``. An engine start
        recorded as a failure raises EngineError with the recorded reason, as the engine did.

        Raises (from the returned function):
            ConfigError: the candidate is not in the landscape (another space was given).
        """
        engines = self.engines()
        calls: dict[str, int] = {}

        def measure(engine: object, spec: SpecConfig, *args: object, **kwargs: object) -> Measurement:
            key = spec_key(spec.to_vllm())
            if key not in engines:
                raise ConfigError(f"candidate {spec.label()} is not in the landscape")
            n = calls[key] = calls.get(key, -1) + 1
            p = engines[key][n % len(engines[key])]
            if spent is not None:
                spent.append((p.label, p.engine_seconds))
            if p.measurement is None:
                raise EngineError(p.error or "engine failed")
            return p.measurement

        return measure
