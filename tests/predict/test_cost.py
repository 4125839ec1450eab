"""The cost model: c and the overhead per proposer, engines brought to a typical speed by their TTFT gauge."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from synthetic import (
    synthetic_measurement,
)

from spectune.config import Method, SpecConfig
from spectune.errors import ConfigError
from spectune.measurement import (
    EngineTimingStats,
    LevelStats,
)
from spectune.predict import (
    PRIOR_ENGINE_SPREAD,
    PRIOR_OVERHEAD_HIGH,
    CostPoint,
    Estimate,
    at_typical_speed,
    engine_gauge_ms,
    engine_prefill_ms,
    fit_cost,
    fit_cost_model,
    gauge_weight,
    leviathan_expected_tokens,
)
from spectune.predict._cost import PRIOR_SPREAD
from spectune.predict._gauge import proposers_gauged_by_prefill


def test_cost_model_recovers_c() -> None:
    t0, c_true = 10.0, 0.12
    rng = random.Random(1)
    points = []
    for k in (1, 2, 3, 4, 6):
        e = leviathan_expected_tokens(0.7, k)
        noise = 1 + rng.uniform(-0.01, 0.01)  # 1 % measurement noise
        points.append(CostPoint(Method.DRAFT_MODEL, "d", k, t0 * (1 + c_true * k) / e * noise, e))
    exact = fit_cost(t0, [CostPoint(p.method, p.model, p.k, t0 * (1 + c_true * p.k) / p.tokens_per_step,
                                    p.tokens_per_step) for p in points])
    assert exact.c == pytest.approx(c_true, rel=1e-9) and exact.overhead == pytest.approx(0.0, abs=1e-9)
    fitted = fit_cost(t0, points)
    assert abs(fitted.c - c_true) < 0.01, f"fitted c={fitted.c:.4f}, true {c_true}"
    assert fitted.low <= c_true <= fitted.high and fitted.n == 5
    model = fit_cost_model(t0, 100.0, points)
    assert model.cost(SpecConfig(method=Method.DRAFT_MODEL, model="d", num_speculative_tokens=2)).source == "fit"
    other = model.cost(SpecConfig(method=Method.DRAFT_MODEL, model="other", num_speculative_tokens=2))
    assert other.source == "fit-method" and other.c == pytest.approx(fitted.c)
    prior = model.cost(SpecConfig(method=Method.NGRAM, num_speculative_tokens=2))
    assert prior.source == "prior" and prior.low < prior.c < prior.high
    # throughput goes inversely with TPOT at a fixed concurrency
    assert model.throughput(5.0) == pytest.approx(200.0)


def test_a_model_free_method_not_measured_yet_takes_the_other_model_free_methods_cost() -> None:
    # suffix decoding measured dear (c 0.4: verification on a compute-bound target), n-gram not yet
    t0 = 10.0
    e = {k: leviathan_expected_tokens(0.6, k) for k in (4, 8, 16)}
    points = [CostPoint(Method.SUFFIX, None, k, t0 * (1 + 0.4 * k) / e[k], e[k], f"suffix{k}", noise=0.01)
              for k in (4, 8, 16)]
    model = fit_cost_model(t0, 100.0, points)
    suffix = model.cost(SpecConfig(method=Method.SUFFIX, num_speculative_tokens=8))
    ngram = model.cost(SpecConfig(method=Method.NGRAM, num_speculative_tokens=4))
    assert ngram.source == "fit-model-free" and ngram.c == pytest.approx(suffix.c) and ngram.n == 3
    assert ngram.c > 3 * model.priors[Method.NGRAM]  # the prior's interval ([c/3, 3c]) would not hold it
    # a draft model runs a model of its own: the text proposers' cost says nothing of it
    assert model.cost(SpecConfig(method=Method.DRAFT_MODEL, model="d", num_speculative_tokens=2)).source == "prior"
    # predicted n-gram throughput falls with it: far below what the prior gave
    prior_only = fit_cost_model(t0, 100.0, [])
    spec, tokens = SpecConfig(method=Method.NGRAM, num_speculative_tokens=4), Estimate(2.0, 2.0, 2.0)
    assert model.predict_tpot(spec, tokens).value > 2 * prior_only.predict_tpot(spec, tokens).value
    # once n-gram is measured it is priced by its own trials
    own = fit_cost_model(t0, 100.0, [*points, CostPoint(Method.NGRAM, None, 4, t0 * 1.1 / 2.0, 2.0, "ngram4")])
    assert own.cost(spec).source == "fit" and own.cost(spec).c < suffix.c


def test_the_priors_dear_end_allows_a_fixed_step_overhead_that_its_estimate_does_not_assume() -> None:
    t0, spec, tokens = 10.0, SpecConfig(method=Method.SUFFIX, num_speculative_tokens=8), Estimate(2.5, 2.0, 3.0)
    model = fit_cost_model(t0, 100.0, [])
    c, d = model.priors[Method.SUFFIX], 3.0
    tpot = model.predict_tpot(spec, tokens, d)
    assert tpot.value == pytest.approx(t0 * (1 + c * d) / 2.5)  # the estimate: no overhead
    assert tpot.low == pytest.approx(t0 * (1 + c / PRIOR_SPREAD * d) / 3.0)
    assert tpot.high == pytest.approx(t0 * (1 + PRIOR_OVERHEAD_HIGH + c * PRIOR_SPREAD * d) / 2.0)
    # a step at twice the target's, whatever it drafts (a small model on a CPU), is inside the interval
    dear = t0 * 2.0 * (1 + c * d) / 2.5
    assert tpot.low < dear < tpot.high
    # once the method is measured its fit prices it, and the prior's overhead is gone from the dear end
    measured = fit_cost_model(t0, 100.0, [CostPoint(Method.SUFFIX, None, 8, t0 * (1 + 0.1 * d) / 2.5, 2.5, "s8",
                                                    drafted=d, noise=0.01)])
    fitted = measured.cost(spec)
    assert fitted.source == "fit" and fitted.overhead_high is None
    assert measured.predict_tpot(spec, tokens, d).high == pytest.approx(t0 * (1 + fitted.high * d) / 2.0)


def test_a_cost_fitted_on_one_engine_start_is_as_uncertain_as_engines_differ() -> None:
    # one suffix configuration measured on one engine, its windows steady (1 %): that engine may
    # have run slow, and its fit prices every other suffix and n-gram configuration
    t0, d, e = 10.0, 3.0, 2.5
    s8 = CostPoint(Method.SUFFIX, None, 8, t0 * (1 + 0.1 * d) / e, e, "s8", drafted=d, noise=0.01)
    spec, tokens = SpecConfig(method=Method.NGRAM, num_speculative_tokens=4), Estimate(e, e, e)

    def relative_interval(model):
        tpot = model.predict_tpot(spec, tokens, d)
        return tpot.low / tpot.value, tpot.high / tpot.value

    unknown = fit_cost_model(t0, 100.0, [s8])  # no configuration measured twice yet: the prior spread
    low, high = relative_interval(unknown)
    assert unknown.cost(spec).source == "fit-model-free"
    assert low == pytest.approx(1 - PRIOR_ENGINE_SPREAD) and high == pytest.approx(1 + PRIOR_ENGINE_SPREAD)
    steady = fit_cost_model(t0, 100.0, [s8], engine_spread=0.03)  # the study measured its engines alike
    assert relative_interval(steady) == pytest.approx((0.97, 1.03))
    # alike to the digit: the noise of one measurement (REL_NOISE, 2 %) still holds
    assert relative_interval(fit_cost_model(t0, 100.0, [s8], engine_spread=0.0)) == pytest.approx((0.98, 1.02))
    # measured on two engines 10 % apart, the configuration carries their own spread (the standard
    # deviation over the mean, 6.7 %), not the prior's
    again = dataclasses.replace(s8, tpot_ms=s8.tpot_ms * 1.10)
    own = math.sqrt(2 * 0.05 ** 2) / 1.05
    assert relative_interval(fit_cost_model(t0, 100.0, [s8, again])) == pytest.approx((1 - own, 1 + own))
    # two configurations: the fit's interval spans what they measured (here each at the 2 % floor,
    # s4's drafted tokens scaled to the candidate's), no floor of its own
    s4 = CostPoint(Method.SUFFIX, None, 4, t0 * (1 + 0.1 * 2.0) / 2.0, 2.0, "s4", drafted=2.0, noise=0.01)
    widen = 0.02 * (1 + 0.1 * 2.0) / 2.0 * d / (1 + 0.1 * d)  # s4's 2 % on c, at the candidate's d
    assert relative_interval(fit_cost_model(t0, 100.0, [s8, s4])) == pytest.approx((1 - widen, 1 + widen))


def test_a_cost_that_does_not_grow_with_drafted_tokens_is_a_flat_overhead() -> None:
    t0, overhead = 10.0, 0.5
    # every step costs 1.5 t0 whatever it drafts; the noise tilts the slope slightly down
    ds_ys = [(0.5, 0.55), (1.0, 0.52), (2.0, 0.50), (3.0, 0.47), (4.0, 0.46)]
    points = [CostPoint(Method.NGRAM, None, max(1, round(d)), t0 * (1 + y) / 1.5, 1.5, f"p{i}", drafted=d)
              for i, (d, y) in enumerate(ds_ys)]
    fitted = fit_cost(t0, points)
    assert fitted.c == 0.0 and fitted.overhead == pytest.approx(sum(y for _, y in ds_ys) / len(ds_ys))
    assert abs(fitted.overhead - overhead) < 0.05
    # a speculative step that drafts half a token is predicted at 1.5 t0, not at 1 + c/2
    model = fit_cost_model(t0, 100.0, points)
    tpot = model.predict_tpot(SpecConfig(method=Method.NGRAM, num_speculative_tokens=1),
                              Estimate(1.5, 1.5, 1.5), drafted=0.5)
    assert tpot.value == pytest.approx(t0 * (1 + fitted.overhead) / 1.5)


def test_a_configuration_measured_on_two_engines_counts_once_with_its_mean() -> None:
    t0 = 10.0
    e = {k: leviathan_expected_tokens(0.7, k) for k in (1, 2, 4)}

    def point(k: int, c: float, label: str) -> CostPoint:
        return CostPoint(Method.SUFFIX, None, k, t0 * (1 + c * k) / e[k], e[k], label, noise=0.01)

    # k=4 on a slow engine (c 0.3) and a fast one (c 0.1): as one configuration at their mean time
    slow, fast = point(4, 0.3, "k4"), point(4, 0.1, "k4")
    twice = fit_cost(t0, [point(1, 0.2, "k1"), point(2, 0.2, "k2"), slow, fast])
    mean = CostPoint(Method.SUFFIX, None, 4, (slow.tpot_ms + fast.tpot_ms) / 2, e[4], "k4", noise=0.01)
    once = fit_cost(t0, [point(1, 0.2, "k1"), point(2, 0.2, "k2"), mean])
    assert twice.n == once.n == 3  # configurations, not engines: the overhead is fitted on three
    assert twice.c == pytest.approx(once.c) and twice.overhead == pytest.approx(once.overhead)
    assert twice.c == pytest.approx(0.2) and twice.overhead == pytest.approx(0.0, abs=1e-9)
    # the spread between the two engines widens the interval beyond the windows' 1 %
    assert twice.high - twice.low > once.high - once.low
    # unlabelled points are never merged
    assert fit_cost(t0, [CostPoint(Method.SUFFIX, None, 4, slow.tpot_ms, e[4]),
                         CostPoint(Method.SUFFIX, None, 4, fast.tpot_ms, e[4])]).n == 2


def test_a_slow_engine_is_told_by_its_prefill_and_does_not_make_its_configuration_dear() -> None:
    t0, c, overhead = 10.0, 0.2, 0.1
    speed = {1: 1.0, 2: 1.3, 4: 0.8, 6: 1.0}  # each engine's time against a typical one (median 1)

    def point(k: int, gauge: bool = True) -> CostPoint:
        e = leviathan_expected_tokens(0.7, k)
        return CostPoint(Method.NGRAM, None, k, t0 * (1 + overhead + c * k) / e * speed[k], e, f"k{k}",
                         gauge_ms=40.0 * speed[k] if gauge else None)

    told = fit_cost(t0, [point(k) for k in speed])
    assert told.c == pytest.approx(c) and told.overhead == pytest.approx(overhead)
    # the same engines without their gauge: the slow k=2 and the fast k=4 bend the fit
    untold = fit_cost(t0, [point(k, gauge=False) for k in speed])
    assert abs(untold.c - c) > 0.02
    assert told.high - told.low < untold.high - untold.low
    # one trial without a gauge: its proposer's times stay as measured
    assert fit_cost(t0, [point(1), point(2, gauge=False), point(4), point(6)]).c == pytest.approx(untold.c)
    # a prefill five times the typical one is a hiccup, not the engine's speed: left as measured
    hiccup = CostPoint(Method.NGRAM, None, 2, point(2).tpot_ms, point(2).tokens_per_step, "k2", gauge_ms=200.0)
    assert at_typical_speed([point(1), point(4), point(6), hiccup])[-1] == hiccup
    # two trials do not make a typical engine: either could be the hiccup
    assert at_typical_speed([point(2), point(4)]) == [point(2), point(4)]


def test_the_gauge_counts_as_far_as_the_machine_shows_it_tells_the_engines_speed() -> None:
    t0 = 10.0
    c = {Method.NGRAM: (0.2, 0.1), Method.SUFFIX: (0.15, 0.0)}  # (c, overhead)
    speed = {1: 1.0, 2: 1.25, 3: 0.85, 4: 1.0, 6: 1.15}  # each engine's time against a typical one

    def points(told: bool, swing: float = 1.0, speed: dict[int, float] = speed) -> list[CostPoint]:
        # told: the TTFT follows the engine's speed (to the power swing); else the times are exact
        # and the TTFT wanders
        out = []
        for method, (cm, overhead) in c.items():
            for k, f in speed.items():
                e = leviathan_expected_tokens(0.7, k)
                time = t0 * (1 + overhead + cm * k) / e * (f if told else 1.0)
                out.append(CostPoint(method, None, k, time, e, f"{method.value}{k}", gauge_ms=40.0 * f**swing))
        return out

    assert gauge_weight(t0, points(told=True)) == pytest.approx(1.0, abs=1e-3)
    assert gauge_weight(t0, points(told=False)) == pytest.approx(0.0, abs=1e-3)
    for told in (True, False):  # either way the fit recovers each proposer's cost
        model = fit_cost_model(t0, 100.0, points(told))
        assert model.gauge_weight == pytest.approx(1.0 if told else 0.0, abs=1e-3)
        for method, (cm, overhead) in c.items():
            fitted = model.proposers[(method, None)]
            assert fitted.c == pytest.approx(cm, abs=1e-3) and fitted.overhead == pytest.approx(overhead, abs=1e-3)
    # scaling by a TTFT that does not tell would have bent the fit
    assert abs(fit_cost(t0, points(told=False)[:5]).c - 0.2) > 0.02
    # too few trials of gauged proposers to weigh the gauge: it counts in full, as before the weight
    assert gauge_weight(t0, points(told=False)[:5]) == 1.0
    # a TTFT that swings twice as far as the engine's speed: the speeds count to the power 1/2
    half = points(told=True, swing=2.0, speed={1: 1.0, 2: 1.1, 3: 0.9, 4: 1.0, 6: 1.05})  # within 1.5x
    assert gauge_weight(t0, half) == pytest.approx(0.5, abs=2e-3)
    assert fit_cost_model(t0, 100.0, half).proposers[(Method.NGRAM, None)].c == pytest.approx(0.2, abs=1e-3)


def test_the_engine_cores_own_prefill_gauges_a_proposer_whose_every_trial_has_it() -> None:
    # the client's TTFT of the second trial is the API server's delivery (7x), not its engine;
    # the engine core timed the third engine 25 % slow
    ttft = (30.0, 210.0, 30.0, 31.0)
    prefill = (20.0, 20.0, 25.0, 20.0)
    points = [CostPoint(Method.NGRAM, None, k, 5.0, 2.0, f"n{k}", gauge_ms=g, prefill_ms=e)
              for k, g, e in zip((1, 2, 3, 4), ttft, prefill, strict=True)]
    assert [p.tpot_ms for p in at_typical_speed(points)] == pytest.approx([5.0, 5.0, 5.0 * 20 / 25, 5.0])
    # one trial without the engine's timing: the client's TTFT for all, the 7x read as a hiccup
    mixed = [*points[:3], dataclasses.replace(points[3], prefill_ms=None)]
    assert [p.tpot_ms for p in at_typical_speed(mixed)] == pytest.approx([5.0 * 30.5 / 30, 5.0, 5.0 * 30.5 / 30, 5.0 * 30.5 / 31])
    # ... of that proposer only: suffix decoding's trials, all timed by the engine core, keep its
    # prefill (its TTFTs would have read the 30 % slow engine as fast)
    suffix = [CostPoint(Method.SUFFIX, None, k, 4.0, 2.0, f"s{k}", gauge_ms=g, prefill_ms=e)
              for k, g, e in zip((4, 8, 16), (40.0, 30.0, 40.0), (20.0, 26.0, 20.0), strict=True)]
    both = at_typical_speed([*mixed, *suffix])
    assert [p.tpot_ms for p in both[:4]] == pytest.approx([p.tpot_ms for p in at_typical_speed(mixed)])
    assert [p.tpot_ms for p in both[4:]] == pytest.approx([4.0, 4.0 * 20 / 26, 4.0])
    assert proposers_gauged_by_prefill([*mixed, *suffix]) == {(Method.SUFFIX, None)}


def test_gauges_compare_within_a_proposer_and_along_a_model_drafters_k() -> None:
    ngram = [CostPoint(Method.NGRAM, None, k, 5.0, 2.0, f"n{k}", gauge_ms=g) for k, g in ((1, 32.0), (2, 40.0), (3, 52.0))]
    # two draft models of one method, each on engines of the same speed, prefills near n-gram's
    drafts = [CostPoint(Method.DRAFT_MODEL, model, 2, 8.0, 2.0, f"{model}{i}", gauge_ms=g)
              for model, g in (("a", 50.0), ("b", 36.0)) for i in range(3)]
    scaled = at_typical_speed([*ngram, *drafts])
    assert scaled[3:] == drafts  # one median over all would have moved them
    assert [p.tpot_ms for p in scaled[:3]] == pytest.approx([5.0 * 40 / 32, 5.0, 5.0 * 40 / 52])
    # a model drafter runs its k passes in the prefill's step: its TTFT grows with k, whatever the engine
    t0, c, overhead = 10.0, 0.25, 0.3

    def draft(k: int, slow: float = 1.0) -> CostPoint:
        e = leviathan_expected_tokens(0.6, k)
        return CostPoint(Method.DRAFT_MODEL, "d", k, t0 * (1 + overhead + c * k) / e * slow, e, f"d{k}",
                         gauge_ms=(30.0 + 3.0 * k) * slow)

    along_k = [draft(k) for k in range(1, 7)]
    assert [p.tpot_ms for p in at_typical_speed(along_k)] == pytest.approx([p.tpot_ms for p in along_k])
    fitted = fit_cost(t0, [*along_k[:2], draft(3, slow=1.3), *along_k[3:]])
    assert fitted.c == pytest.approx(c, rel=1e-4) and fitted.overhead == pytest.approx(overhead, rel=1e-4)
    # requests in flight together wait behind each other's decode steps: no gauge then
    m = synthetic_measurement(SpecConfig(method=Method.NGRAM, num_speculative_tokens=2), 8.0, [0.5, 0.2])
    assert engine_gauge_ms(m) == pytest.approx(50.0)
    assert engine_gauge_ms(m.model_copy(update={"concurrency": 4})) is None
    # a sweep's level 1 is a gauge whatever the headline
    one = LevelStats(concurrency=1, num_requests=4, num_failed=0, duration_seconds=1.0, output_throughput=90.0,
                     tpot_median_ms=8.0, ttft_median_ms=61.0, acceptance=None)
    assert engine_gauge_ms(m.model_copy(update={"concurrency": 4, "levels": [one]})) == pytest.approx(61.0)
    # the engine core's own prefill: at concurrency 1 only, and only where vLLM reported it
    timed = m.model_copy(update={"engine_timing": EngineTimingStats(requests=4, prefill_ms=31.0, tpot_ms=8.0)})
    assert engine_prefill_ms(timed) == pytest.approx(31.0) and engine_prefill_ms(m) is None
    assert engine_prefill_ms(timed.model_copy(update={"concurrency": 4})) is None


def test_a_method_of_the_engines_without_a_prior_of_its_own_is_priced_as_its_kind() -> None:
    """dflash and ngram_gpu, which the installed vLLM runs and spectune has no prior for."""
    model = fit_cost_model(10.0, 100.0, [])
    dflash = model.cost(SpecConfig(method=Method("dflash"), model="org/dflash-head", num_speculative_tokens=4))
    gpu_lookup = model.cost(SpecConfig(method=Method("ngram_gpu"), num_speculative_tokens=4))
    assert dflash.source == gpu_lookup.source == "prior"
    assert dflash.c == model.priors[Method.EAGLE3] and gpu_lookup.c == model.priors[Method.NGRAM]
    with pytest.raises(ConfigError, match="no cost known for method none"):
        model.cost(SpecConfig())
