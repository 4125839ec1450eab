"""Guided search with the baseline's step-cost curve (the recorded tiny landscape, its baseline
given a curve on which a step over more tokens costs far more): the model-free candidates it
prices are predicted to lose to the baseline and are not measured; the study says so."""

from __future__ import annotations

from pathlib import Path

from spectune.config import Method, SpecConfig
from spectune.landscape import Landscape
from spectune.measurement import Measurement, StepCost, StepCostPoint
from spectune.records import StudyRecord
from spectune.results import open_study
from spectune.worker import run_study

STEEP = StepCost(points=[StepCostPoint(batch=1, new_tokens=n, tokens=float(n), ms=10.0 * n * n)
                         for n in (1, 2, 4, 8, 16, 33)], prefix_tokens=128, seconds=1.0)
"""A step over n tokens costs n^2 times a decode step: no acceptance pays for it."""


def test_candidates_the_curve_prices_to_lose_are_not_measured_and_the_study_says_so(
        landscape: Landscape, tmp_path: Path, spread_not_learned_first: None) -> None:
    inner = landscape.measurer(spent := [])

    def measure(engine: object, spec: SpecConfig, *args: object, **kwargs: object) -> Measurement:
        m = inner(engine, spec, *args, **kwargs)
        return m.model_copy(update={"step_cost": STEEP}) if spec.is_baseline else m

    url = f"sqlite:///{tmp_path / 's.db'}"
    config = landscape.config(storage=url, study_name="steep", sampler="guided", trials=len(landscape.points),
                              extend=False, log_dir=str(tmp_path / "logs"))
    run_study(config, measure_fn=measure)
    view = open_study(url, "steep")
    model_free = {p.label for p in landscape.points if p.spec.get("method") in (Method.NGRAM, Method.SUFFIX)}
    assert model_free and not model_free & {label for label, _ in spent}  # none measured
    guide = StudyRecord.of(view.study).guide or {}
    assert model_free <= set(guide["losing"])  # every one predicted to lose to the baseline
    assert f"{len(guide['losing'])} of them predicted to lose to the baseline" in guide["stop_reason"]
