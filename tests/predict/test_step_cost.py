"""The step-cost curve: the baseline's engine times forwards over the new tokens a verification
step holds, on cached contexts, at each load level (spectune.stepcost)."""

from __future__ import annotations

import json

import pytest

from spectune.config import Method, SpecConfig
from spectune.counters import parse_counters
from spectune.measurement import StepCost, StepCostPoint
from spectune.objective import step_tokens
from spectune.predict import CURVE_NOISE, CostPoint, Estimate, StepCurve, fit_cost_model
from spectune.space import SearchSpace
from spectune.stepcost import prefix_length, probe_tokens


def test_the_points_reach_one_past_the_largest_k_doubling_from_one() -> None:
    assert probe_tokens(1) == [1, 2]
    assert probe_tokens(3) == [1, 2, 4]
    assert probe_tokens(16) == [1, 2, 4, 8, 16, 17]
    space = SearchSpace.model_validate({"methods": {"none": {}, "ngram": {
        "num_speculative_tokens": [2, 5], "prompt_lookup_max": 3, "prompt_lookup_min": 1}}}).resolve("m")
    assert step_tokens(space) == [1, 2, 4, 6]
    alone = SearchSpace.model_validate({"methods": {"none": {}}}).resolve("m")
    assert step_tokens(alone) == []  # nothing speculates: no curve


def test_the_prefix_is_the_mean_context_in_whole_blocks_and_leaves_room_for_the_new_tokens() -> None:
    assert prefix_length(200, 128, None) == 256  # 200 + 64, to the nearest 128
    assert prefix_length(3, 8, None) == 128  # at least one block
    assert prefix_length(900, 256, 500) == 384  # max_model_len less the new tokens, in whole blocks
    assert prefix_length(900, 256, 100) == 100  # less than a block of room: what there is


def test_the_computed_tokens_and_steps_are_read_from_vllms_counters() -> None:
    text = ("# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{engine=\"0\"} 530\n"
            "# TYPE vllm:prompt_tokens_cached_total counter\nvllm:prompt_tokens_cached_total{engine=\"0\"} 512\n"
            "# TYPE vllm:iteration_tokens_total histogram\n"
            "vllm:iteration_tokens_total_bucket{engine=\"0\",le=\"+Inf\"} 3\n"
            "vllm:iteration_tokens_total_count{engine=\"0\"} 3\nvllm:iteration_tokens_total_sum{engine=\"0\"} 21\n")
    c = parse_counters(text)
    assert (c.prompt_tokens, c.cached_prompt_tokens, c.steps) == (530, 512, 3)


@pytest.mark.engine
def test_the_baselines_engine_times_its_steps_at_each_level_and_show_carries_the_curve(swept_study) -> None:  # noqa: ANN001
    from typer.testing import CliRunner

    from spectune.cli import app

    cfg, _ = swept_study
    out = CliRunner().invoke(app, ["show", "--storage", cfg.storage, "--study", "sweep", "--json"])
    assert out.exit_code == 0, out.output
    trials = {t["label"]: t for t in json.loads(out.stdout)["trials"]}
    base, ngram = trials["none"], trials["ngram k=3 lookup=1..3"]
    assert ngram["step_cost"] is None  # only the baseline's engine times its steps
    curve = base["step_cost"]
    # each load level of the sweep, each new-token count a step with k <= 3 verifies
    assert sorted((p["batch"], p["new_tokens"]) for p in curve) == [(b, n) for b in (1, 4) for n in (1, 2, 4)]
    for p in curve:
        assert p["ms"] > 0 and 0 < p["tokens"] <= p["batch"] * p["new_tokens"]
        assert p["cached_tokens"] >= 128  # the context came from the prefix cache: the forward is the new tokens'
    one, most = (next(p for p in curve if (p["batch"], p["new_tokens"]) == bn) for bn in ((1, 1), (4, 4)))
    assert most["tokens"] > one["tokens"]
    assert 0 < base["step_cost_seconds"] < 120


def _curve(batch: int, ms_of: dict[int, float]) -> StepCost:
    return StepCost(points=[StepCostPoint(batch=batch, new_tokens=n, tokens=float(batch * n), ms=ms)
                            for n, ms in ms_of.items()], prefix_tokens=128, seconds=1.0)


def test_a_step_costs_what_the_curve_says_between_and_past_its_points() -> None:
    # flat while the forward is bound by reading the weights, then linear in the tokens
    curve = StepCurve.of(_curve(4, {1: 10.0, 2: 10.0, 4: 20.0}), batch=4)
    assert curve is not None and curve.batch == 4
    assert curve.ratio(0.0) == 1.0 and curve.ratio(1.0) == 1.0  # 8 tokens: as cheap as 4
    assert curve.ratio(2.0) == pytest.approx(1.5)  # 12 tokens: halfway between 8 and 16
    assert curve.ratio(5.0) == pytest.approx(3.0)  # 24 tokens: the last segment, extended
    two = _curve(1, {1: 5.0, 2: 5.0}).points + _curve(16, {1: 50.0, 2: 90.0}).points
    nearest = StepCurve.of(StepCost(points=two, prefix_tokens=128, seconds=1.0), batch=12)
    assert nearest is not None and nearest.batch == 16  # the load nearest the study's


def test_an_unmeasured_model_free_method_is_priced_by_the_curve_until_a_trial_of_its_kind_is_fitted() -> None:
    ngram = SpecConfig(method=Method.NGRAM, num_speculative_tokens=3, prompt_lookup_max=3, prompt_lookup_min=1)
    tokens = Estimate(2.0, 1.8, 2.2)  # two tokens a step
    cheap = fit_cost_model(10.0, 100.0, [], curve=StepCurve.of(_curve(1, {1: 10.0, 4: 11.0}), batch=1))
    dear = fit_cost_model(10.0, 100.0, [], curve=StepCurve.of(_curve(8, {1: 10.0, 4: 40.0}), batch=8))
    assert cheap.cost(ngram).source == dear.cost(ngram).source == "step-cost"
    at_one = cheap.predict_tpot(ngram, tokens, drafted=3.0)
    assert at_one.value == pytest.approx(10.0 * 1.1 / 2.0)  # a step over 4 tokens costs 11 ms: speculation pays
    assert at_one.low >= 10.0 / 2.2 and at_one.high == pytest.approx(10.0 * 1.1 * (1 + CURVE_NOISE) / 1.8)
    at_eight = dear.predict_tpot(ngram, tokens, drafted=3.0)
    assert at_eight.value == pytest.approx(10.0 * 4.0 / 2.0) and at_eight.value > 10.0  # at 8 in flight it loses
    assert fit_cost_model(10.0, 100.0, []).cost(ngram).source == "prior"  # no curve: the prior
    # a model-free trial measured: its fit answers, not the curve
    point = CostPoint(method=Method.SUFFIX, model=None, k=8, tpot_ms=6.0, tokens_per_step=2.0, drafted=3.0)
    fitted = fit_cost_model(10.0, 100.0, [point], curve=StepCurve.of(_curve(1, {1: 10.0, 4: 11.0}), batch=1))
    assert fitted.cost(ngram).source == "fit-model-free"
