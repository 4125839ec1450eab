"""Confirmations: the baseline and the best measured again on fresh engines, and the choice on their means."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from landscape_runs import landscape_values, second_engine
from rich.console import Console

from spectune._tables import render_study
from spectune.config import SpecConfig
from spectune.landscape import Landscape
from spectune.results import BAND_Z, open_study
from spectune.search import study_inputs
from spectune.worker import run_study


@pytest.mark.parametrize("factor", [0.9, 0.3])
def test_confirmed_configurations_are_chosen_on_their_mean(landscape: Landscape, tmp_path: Path, factor: float) -> None:
    values = landscape_values(landscape)
    spent: list[tuple[str, float]] = []
    config = landscape.config(storage=f"sqlite:///{tmp_path / 'c.db'}", study_name="confirm", sampler="grid",
                              trials=len(landscape.points), confirm=1, log_dir=str(tmp_path / "logs"))
    run_study(config, measure_fn=second_engine(landscape, factor, spent))
    measured = [label for label, _ in spent]
    searched = measured[: len(set(measured))]
    top = max((lb for lb in searched if lb != "none"), key=values.__getitem__)
    assert measured[len(searched):] == ["none", top]  # the baseline and the best, once more each
    view = open_study(config.storage, "confirm")
    choice = view.best()
    first, second = values[top], values[top] * factor
    base = values["none"]
    if factor == 0.9:  # a little slower on its second engine: still the choice, on its mean
        assert not choice.is_baseline and choice.row.label == top
        assert choice.engines == pytest.approx([first, second])
        assert choice.value == pytest.approx((first + second) / 2)
        assert choice.speedup == pytest.approx((first + second) / 2 / base)
        assert "mean of 2 engines" in choice.reason
    else:  # far slower: the spread between its engines swallows the gain
        assert choice.is_baseline and top in choice.reason and "mean of 2 engines" in choice.reason
        # the band: the gap paired per prompt, with the engine starts' spread (the top's, pooled
        # with the baseline's two alike engines and the prior's degree of freedom) over the two
        # engines of each on top
        from spectune.noise import PRIOR_DOF, PRIORS

        spread = abs(first - second) / math.sqrt(2) / ((first + second) / 2)  # stdev of two over mean
        pooled = math.sqrt((spread ** 2 + PRIOR_DOF * PRIORS["cpu"].value ** 2) / (2 + PRIOR_DOF))
        assert choice.engine_spread == pytest.approx(pooled) and choice.spread.source == "study"
        engines_part = BAND_Z * choice.engine_spread
        assert choice.band_kind == "paired band" and engines_part < choice.noise_band < engines_part * 1.5
    assert choice.baseline_engines == pytest.approx([base, base])
    console = Console(record=True, width=200, color_system=None)
    render_study(view, console)
    shown = console.export_text()
    again = [r for r in view.rows if r.confirms is not None]
    assert len(again) == 2 and all(f"again on a fresh engine, as #{r.confirms}" in shown for r in again)
    # confirmed once: resuming measures nothing more
    run_study(config, measure_fn=second_engine(landscape, factor, spent))
    assert len(spent) == len(measured)


def test_progress_and_show_rate_configurations_as_export_does_once_confirmed(landscape: Landscape, tmp_path: Path) -> None:
    values = landscape_values(landscape)
    spent: list[tuple[str, float]] = []
    events: list = []
    config = landscape.config(storage=f"sqlite:///{tmp_path / 'c.db'}", study_name="confirm", sampler="grid",
                              trials=len(landscape.points), confirm=2, log_dir=str(tmp_path / "logs"))
    run_study(config, measure_fn=second_engine(landscape, 0.3, spent, baseline_factor=0.8), progress=events.append)
    measured = [label for label, _ in spent]
    searched = measured[: len(set(measured))]
    top, second = sorted((lb for lb in searched if lb != "none"), key=values.__getitem__, reverse=True)[:2]
    assert measured[len(searched):] == ["none", top, second]
    base = values["none"] * 0.9  # the baseline's mean over its two engines
    top_mean = values[top] * 0.65
    assert values[second] > top_mean, "the case at hand: on its one engine, the second beats the top's mean"
    best = [(e.best_label, e.best_speedup) for e in events if e.kind == "trial_end"][len(searched):]
    # once the top is confirmed, the progress line chooses among the confirmed, as show and export
    expected = max([("none", 1.0), (top, top_mean / base)], key=lambda x: x[1])
    assert best[1] == (expected[0], pytest.approx(expected[1]))
    view = open_study(config.storage, "confirm")
    choice = view.best()
    assert choice.baseline_engines == pytest.approx([values["none"], values["none"] * 0.8])
    # each trial's speedup in show and the report: against the baseline's mean, as the choice's
    for r in view.complete():
        assert r.speedup == pytest.approx(r.values[0] / base)
    assert next(r for r in view.rows if r.label == top).speedup == pytest.approx(values[top] / base)
    # predictions move from the baseline's mean too (the search planned on its first engine alone)
    inputs = study_inputs(view)
    assert inputs.baseline.output_throughput == pytest.approx(base)
    assert study_inputs(view, confirmations=False).baseline.output_throughput == pytest.approx(values["none"])
    # the dashboard's attribute keeps the baseline known when the trial ran
    first = next(t for t in view.study.trials if t.user_attrs["config"] == top)
    assert first.user_attrs["speedup"] == pytest.approx(values[top] / values["none"], rel=1e-3)


def test_mean_over_engines_averages_what_predictions_read(landscape: Landscape) -> None:
    from spectune.predict import mean_over_engines

    m = next(p.measurement for p in landscape.points if p.label == "none")
    assert m is not None and m.tpot_ms.median is not None and mean_over_engines([m]) is m
    head = m.level_at(m.concurrency)
    assert head is not None
    swept = m.model_copy(update={"levels": [head, head.model_copy(update={"concurrency": 4})]})
    slow = swept.model_copy(update={
        "output_throughput": m.output_throughput / 2,
        "tpot_ms": m.tpot_ms.model_copy(update={"median": m.tpot_ms.median * 2}),
        "levels": [lv.model_copy(update={"output_throughput": lv.output_throughput / 2}) for lv in swept.levels]})
    mean = mean_over_engines([swept, slow])
    assert mean.output_throughput == pytest.approx(0.75 * m.output_throughput)
    assert mean.tpot_ms.median == pytest.approx(1.5 * m.tpot_ms.median) and mean.tpot_ms.p99 == m.tpot_ms.p99
    assert [lv.output_throughput for lv in mean.levels] == pytest.approx([0.75 * head.output_throughput] * 2)
    assert mean.requests == m.requests and mean.acceptance == m.acceptance  # outputs and counters: the first's


def test_two_objectives_a_confirmed_configuration_stays_on_the_front(landscape: Landscape, tmp_path: Path) -> None:
    values = landscape_values(landscape)
    spent: list[tuple[str, float]] = []
    config = landscape.config(storage=f"sqlite:///{tmp_path / 'p.db'}", study_name="pareto", sampler="grid",
                              objectives=["output_throughput", "tpot_median_ms"], trials=len(landscape.points),
                              confirm=1, log_dir=str(tmp_path / "logs"))
    run_study(config, measure_fn=second_engine(landscape, 1.3, spent))
    top = max(values, key=values.__getitem__)
    assert [label for label, _ in spent][-2:] == ["none", top]
    view = open_study(config.storage, "pareto")
    first = next(r for r in view.rows if r.label == top and r.confirms is None)
    front = {t.number for t in view.study.best_trials}
    assert first.number not in front  # its own faster second engine dominates it
    choice = view.best()
    assert choice.row.number == first.number and not choice.is_baseline
    assert choice.value == pytest.approx(values[top] * 1.15)


def test_a_failed_confirmation_leaves_its_single_engine_in_the_choice_and_says_so(
        landscape: Landscape, tmp_path: Path) -> None:
    from spectune.errors import EngineError

    inner = landscape.measurer()
    seen: set[str] = set()

    def measure(engine: object, spec: SpecConfig, *args: object, **kwargs: object):  # noqa: ANN202
        if spec.label() in seen and not spec.is_baseline:
            raise EngineError("engine exited with code 1 during startup")
        seen.add(spec.label())
        return inner(engine, spec, *args, **kwargs)

    config = landscape.config(storage=f"sqlite:///{tmp_path / 'f.db'}", study_name="confirm", sampler="guided",
                              trials=len(landscape.points), confirm=1, log_dir=str(tmp_path / "logs"))
    run_study(config, measure_fn=measure)
    view = open_study(config.storage, "confirm")
    # every speculative re-measurement fails (rechecks of the search, then confirm's), each
    # configuration's once: a failed engine is data, not retried
    failed = [r for r in view.rows if r.confirms is not None and r.state == "FAIL"]
    assert failed and not any(r.is_baseline for r in failed)
    assert len({r.confirms for r in failed}) == len(failed)
    choice = view.best()  # the baseline, confirmed, does not win by default
    assert not choice.is_baseline and choice.row.number in {r.confirms for r in failed}
    assert choice.engines == [choice.row.values[0]] and len(choice.baseline_engines) == 2
    assert "on one engine: no speculative configuration was confirmed" in choice.reason
    # failed by its engine, that confirmation is data: resuming does not try it again
    again = len([r for r in view.rows if r.confirms is not None])
    run_study(config, measure_fn=measure)
    assert len([r for r in open_study(config.storage, "confirm").rows if r.confirms is not None]) == again


def test_confirmations_interrupted_by_ctrl_c_run_after_the_search_on_resume(landscape: Landscape, tmp_path: Path) -> None:
    inner = landscape.measurer()
    calls: list[str] = []

    def interrupted(engine: object, spec: SpecConfig, *args: object, **kwargs: object):  # noqa: ANN202
        calls.append(spec.label())
        if spec.is_baseline and calls.count("none") == 2:  # Ctrl-C in the baseline's confirmation
            raise KeyboardInterrupt
        return inner(engine, spec, *args, **kwargs)

    config = landscape.config(storage=f"sqlite:///{tmp_path / 'i.db'}", study_name="confirm", sampler="grid",
                              trials=len(landscape.points), confirm=1, log_dir=str(tmp_path / "logs"))
    with pytest.raises(KeyboardInterrupt):
        run_study(config, measure_fn=interrupted)
    searched = calls[:-1]
    view = open_study(config.storage, "confirm")
    # confirmations are chosen one at a time from the storage: nothing is left queued
    assert [t.state.name for t in view.study.trials if "confirms" in t.user_attrs] == ["FAIL"]
    spent: list[tuple[str, float]] = []
    events: list = []
    run_study(config, measure_fn=landscape.measurer(spent), progress=events.append)
    values = landscape_values(landscape)
    top = max((lb for lb in searched if lb != "none"), key=values.__getitem__)
    assert [label for label, _ in spent] == ["none", top]  # no search trial again; both confirmations
    ends = [(e.number, e.total) for e in events if e.kind == "trial_end"]
    assert ends == [(len(searched) + 1, len(searched) + 2), (len(searched) + 2, len(searched) + 2)]
    view = open_study(config.storage, "confirm")
    assert sorted(len(c.values) for c in view.engines() if c.row.label in ("none", top)) == [2, 2]


def test_a_grid_shorter_than_its_space_confirms_its_own_best(landscape: Landscape, tmp_path: Path) -> None:
    spent: list[tuple[str, float]] = []
    config = landscape.config(storage=f"sqlite:///{tmp_path / 'g.db'}", study_name="grid", sampler="grid",
                              trials=4, confirm=1, log_dir=str(tmp_path / "logs"))
    run_study(config, measure_fn=landscape.measurer(spent))
    measured = [label for label, _ in spent]
    values = landscape_values(landscape)
    searched = measured[:4]
    assert len(set(searched)) == 4 and searched[0] == "none"
    top = max(searched[1:], key=values.__getitem__)
    assert measured[4:] == ["none", top]  # no grid candidate beyond the budget ran
    view = open_study(config.storage, "grid")
    assert not [t for t in view.study.trials if t.state.name == "WAITING"]
