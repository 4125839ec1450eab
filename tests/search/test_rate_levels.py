"""A load mix of request rates: each trial's engine takes every rate (Poisson arrivals, at most
``concurrency`` in flight), the objective weighs them, predictions and the schedule place each
rate at the batch its baseline ran there (the mean in flight while any request was).

Without an engine: the workload's checks, the mean in flight, and a grid and a guided study
replaying ``benchmarks/landscapes/tiny_sweep.json`` with each concurrency level read as a rate
(half of it per second) whose baseline ran that many in flight. With a real engine (tiny
models): one trial measures two rates, each on its own prompts and counters.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest
from conftest import REPO, tiny_engine_args
from typer.testing import CliRunner

from spectune.cli import app, main
from spectune.config import Prompt, SpecConfig, WorkloadSpec
from spectune.errors import ConfigError
from spectune.landscape import Landscape
from spectune.load import LoadResult, RequestRecord, arrival_offsets
from spectune.measurement import SLO, Measurement, Objective
from spectune.predict._schedule import level_costs
from spectune.results import open_study
from spectune.search import study_inputs
from spectune.trial import mean_in_flight, plan_windows
from spectune.worker import run_study

SWEEP = REPO / "benchmarks" / "landscapes" / "tiny_sweep.json"
CAP = 8
"""The most requests in flight at every rate."""


def rate_of(c: int) -> float:
    """The rate standing for the recorded concurrency level ``c``."""
    return c / 2


def _as_rates(m: Measurement) -> Measurement:
    """A recorded sweep of concurrency levels as a sweep of rates whose engine ran as many in flight."""
    levels = [lv.model_copy(update={"request_rate": rate_of(lv.concurrency), "mean_in_flight": float(lv.concurrency),
                                    "concurrency": CAP}) for lv in m.levels]
    workload = m.workload.model_copy(update={
        "concurrency_levels": None, "concurrency": CAP, "request_rate": rate_of(m.concurrency),
        "request_rate_levels": [rate_of(c) for c in m.workload.levels]})
    return m.model_copy(update={"levels": levels, "workload": workload, "concurrency": CAP,
                                "mean_in_flight": float(m.concurrency)})


@pytest.fixture(scope="module")
def rates(tiny_models) -> Landscape:  # noqa: ANN001
    land = Landscape.load(SWEEP).rebase(str(tiny_models.target), str(tiny_models.draft))
    points = [p.model_copy(update={"measurement": _as_rates(p.measurement)}) if p.measurement else p
              for p in land.points]
    wl = dict(land.study_config["workload"])
    levels = wl.pop("concurrency_levels")
    workload = {**wl, "concurrency": CAP, "request_rate": rate_of(levels[0]),
                "request_rate_levels": [rate_of(c) for c in levels]}
    return land.model_copy(update={"points": points, "study_config": {**land.study_config, "workload": workload,
                                                                       "objectives": ["tpot_median_ms"]}})


def test_the_workload_takes_a_mix_of_rates_and_refuses_bad_ones_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    wl = WorkloadSpec(source="x.jsonl", request_rate_levels=[0.5, 2, 8], level_weights=[2, 1, 1], concurrency=16)
    assert wl.request_rate == 0.5 and wl.headline == 0.5 and wl.is_mix and wl.by_rate
    assert wl.levels == [0.5, 2.0, 8.0] and wl.weights() == {0.5: 0.5, 2.0: 0.25, 8.0: 0.25}
    at = wl.at_level(8.0)
    assert at.request_rate == 8.0 and at.concurrency == 16 and wl.level_name(8.0) == "8 requests/s"
    closed = WorkloadSpec(source="x.jsonl", concurrency_levels=[1, 4])
    assert closed.headline == 1 and not closed.by_rate and closed.at_level(4).concurrency == 4
    assert not WorkloadSpec(source="x.jsonl", request_rate_levels=[2]).is_mix  # one rate: no mix
    for bad, why in (({"request_rate_levels": [1, 1]}, "distinct"),
                     ({"request_rate_levels": [1, -2]}, "> 0"),
                     ({"request_rate_levels": [1, 2], "request_rate": 4}, "headline level must be one of them"),
                     ({"request_rate_levels": [1, 2], "concurrency_levels": [1, 4]}, "not both"),
                     ({"request_rate_levels": [1, 2], "level_weights": [1]}, "one weight per level")):
        with pytest.raises(ValueError, match=why):
            WorkloadSpec(source="x.jsonl", concurrency=8, **bad)
    with pytest.raises(ValueError, match="at concurrency 1 every rate runs one request at a time"):
        WorkloadSpec(source="x.jsonl", request_rate_levels=[1, 2])  # the default cap: no batch to tell rates apart
    for argv in (["--request-rate", "1,fast"], ["--request-rate", "1,1"], ["--request-rate", "1,2", "--concurrency", "1,4"]):
        with pytest.raises(SystemExit) as e:
            main(["optimize", "--target", "t", "--workload", "humaneval", *argv])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and len(err.splitlines()) == 1, err


def test_the_command_line_load_replaces_the_files(tiny_models, tmp_path: Path) -> None:  # noqa: ANN001
    """--request-rate and --concurrency say the whole load: a file's other way of saying it goes."""
    import yaml

    from spectune.records import StudyRecord

    (tmp_path / "space.yaml").write_text("methods:\n  none: {}\n")
    (tmp_path / "study.yaml").write_text(yaml.safe_dump({
        "target": str(tiny_models.target), "space": str(tmp_path / "space.yaml"),
        "workload": {"source": "humaneval", "num_prompts": 8, "concurrency_levels": [1, 4]}}))
    for n, argv, expected in (
            (0, ["--request-rate", "1,2", "--concurrency", "8"],
             {"concurrency": 8, "request_rate": 1.0, "request_rate_levels": [1.0, 2.0], "concurrency_levels": None}),
            (1, ["--concurrency", "4"], {"concurrency": 4, "concurrency_levels": None, "request_rate": None}),
            (2, ["--request-rate", "2"], {"concurrency": 1, "request_rate": 2.0, "concurrency_levels": None})):
        with pytest.raises(SystemExit) as e:
            main(["optimize", "--config", str(tmp_path / "study.yaml"), "--storage", f"sqlite:///{tmp_path / 's.db'}",
                  "--study", f"s{n}", "--create-only", *argv])
        assert e.value.code == 0
        stored = StudyRecord.of(open_study(f"sqlite:///{tmp_path / 's.db'}", f"s{n}").study).spectune_config
        assert {k: stored["workload"].get(k) for k in expected} == expected


def test_each_rate_gets_prompts_of_its_own_and_the_mean_in_flight_leaves_idle_time_out() -> None:
    prompts = [Prompt(id=f"p{i}", text=str(i)) for i in range(9)]
    windows, sweep = plan_windows(prompts, WorkloadSpec(source="x.jsonl", request_rate_levels=[1, 4, 16], concurrency=8),
                                   repeats=1)
    assert list(sweep) == [4.0, 16.0] and [len(w) for w in [*windows, *sweep.values()]] == [3, 3, 3]
    # a rate needs no more prompts than it has: a closed level of 16 would refuse three
    with pytest.raises(ConfigError, match="level 16 needs at least 16"):
        plan_windows(prompts, WorkloadSpec(source="x.jsonl", concurrency_levels=[1, 4, 16]), repeats=1)

    def record(start: float, e2el: float, ok: bool = True) -> RequestRecord:
        return RequestRecord(prompt_id="p", ok=ok, start=start, e2el=e2el)

    # two overlapping (0..2, 1..3), idle, one alone (10..11), a failed one not counted
    result = LoadResult([record(0, 2), record(1, 2), record(10, 1), record(4, 3, ok=False)], duration=11.0,
                        concurrency=CAP)
    assert mean_in_flight([result]) == pytest.approx(5 / 4)
    assert mean_in_flight([LoadResult([], duration=1.0, concurrency=1)]) is None


def test_a_grid_study_over_rates_weighs_each_rate_and_shows_it_by_name(rates: Landscape, tmp_path: Path) -> None:
    cfg = rates.config(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="rates", sampler="grid",
                       trials=len(rates.points), log_dir=str(tmp_path / "logs"))
    run_study(cfg, measure_fn=rates.measurer())
    view = open_study(cfg.storage, "rates")
    by_label = {p.label: p.measurement for p in rates.points}
    objective = Objective.TPOT_MEDIAN
    for row in view.complete():
        levels = objective.of_levels(by_label[row.label])
        assert levels is not None and sorted(levels) == [0.5, 1.0, 2.0, 4.0]
        assert row.values == [pytest.approx(math.exp(sum(math.log(v) / 4 for v in levels.values())))]
    rows = view.levels(view.best())
    assert rows is not None and [r.name for r in rows] == [f"{rate_of(c):g} requests/s" for c in (1, 2, 4, 8)]
    out = CliRunner().invoke(app, ["show", "--storage", cfg.storage, "--study", "rates"], env={"COLUMNS": "160"})
    assert out.exit_code == 0, out.output
    assert "0.5 requests/s" in out.output and "4 requests/s" in out.output
    # a latency limit holds at every rate: met at the quiet one, broken at the busiest
    base = by_label["none"]
    tpots = {lv.key: lv.tpot_median_ms for lv in base.levels}
    limit = (tpots[0.5] + tpots[4.0]) / 2
    assert tpots[0.5] < limit < tpots[4.0]
    assert SLO(tpot_median_ms=limit).violations(base)["tpot_median_ms"] == pytest.approx(tpots[4.0] - limit)


def test_a_mix_of_rates_on_throughput_is_warned_of(rates: Landscape, tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    from spectune.study import plan_study

    for objectives, warned in ((["tpot_median_ms"], False), (["output_throughput"], True)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="spectune"):
            plan_study(rates.config(storage=f"sqlite:///{tmp_path / 's.db'}", objectives=objectives))
        assert any("output throughput is the rate's" in r.getMessage() for r in caplog.records) is warned


def test_predictions_and_the_schedule_place_each_rate_at_its_baseline_batch(rates: Landscape, tmp_path: Path) -> None:
    """The sweep model over rates is the model over the batches their baseline ran: the same as
    over the recorded concurrency levels, each rate at its batch."""
    cfg = rates.config(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="g", sampler="guided", trials=3,
                       log_dir=str(tmp_path / "logs"))
    run_study(cfg, measure_fn=rates.measurer())
    inputs = study_inputs(open_study(cfg.storage, "g"))
    model = inputs.concurrency_model()
    assert model is not None and model.batches == {0.5: 1.0, 1.0: 2.0, 2.0: 4.0, 4.0: 8.0}
    assert model.step.levels == (1.0, 2.0, 4.0, 8.0) and model.study_concurrency == 1.0
    closed = Landscape.load(SWEEP)
    by_label = {p.label: p.measurement for p in closed.points}
    from spectune.predict import fit_concurrency

    same = fit_concurrency(by_label["none"], [by_label[m.spec.label()] for m in inputs.measured])
    assert same is not None and (model.step.a, model.step.slope) == pytest.approx((same.step.a, same.step.slope))
    assert model.rho == same.rho
    # three engines of the baseline: their mean keeps each rate as its key (an averaged 0.1 would not be 0.1)
    from spectune.predict._measured import mean_over_engines

    base = inputs.baseline
    odd = base.model_copy(update={"levels": [lv.model_copy(update={"request_rate": 0.1 if lv.key == 4.0 else lv.key})
                                             for lv in base.levels],
                                  "workload": base.workload.model_copy(update={"request_rate_levels": [0.5, 1.0, 2.0, 0.1]})})
    assert [lv.key for lv in mean_over_engines([odd, odd, odd]).levels] == [lv.key for lv in odd.levels]

    predicted = inputs.predict()
    assert predicted, "candidates left to predict"
    base = Objective.TPOT_MEDIAN.of_levels(inputs.baseline)
    assert base is not None
    for p in predicted[:3]:  # the mix's value: each rate's ratio to the baseline at its batch, weighted
        expected = math.exp(sum(0.25 * math.log(base[k] * model.predict(p, b).tpot_ms.value / model.t0(b))
                                for k, b in model.batches.items()))
        assert p.value.value == pytest.approx(expected, rel=1e-6)
    moved = inputs.at_levels(inputs.measured_predictions()[:1] + predicted[:1], model)
    assert [lp.name for lp in moved[0]] == ["0.5/s", "1/s", "2/s", "4/s"]
    assert {lp.scale_source for lp in moved[0]} == {"measured"} and "measured" not in {lp.scale_source for lp in moved[1]}
    shown = CliRunner().invoke(app, ["predict", "--storage", cfg.storage, "--study", "g"], env={"COLUMNS": "250"})
    assert shown.exit_code == 0, shown.output
    assert "each level of the load mix" in shown.output and "0.5/s tok/s" in shown.output

    # the schedule's levels are the baseline's batches, not the rates
    ngram = [m for p in rates.points if (m := p.measurement) is not None and m.spec.method.value == "ngram"]
    costs = level_costs(inputs.baseline, ngram)
    assert [lc.batch for lc in costs] == [1.0, 2.0, 4.0, 8.0]


# -- a real engine --------------------------------------------------------------------------------


@pytest.mark.engine
def test_one_engine_measures_each_rate_on_its_own_prompts_and_counters(tiny_models, tmp_path: Path) -> None:  # noqa: ANN001
    from spectune.trial import measure
    from spectune.workloads import load_prompts

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(f'{{"id": "f{i}", "prompt": "def f{i}(x):\\n    y{i} = x + {i}\\n    return y{i}\\n\\n'
                               f'def g{i}(x):\\n    y{i} = x"}}\n' for i in range(12)))
    wl = WorkloadSpec(source=str(prompts), request_rate_levels=[1.0, 16.0], concurrency=4, num_prompts=12,
                      sampling={"max_tokens": 24}, warmup_requests=1)
    spec = SpecConfig.model_validate({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
                                      "prompt_lookup_min": 1})
    m = measure(tiny_engine_args(tiny_models.target), spec, wl, load_prompts(wl), log_dir=tmp_path)
    assert [lv.key for lv in m.levels] == [1.0, 16.0] and [lv.num_requests for lv in m.levels] == [6, 6]
    assert all(lv.concurrency == 4 and lv.num_failed == 0 for lv in m.levels)
    slow, fast = m.levels
    assert slow.output_throughput == m.output_throughput  # the headline is the first rate
    # each window lasts at least until its last arrival: the rate was the level's own
    assert slow.duration_seconds >= arrival_offsets(6, 1.0, wl.seed)[-1]
    assert fast.duration_seconds < slow.duration_seconds
    assert all(lv.mean_in_flight is not None and 1.0 <= lv.mean_in_flight <= 4.0 for lv in m.levels)
    assert all(lv.acceptance is not None and lv.acceptance.num_drafts > 0 for lv in m.levels)  # counters per level
    assert slow.acceptance == m.acceptance  # the headline's counters are the first rate's
    # the level's own requests, for the band that pairs its prompts: without texts, and none of the headline's
    assert len(fast.requests) == 6 and all(r.ok and r.text == "" and r.token_ids is None for r in fast.requests)
    assert not {r.prompt_id for r in fast.requests} & {r.prompt_id for r in m.requests}
    values = Objective.TPOT_MEDIAN.of_levels(m)
    assert values is not None and sorted(values) == [1.0, 16.0]
    assert Measurement.model_validate_json(m.model_dump_json()).level_at(16.0) == fast  # stored and read back
