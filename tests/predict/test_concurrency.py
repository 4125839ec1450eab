"""Concurrency sweeps: one engine measures several levels; predictions move to any level.

Without an engine: the step-time fit and the scaling recover a known law on recorded trials.
With real engines (tiny models): a study whose workload sweeps two levels stores both, and
`spectune predict --concurrency` and `spectune export --schedule` use them.
"""

from __future__ import annotations

import math

import pytest
from conftest import REPO

from spectune.config import Method, Prompt, WorkloadSpec
from spectune.errors import ConfigError
from spectune.landscape import Landscape
from spectune.measurement import LatencyStats, LevelStats, Measurement
from spectune.predict import (
    Estimate,
    Prediction,
    fit_concurrency,
    fit_step_time,
    measured_profile,
)
from spectune.trial import plan_windows

A, SLOPE = 2.0, 0.5  # ms: the law t0(b) = A + SLOPE b the synthetic sweeps follow
RHO = 10 ** -0.25  # a proposer's own work relative to verification (a point of the fitted grid)
X1 = 0.3  # the speculative part of a step at concurrency 1
EFFICIENCY = 0.9  # the baseline's throughput over b / t0(b)


def t0(b: int) -> float:
    return A + SLOPE * b


def share(b: int) -> float:
    return SLOPE * b / t0(b)


def g(b: int) -> float:
    return (RHO + share(b)) / (RHO + share(1))


def _with_levels(m: Measurement, tpot: dict[int, float], throughput: dict[int, float]) -> Measurement:
    levels = [LevelStats(concurrency=b, num_requests=8, num_failed=0, duration_seconds=1.0,
                         output_throughput=throughput[b], tpot_median_ms=tpot[b], ttft_median_ms=10.0,
                         acceptance=m.acceptance) for b in sorted(tpot)]
    stats = LatencyStats(count=8, mean=tpot[1], median=tpot[1], p90=tpot[1], p99=tpot[1])
    return m.model_copy(update={"levels": levels, "tpot_ms": stats, "output_throughput": throughput[1]})


@pytest.fixture(scope="module")
def sweep() -> tuple[Measurement, Measurement, float]:
    """The recorded tiny landscape's baseline and n-gram k=3, given sweeps at 1 and 8 that follow
    the law; and the n-gram trial's tokens per step."""
    land = Landscape.load(REPO / "benchmarks" / "landscapes" / "tiny_one_start.json")
    by_label = {p.label: p.measurement for p in land.points}
    base, ngram = by_label["none"], by_label["ngram k=3 lookup=1..3"]
    assert base is not None and ngram is not None and base.concurrency == 1
    thr0 = {b: EFFICIENCY * 1000.0 * b / t0(b) for b in (1, 8)}
    base = _with_levels(base, {b: t0(b) for b in (1, 8)}, thr0)
    profile = measured_profile(ngram)
    assert profile is not None
    e = profile.tokens_per_step
    tpot = {b: t0(b) * (1 + X1 * g(b)) / e for b in (1, 8)}
    ngram = _with_levels(ngram, tpot, {b: thr0[b] * t0(b) / tpot[b] for b in (1, 8)})
    return base, ngram, e


def test_step_time_fit_recovers_the_line_and_refuses_one_level() -> None:
    fit = fit_step_time([(1, t0(1)), (4, t0(4)), (16, t0(16))])
    assert fit.a == pytest.approx(A) and fit.slope == pytest.approx(SLOPE) and fit.levels == (1, 4, 16)
    assert fit.share(4) == pytest.approx(share(4))
    flat = fit_step_time([(1, 5.0), (8, 4.0)])  # faster with more in flight: noise, held flat
    assert flat.slope == 0.0 and flat.at(100) == pytest.approx(4.5)
    with pytest.raises(ValueError, match="two concurrency levels"):
        fit_step_time([(4, 3.0), (4, 3.1)])


def test_the_sweep_model_recovers_the_law_and_moves_predictions(sweep: tuple[Measurement, Measurement, float]) -> None:
    base, ngram, e = sweep
    model = fit_concurrency(base, [ngram])
    assert model is not None
    assert model.step.a == pytest.approx(A) and model.step.slope == pytest.approx(SLOPE)
    rho, n = model.rho[Method.NGRAM]
    assert rho == pytest.approx(RHO) and n == 1
    assert model.scale(Method.SUFFIX, 8) == (pytest.approx(g(8)), "fit-pooled")  # suffix not swept: every method's rho
    bare = fit_concurrency(base, [])  # no speculative trial swept: rho = 0, the roofline
    assert bare is not None and bare.scale(Method.SUFFIX, 8) == (pytest.approx(share(8) / share(1)), "roofline")
    # a candidate of the same proposer, predicted at concurrency 1: moved to other levels by the law
    tpot1 = t0(1) * (1 + X1) / e
    thr1 = base.output_throughput * t0(1) / tpot1
    p = Prediction(label="ngram k=3", spec=ngram.spec, source="replay", acceptance_rate=0.5,
                   mean_acceptance_length=e, tokens_per_step=Estimate(e, e, e), tpot_ms=Estimate(tpot1, tpot1, tpot1),
                   output_throughput=Estimate(thr1, thr1, thr1), objective="output_throughput",
                   value=Estimate(thr1, thr1, thr1), cost_source="fit")
    same = model.predict(p, 1)
    assert same.tpot_ms.value == pytest.approx(tpot1) and same.output_throughput.value == pytest.approx(thr1)
    for b in (2, 4, 8, 32):
        at = model.predict(p, b)
        expected_tpot = t0(b) * (1 + X1 * g(b)) / e
        assert at.tpot_ms.value == pytest.approx(expected_tpot)
        assert at.output_throughput.value == pytest.approx(EFFICIENCY * 1000.0 * b / t0(b) * t0(b) / expected_tpot)
        assert at.scale_source == "fit"
    assert model.predict(p, 8).output_throughput.value == pytest.approx(ngram.levels[1].output_throughput)


def test_a_proposer_measured_faster_than_its_tokens_explain_is_never_predicted_negative(
        sweep: tuple[Measurement, Measurement, float]) -> None:
    base, ngram, e = sweep
    model = fit_concurrency(base, [ngram])
    assert model is not None
    t = 0.8 * t0(1) / e  # a speculative part of -0.2: noise, not a step cheaper than the target's
    thr = base.output_throughput * t0(1) / t
    p = Prediction(label="lucky", spec=ngram.spec, source="measured", acceptance_rate=0.5, mean_acceptance_length=e,
                   tokens_per_step=Estimate(e, e, e), tpot_ms=Estimate(t, t, t), output_throughput=Estimate(thr, thr, thr),
                   objective="output_throughput", value=Estimate(thr, thr, thr), cost_source="measured")
    for b in (1, 2, 8, 64, 256):  # at 1, the study's concurrency: the prediction itself
        at = model.predict(p, b)
        assert at.tpot_ms.value == pytest.approx(t0(b) * 0.8 / e)  # the noise kept, not scaled up with the batch
        assert at.tpot_ms.value > 0 and at.output_throughput.value > 0


def test_a_study_measured_at_one_level_cannot_be_moved(sweep: tuple[Measurement, Measurement, float]) -> None:
    from spectune.predict import StudyInputs

    base, ngram, _ = sweep
    plain = base.model_copy(update={"levels": []})
    assert fit_concurrency(plain, [ngram]) is None
    inputs = StudyInputs([], plain, [ngram], "output_throughput", True, {}, None)
    with pytest.raises(ConfigError, match="measured at concurrency 1 only.*concurrency_levels"):
        inputs.at_concurrency([], [4])


def test_sweep_windows_are_disjoint_and_large_enough() -> None:
    prompts = [Prompt(id=f"p{i}", text=str(i)) for i in range(12)]
    workload = WorkloadSpec(source="x.jsonl", concurrency_levels=[1, 4])
    windows, levels = plan_windows(prompts, workload, repeats=2)
    assert [len(w) for w in windows] == [4, 4] and list(levels) == [4] and len(levels[4]) == 4
    ids = [p.id for w in [*windows, *levels.values()] for p in w]
    assert sorted(ids) == sorted(p.id for p in prompts)  # every prompt once
    assert plan_windows(prompts, WorkloadSpec(source="x.jsonl", concurrency=4), repeats=2)[1] == {}
    with pytest.raises(ConfigError, match="level 8 needs at least 8 prompts.*at least 24"):
        plan_windows(prompts, WorkloadSpec(source="x.jsonl", concurrency_levels=[1, 8]), repeats=2)
    with pytest.raises(ConfigError, match="3 prompts cannot fill 2 window.*2 other load level"):
        plan_windows(prompts[:3], WorkloadSpec(source="x.jsonl", concurrency_levels=[1, 2, 3]), repeats=2)


# -- real engines ---------------------------------------------------------------------------------


@pytest.mark.engine
def test_a_sweep_measures_each_level_on_one_engine_and_predictions_move(swept_study) -> None:  # noqa: ANN001
    from typer.testing import CliRunner

    from spectune.cli import app
    from spectune.results import open_study
    from spectune.search import study_inputs
    from spectune.study import create_study

    cfg, tmp = swept_study
    view = open_study(cfg.storage, "sweep")
    rows = view.complete()
    assert [r.label for r in rows] == ["none", "ngram k=3 lookup=1..3"]
    base, ngram = (view.store.measurement(r.trial_id) for r in rows)
    assert base is not None and ngram is not None
    for m in (base, ngram):
        assert [lv.concurrency for lv in m.levels] == [1, 4]
        assert [lv.num_requests for lv in m.levels] == [8, 8] and m.num_requests == 8  # disjoint halves
        assert m.levels[0].output_throughput == m.output_throughput  # the headline level is level 1
        assert all(lv.num_failed == 0 and lv.tpot_median_ms for lv in m.levels)
    assert all(lv.duration_seconds > 0 and lv.output_throughput > 0 for lv in base.levels)  # each its own window
    assert all(lv.acceptance is not None and lv.acceptance.num_drafts > 0 for lv in ngram.levels)
    assert base.levels[0].acceptance is None

    # the study resumed with a wider space (the file it was run with): n-gram k=2 and k=4 are left to predict
    (tmp / "space.yaml").write_text("methods:\n  none: {}\n  ngram:\n    num_speculative_tokens: [2, 3, 4]\n"
                                    "    prompt_lookup_max: 3\n    prompt_lookup_min: 1\n")
    create_study(cfg)  # what optimize does first: the stored definition takes the wider space
    view = open_study(cfg.storage, "sweep")
    inputs = study_inputs(view)
    model = inputs.concurrency_model()
    assert model is not None and model.step.levels == (1, 4)
    assert model.t0(4) == base.levels[1].tpot_median_ms
    # n-gram's rho rests on this trial, unless its speculative part was too close to free to scale
    fitted = Method.NGRAM in model.rho
    assert model.rho.get(Method.NGRAM, (0.0, 1))[1] == 1
    preds = inputs.predict()
    assert sorted(p.label for p in preds) == ["ngram k=2 lookup=1..3", "ngram k=4 lookup=1..3"]
    moved = inputs.at_concurrency(preds, [1, 4, 16])
    for p, (at1, at4, at16) in zip(preds, moved, strict=True):
        assert at1.output_throughput.value == pytest.approx(p.output_throughput.value)
        assert at1.tpot_ms.value == pytest.approx(p.tpot_ms.value)
        # at a measured level the baseline's own measurement is what the candidate is scaled from;
        # the speculative part x grows with g, but one below 0 (the engine measured it faster than
        # its tokens explain: noise, which depends on the engine start) stays as it is
        g, _ = model.scale(Method.NGRAM, 4, "throughput")
        x = model.baseline_levels[1][1] * p.tokens_per_step.value / p.output_throughput.value - 1.0
        assert at4.output_throughput.value == pytest.approx(
            base.levels[1].output_throughput * p.tokens_per_step.value / (1.0 + (g * x if x > 0 else x)))
        for at in (at1, at4, at16):
            assert at.output_throughput.low <= at.output_throughput.value <= at.output_throughput.high
            assert 0 < at.tpot_ms.low <= at.tpot_ms.value <= at.tpot_ms.high and math.isfinite(at.tpot_ms.high)
            assert at.scale_source == ("fit" if fitted else "roofline")

    runner = CliRunner()
    shown = runner.invoke(app, ["predict", "--storage", cfg.storage, "--study", "sweep", "--concurrency", "2,8"],
                          env={"COLUMNS": "250"})
    assert shown.exit_code == 0, shown.output
    assert "c=2 tok/s" in shown.output and "c=8 tpot ms" in shown.output and "fitted on the baseline at 1, 4" in shown.output
    assert shown.output.count("ngram k=2 lookup=1..3") == 2  # in the ranking and at the other levels
    levels_part = shown.output[shown.output.index("at other concurrency"):]
    assert "ngram k=3 lookup=1..3" in levels_part and "measured" in levels_part  # the measured one, moved

    # the batch schedule of the n-gram trial rests on the sweep, and vLLM takes it
    from vllm.v1.spec_decode.dynamic.utils import (
        validate_and_normalize_dynamic_sd_schedule,
    )

    from spectune.export import batch_schedule

    schedule = batch_schedule(view, ngram, base, 16)
    assert schedule["model"].startswith("measured at each level")  # from the sweep's own step costs
    assert [lv["batch"] for lv in schedule["levels"]] == [1, 4] and {lv["source"] for lv in schedule["levels"]} == {"throughput"}
    assert all(lv["ks"] == [3] and lv["overhead"] == 0.0 and lv["c"] >= 0 for lv in schedule["levels"])
    ranges = schedule["num_speculative_tokens_per_batch_size"]
    assert validate_and_normalize_dynamic_sd_schedule(ranges) == [tuple(r) for r in ranges]
    assert ranges[0][0] == 1 and ranges[-1][1] == 16
