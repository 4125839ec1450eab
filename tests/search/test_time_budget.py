"""A study's time budget: engine time summed over its trials decides whether one more starts."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution

from spectune._util import validate
from spectune.records import StudyRecord, TrialRecord
from spectune.search import Run, Stop, Wait
from spectune.search._study import StudyStrategy
from spectune.space import load_space
from spectune.storage import MeasurementStore
from spectune.study import StudyConfig, parse_duration

T0 = dt.datetime(2026, 12, 1, 12, 0, 0)


def _strategy(tmp_path: Path, budget: float | None, spent: list[float]) -> StudyStrategy:
    return StudyStrategy(space=load_space("ngram").resolve("m"), store=MeasurementStore(f"sqlite:///{tmp_path / 's.db'}"),
                         url="", sampler="grid", objectives=1, trials=20, confirm=0, time_budget=budget,
                         on_budget_spent=spent.append)


def _add(study: optuna.Study, strategy: StudyStrategy, params: dict, seconds: float | None, *,
         baseline: bool = False) -> None:
    """A trial of ``params`` that ran ``seconds`` (None: still running, started a minute ago)."""
    start = T0 + dt.timedelta(seconds=10_000 * len(study.trials))
    running = seconds is None
    study.add_trial(optuna.trial.FrozenTrial(
        number=len(study.trials), trial_id=len(study.trials),
        state=optuna.trial.TrialState.RUNNING if running else optuna.trial.TrialState.COMPLETE,
        value=None if running else 10.0, values=None, datetime_start=dt.datetime.now() - dt.timedelta(seconds=60)
        if running else start, datetime_complete=None if running else start + dt.timedelta(seconds=seconds),
        params=params, distributions={k: CategoricalDistribution([v]) for k, v in params.items()}, user_attrs=TrialRecord(
            config="x", role="baseline" if baseline else None).attrs(), system_attrs={}, intermediate_values={}))


def test_no_trial_starts_that_would_end_past_the_budget(tmp_path: Path) -> None:
    spent: list[float] = []
    strategy = _strategy(tmp_path, 400.0, spent)
    study = optuna.create_study(direction="maximize")
    grid = [strategy.space.params_of(s) for s in strategy.space.enumerate() if not s.is_baseline]
    assert isinstance(strategy.decide(study), Run)  # the baseline, whatever the budget
    _add(study, strategy, strategy.space.params_of(strategy.space.enumerate()[0]), 150.0, baseline=True)
    assert isinstance(strategy.decide(study), Run)  # 150 spent, one more of 150 fits in 400
    _add(study, strategy, grid[0], 110.0)
    assert isinstance(strategy.decide(study), Run)  # 260 spent, the median trial (130) ends at 390
    _add(study, strategy, grid[1], 120.0)
    decision = strategy.decide(study)  # 380 spent: another 120 would end at 500
    assert isinstance(decision, Stop) and "time budget" in decision.why
    assert spent == [pytest.approx(380.0)]
    assert StudyRecord.of(study).stopped == "the time budget is spent: 380 s of engine time of 400 s"  # for show
    strategy.decide(study)
    assert len(spent) == 1  # said once
    # resumed with a larger budget, the search goes on and no longer says it ended early
    assert isinstance(_strategy(tmp_path, 900.0, spent).decide(study), Run)
    assert not StudyRecord.of(study).stopped


def test_a_running_trial_counts_at_least_as_long_as_the_median_one(tmp_path: Path) -> None:
    strategy = _strategy(tmp_path, 400.0, [])
    study = optuna.create_study(direction="maximize")
    grid = [strategy.space.params_of(s) for s in strategy.space.enumerate() if not s.is_baseline]
    _add(study, strategy, strategy.space.params_of(strategy.space.enumerate()[0]), 150.0, baseline=True)
    _add(study, strategy, grid[0], None)  # another worker's, 60 s in: counted as 150
    decision = strategy.decide(study)  # 300 spent, another 150 would end at 450: wait for the running one
    assert isinstance(decision, Wait) and "time budget" in decision.why
    assert isinstance(_strategy(tmp_path, None, []).decide(study), Run)  # no budget, no limit


@pytest.mark.parametrize(("text", "seconds"), [("600", 600.0), ("90s", 90.0), ("7m", 420.0), ("1.5h", 5400.0),
                                               ("10 min", 600.0)])
def test_durations_read_as_seconds(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_a_bad_duration_is_one_line_naming_the_key() -> None:
    from spectune.errors import ConfigError

    with pytest.raises(ConfigError, match=r"study: time_budget: '7 minutes' is not a duration"):
        validate(StudyConfig, {"target": "m", "workload": {"source": "humaneval"}, "time_budget": "7 minutes"}, "study")
