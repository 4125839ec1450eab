"""Guided search as a study runs it on the recorded landscape: rechecks, resumes, budgets, and fewer trials than
the grid."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from landscape_runs import landscape_values, second_engine, slow_once
from rich.console import Console

from spectune._tables import render_study
from spectune.config import SpecConfig
from spectune.landscape import Landscape
from spectune.measurement import Measurement
from spectune.records import RECHECK_BEST, RECHECK_CONTENDER, RECHECK_SURPRISE
from spectune.results import BAND_Z, open_study
from spectune.worker import run_study


@pytest.mark.usefixtures("spread_not_learned_first")
def test_a_guided_pick_far_below_its_prediction_is_measured_again_first(landscape: Landscape, tmp_path: Path) -> None:
    values = landscape_values(landscape)
    plain: list[tuple[str, float]] = []
    config = landscape.config(storage=f"sqlite:///{tmp_path / 'p.db'}", study_name="plain", sampler="guided",
                              trials=len(landscape.points), log_dir=str(tmp_path / "logs"))
    run_study(config, measure_fn=landscape.measurer(plain))
    pick = plain[1][0]  # the first guided pick, measured on a normal engine: within its interval
    view = open_study(config.storage, "plain")
    assert pick not in {r.label for r in view.rows if r.recheck_reason == RECHECK_SURPRISE}  # within its interval

    # the same pick on an engine at 0.4x: measured again at once, Ctrl-C there, then resumed
    config = config.model_copy(update={"storage": f"sqlite:///{tmp_path / 's.db'}", "study_name": "slow"})
    spent: list[tuple[str, float]] = []
    with pytest.raises(KeyboardInterrupt):
        run_study(config, measure_fn=slow_once(landscape, pick, spent, interrupt_after=True))
    assert [label for label, _ in spent] == ["none", pick]
    run_study(config, measure_fn=landscape.measurer(spent))
    measured = [label for label, _ in spent]
    assert measured[:3] == ["none", pick, pick]  # again before any other pick
    view = open_study(config.storage, "slow")
    again = [r for r in view.rows if r.recheck_reason == RECHECK_SURPRISE and r.state == "COMPLETE"]
    assert again[0].recheck and again[0].label == pick
    first = next(r for r in view.rows if r.number == again[0].confirms)
    assert first.values == pytest.approx([values[pick] * 0.4]) and first.predicted is not None
    assert first.values[0] < (first.predicted or 0.0)
    assert "outside its predicted interval" in again[0].note
    engines = next(c for c in view.engines() if c.row.label == pick)
    assert engines.values == pytest.approx([values[pick] * 0.4, values[pick]])
    # a re-measurement is not a confirmation: every configuration still competes, on its mean
    choice = view.best()
    top = max((c for c in view.engines() if c.feasible and not c.row.is_baseline), key=lambda c: c.value)
    assert not choice.is_baseline and choice.row.label == top.row.label != pick
    assert any(len(c.values) == 1 for c in view.engines()) and "confirmed" not in choice.reason
    best = max(values.values())
    assert {lb for lb in measured if values[lb] >= 0.98 * best}, "the search still reached the best"
    twice = [r.label for r in view.rows if r.confirms is not None and r.state == "COMPLETE"]
    assert len(set(measured)) == len(measured) - len(twice) and len(set(twice)) == len(twice)  # none thrice


@pytest.mark.usefixtures("spread_not_learned_first")
def test_the_last_guided_pick_is_measured_again_past_the_trial_budget(landscape: Landscape, tmp_path: Path) -> None:
    spent: list[tuple[str, float]] = []
    config = landscape.config(storage=f"sqlite:///{tmp_path / 'b.db'}", study_name="budget", sampler="guided",
                              trials=2, log_dir=str(tmp_path / "logs"))
    run_study(config, measure_fn=landscape.measurer(spent))
    pick = spent[1][0]
    spent.clear()
    config = config.model_copy(update={"storage": f"sqlite:///{tmp_path / 's.db'}"})
    events: list = []
    result = run_study(config, measure_fn=slow_once(landscape, pick, spent), progress=events.append)
    assert [label for label, _ in spent] == ["none", pick, pick]
    assert result.measured == 3
    ends = [(e.number, e.total, e.label) for e in events if e.kind == "trial_end"]
    assert ends == [(1, 2, "none"), (2, 2, pick), (2, 2, pick)]  # the re-measurement counts no new candidate
    # the best so far includes the trial finishing, each configuration at its mean over its engines
    values = landscape_values(landscape)
    slow, mean = values[pick] * 0.4 / values["none"], values[pick] * 0.7 / values["none"]
    assert slow < 1 < mean  # slower than the baseline on its first engine, faster on its mean
    best = [(e.best_label, e.best_speedup) for e in events if e.kind == "trial_end"]
    assert best == [("none", pytest.approx(1.0)), ("none", pytest.approx(1.0)), (pick, pytest.approx(mean))]
    view = open_study(config.storage, "budget")
    assert [r.recheck for r in view.rows] == [False, False, True]


def test_guided_search_stops_by_its_rule_and_then_knows_engines_differ(
        landscape: Landscape, tmp_path: Path) -> None:
    from spectune.results import engine_spread
    from spectune.search._study import STOP_CHANCE

    values = landscape_values(landscape)
    plain: list[tuple[str, float]] = []
    config = landscape.config(storage=f"sqlite:///{tmp_path / 'p.db'}", study_name="plain", sampler="guided",
                              trials=len(landscape.points), log_dir=str(tmp_path / "logs"))
    run_study(config, measure_fn=landscape.measurer(plain))
    first = [label for label, _ in plain]
    # the same search where a second engine runs 0.75x as fast: the engines differ by 20 %
    spent: list[tuple[str, float]] = []
    config = config.model_copy(update={"storage": f"sqlite:///{tmp_path / 's.db'}", "study_name": "spread"})
    run_study(config, measure_fn=second_engine(landscape, 0.75, spent))
    measured = [label for label, _ in spent]
    view = open_study(config.storage, "spread")
    engines = view.engines(confirmations=False)
    twice = [c for c in engines if len(c.values) > 1]
    assert twice and all(len(c.values) == 2 for c in engines if len(c.values) > 1), "measured twice: settled, never thrice"
    assert len(set(measured)) >= len(set(first)) - 1
    guide = view.study.user_attrs["guide"]
    spread = guide["engine_spread"]
    # measured here (the baseline twice before the first pick, the rechecks), the prior as one pair
    from spectune.noise import PRIOR_DOF, PRIORS

    assert view.spread(confirmations=False).source == "study" and measured[:2] == ["none", "none"]
    dof = sum(len(c.values) - 1 for c in engines)
    assert spread == pytest.approx(math.sqrt((dof * engine_spread(engines) ** 2 + PRIOR_DOF * PRIORS["cpu"].value ** 2)
                                             / (dof + PRIOR_DOF)))
    assert all(c.values[1] == pytest.approx(0.75 * c.values[0]) for c in twice if not c.row.is_baseline)
    # the rule it stopped by: nothing left with more than 5 % of beating the pick by the tolerance,
    # the larger of 2 % and the engines' spread
    assert guide["tolerance"] == pytest.approx(max(0.02, spread)) and guide["chance"] <= STOP_CHANCE
    assert all(s["chance"] <= STOP_CHANCE for s in guide["skipped"])
    top = max((c for c in engines if c.feasible), key=lambda c: c.value)
    assert guide["best_measured"] == pytest.approx(top.value)
    assert f"beating {top.row.label} (trial {top.row.number}) by more than {guide['tolerance']:.1%}" in guide["stop_reason"]
    # each configuration measured once is as uncertain as engines differ, and the choice's noise
    # band holds the baseline's engine too
    once = [c for c in engines if len(c.values) == 1]
    assert all(c.noise == pytest.approx(max(c.row.noise or 0.02, spread)) for c in once)
    choice = view.best()
    assert choice.row.label in {lb for lb in measured if values[lb] >= 0.9 * max(values.values())}
    base = next(c for c in engines if c.row.is_baseline)
    chosen = next(c for c in engines if c.row.number == choice.row.number)
    assert len(base.values) == 2 and base.values[0] == base.values[1]  # its two starts, alike here
    # its band: the gap paired per prompt, with both configurations' engine starts on top
    engines_part = BAND_Z * spread * math.sqrt(1 / len(chosen.values) + 1 / len(base.values))
    assert choice.band_kind == "paired band" and engines_part < choice.noise_band < engines_part * 1.5
    console = Console(record=True, width=300, color_system=None)
    render_study(view, console)
    assert f"Engine starts of one configuration differ by {spread:.1%}" in console.export_text()
    # the choice carries it into the provenance and the report
    from spectune.export import export_best
    from spectune.report import write_report

    assert choice.engine_spread == pytest.approx(spread)
    out = export_best(view, tmp_path / "best.yaml")
    recorded = json.loads(out.provenance_path.read_text())["engine_spread"]
    assert recorded["value"] == pytest.approx(spread) and recorded["source"] == "study"
    for fmt in ("md", "html"):
        page = write_report(view, tmp_path / f"report.{fmt}", fmt).read_text()  # type: ignore[arg-type]
        assert f"Engine starts of one configuration differ by {spread:.1%}" in page


@pytest.mark.usefixtures("spread_not_learned_first")
def test_the_best_measured_again_before_the_stop_is_measured_once_after_ctrl_c(landscape: Landscape, tmp_path: Path) -> None:
    import optuna

    spent: list[tuple[str, float]] = []
    inner = landscape.measurer(spent)
    calls: list[str] = []

    def interrupted(engine: object, spec: SpecConfig, *args: object, **kwargs: object) -> Measurement:
        calls.append(spec.label())
        if calls.count(spec.label()) == 2:  # the best, measured again before the search stops
            raise KeyboardInterrupt
        return inner(engine, spec, *args, **kwargs)

    config = landscape.config(storage=f"sqlite:///{tmp_path / 'c.db'}", study_name="stop", sampler="guided",
                              trials=len(landscape.points), log_dir=str(tmp_path / "logs"))
    reference: list[tuple[str, float]] = []  # the same study, not interrupted (guided search is deterministic)
    run_study(config.model_copy(update={"storage": f"sqlite:///{tmp_path / 'ref.db'}"}),
              measure_fn=landscape.measurer(reference))
    with pytest.raises(KeyboardInterrupt):
        run_study(config, measure_fn=interrupted)
    top = calls[-1]
    run_study(config, measure_fn=inner)
    measured = [label for label, _ in spent]
    # once more on resume, nothing else again: the course of the study that was not interrupted
    assert measured.count(top) == 2 and measured == [label for label, _ in reference]
    view = open_study(config.storage, "stop")
    again = [(r.state, r.fail_reason, r.recheck_reason) for r in view.rows if r.confirms is not None]
    # the first configuration measured again, interrupted and measured again on resume: once more, for the same reason
    assert [(state, why) for state, why, _ in again[:2]] == [("FAIL", "interrupted"), ("COMPLETE", None)]
    assert again[0][2] == again[1][2] and again[0][2] in {RECHECK_BEST, RECHECK_SURPRISE, RECHECK_CONTENDER}
    assert all(state == "COMPLETE" for state, _, _ in again[2:])
    # a study of an earlier spectune stored a surprise's re-measurement as recheck=True
    old = optuna.create_study(study_name="old", storage=config.storage)
    spec = {"method": "ngram", "num_speculative_tokens": 2}
    for attrs in ({"config": "ngram k=2", "spec": spec}, {"config": "ngram k=2", "spec": spec, "confirms": 0, "recheck": True}):
        old.add_trial(optuna.trial.create_trial(value=100.0, user_attrs=attrs))
    row = open_study(config.storage, "old").rows[1]
    assert row.recheck and row.recheck_reason == RECHECK_SURPRISE  # read as what it meant
    assert row.note == "again on a fresh engine, as #0, outside its predicted interval"


@pytest.mark.usefixtures("spread_not_learned_first")
def test_a_guided_pick_interrupted_by_ctrl_c_keeps_its_prediction_on_resume(landscape: Landscape, tmp_path: Path) -> None:
    spent: list[tuple[str, float]] = []
    config = landscape.config(storage=f"sqlite:///{tmp_path / 'a.db'}", study_name="retry", sampler="guided",
                              trials=2, log_dir=str(tmp_path / "logs"))
    run_study(config, measure_fn=landscape.measurer(spent))
    pick = spent[1][0]  # guided search is deterministic: its first pick
    config = config.model_copy(update={"storage": f"sqlite:///{tmp_path / 'r.db'}"})
    inner = landscape.measurer()

    def interrupted(engine: object, spec: SpecConfig, *args: object, **kwargs: object) -> Measurement:
        if spec.label() == pick:
            raise KeyboardInterrupt
        return inner(engine, spec, *args, **kwargs)

    with pytest.raises(KeyboardInterrupt):
        run_study(config, measure_fn=interrupted)
    spent.clear()
    run_study(config, measure_fn=slow_once(landscape, pick, spent))
    # retried with its prediction, measured outside its interval: measured once more
    assert [label for label, _ in spent] == [pick, pick]
    rows = [r for r in open_study(config.storage, "retry").rows if r.label == pick]
    assert [(r.state, r.recheck) for r in rows] == [("FAIL", False), ("COMPLETE", False), ("COMPLETE", True)]
    assert rows[1].predicted == rows[0].predicted is not None


def test_guided_search_finds_the_best_of_the_landscape_in_fewer_trials(landscape: Landscape, tmp_path: Path) -> None:
    values = landscape_values(landscape)
    best = max(values.values())
    good = {label for label, v in values.items() if v >= 0.98 * best}
    spent: list[tuple[str, float]] = []
    config = landscape.config(storage=f"sqlite:///{tmp_path / 'g.db'}", study_name="guided",
                              sampler="guided", trials=len(landscape.points), log_dir=str(tmp_path / "logs"))
    result = run_study(config, measure_fn=landscape.measurer(spent))
    measured = [label for label, _ in spent]
    assert measured[:2] == ["none", "none"]  # no engine spread known: the baseline twice first
    assert len(set(measured)) < len(landscape.points), "the guided search stopped before measuring everything"
    assert good & set(measured), f"no config within 2% of the best ({sorted(good)}) among {measured}"
    first_good = next(i for i, label in enumerate(measured) if label in good)
    assert first_good + 1 < len(landscape.points) // 2
    view = open_study(config.storage, "guided")
    assert view.best().row.label in good
    again = [r for r in view.rows if r.confirms is not None]
    assert again and len({r.label for r in again}) == len(again)  # each measured again once at most
    # one recorded start: every engine gives the same answer, and the figure falls from the prior
    # by the pairs measured (the prior counted as one)
    from spectune.noise import PRIOR_DOF, PRIORS
    from spectune.report import render_markdown

    pairs = sum(len(c.values) - 1 for c in view.engines(confirmations=False))
    expected = PRIORS["cpu"].value * math.sqrt(PRIOR_DOF / (pairs + PRIOR_DOF))
    assert view.study.user_attrs["guide"]["engine_spread"] == pytest.approx(expected)
    assert view.best().engine_spread == pytest.approx(expected)
    assert f"differ by {expected:.1%} here (this study's" in render_markdown(view)
    guided = [t for t in view.study.trials if "guide_reason" in t.user_attrs]
    assert len(guided) == len(measured) - 1 - len(again)  # every trial after the baseline a guided pick, or again
    for t in guided:  # the prediction beside the measurement
        assert t.user_attrs["predicted_low"] <= t.user_attrs["predicted_output_throughput"] <= t.user_attrs["predicted_high"]
        assert t.values is not None and t.values[0] == pytest.approx(values[t.user_attrs["config"]])
        assert t.user_attrs["prediction_source"] in {"replay", "truncation", "extrapolation", "learned", "prior"}
    guide = view.study.user_attrs["guide"]
    skipped = {s["config"] for s in guide["skipped"]}
    assert skipped and not skipped & set(measured)
    assert all(s["chance"] <= 0.05 for s in guide["skipped"]) and guide["chance"] <= 0.05
    assert guide["stop_reason"].startswith(f"no candidate left has more than a 5% chance of beating {view.best().row.label}")
    console = Console(record=True, width=300, color_system=None)
    render_study(view, console)
    assert f"Guided search stopped: {guide['stop_reason']}." in console.export_text()
    assert f"Guided search stopped: {guide['stop_reason']}." in render_markdown(view)
    assert len(skipped) + len(set(measured)) == len(landscape.points)
    assert result.measured == len(measured)


def test_a_sampler_suggesting_a_measured_candidate_reuses_it(landscape: Landscape, tmp_path: Path) -> None:
    spent: list[tuple[str, float]] = []
    config = landscape.config(storage=f"sqlite:///{tmp_path / 'r.db'}", study_name="random",
                              sampler="random", seed=3, trials=12, log_dir=str(tmp_path / "logs"))
    result = run_study(config, measure_fn=landscape.measurer(spent))
    view = open_study(config.storage, "random")
    trials = view.study.trials
    dups = [t for t in trials if "duplicate_of" in t.user_attrs]
    assert dups, "seed 3 draws some candidate twice in 12 trials"
    assert result.reused == len(dups) and result.measured == len(spent) == 12  # reuse is free and not counted
    for t in dups:
        first = trials[t.user_attrs["duplicate_of"]]
        assert first.user_attrs["spec_key"] == t.user_attrs["spec_key"] and "duplicate_of" not in first.user_attrs
        assert t.values == first.values and t.user_attrs["config"] == first.user_attrs["config"]
    assert len({t.user_attrs["spec_key"] for t in trials}) == len(spent)  # no candidate measured twice


@pytest.mark.usefixtures("spread_not_learned_first")
def test_a_gain_within_the_band_has_the_baseline_measured_again_once(landscape: Landscape, tmp_path: Path) -> None:
    from landscape_runs import scaled

    from spectune.records import RECHECK_BASELINE
    from spectune.search._rechecks import SETTLE_STARTS

    values = landscape_values(landscape)
    best = max(values.values())
    inner = landscape.measurer()
    calls: list[str] = []

    def measure(engine: object, spec: SpecConfig, *args: object, **kwargs: object) -> Measurement:
        calls.append(spec.label())
        m = inner(engine, spec, *args, **kwargs)
        # the baseline's first engine runs as fast as the best configuration, less 10 %
        return scaled(m, 0.9 * best / values["none"]) if spec.is_baseline and calls.count("none") == 1 else m

    config = landscape.config(storage=f"sqlite:///{tmp_path / 'b.db'}", study_name="base", sampler="guided",
                              trials=len(landscape.points), log_dir=str(tmp_path / "logs"))
    run_study(config, measure_fn=measure)
    view = open_study(config.storage, "base")
    again = [r for r in view.rows if r.recheck_reason == RECHECK_BASELINE]
    # the baseline again, and the best too while the gain stays within the band, up to 3 engines each
    assert 1 <= len(again) <= SETTLE_STARTS - 1 and calls.count("none") == 1 + len(again)
    assert all(r.is_baseline and r.confirms == view.baseline().number for r in again)
    assert calls.index("none", 1) > 1  # after the search, when it would have stopped
    choice = view.best()
    assert choice.baseline_engines[:2] == pytest.approx([0.9 * best, values["none"]])
    assert not choice.within_band or len(choice.baseline_engines) == SETTLE_STARTS
    # run again: nothing more is measured
    done = len(calls)
    run_study(config, measure_fn=measure)
    assert len(calls) == done
