"""Modelling: acceptance arithmetic, offline replay against real engines, cost model, ranking."""

from __future__ import annotations

import datetime as dt
import math
import random
from pathlib import Path

import pytest
from conftest import tiny_engine_args

from spectune.config import EngineArgs, Method, SpecConfig, WorkloadSpec
from spectune.counters import SpecCounters
from spectune.measurement import (
    AcceptanceStats,
    Hardware,
    LatencyStats,
    LevelStats,
    Measurement,
    RequestSample,
    Versions,
    WindowStats,
)
from spectune.predict import (
    AcceptanceProfile,
    CostPoint,
    Estimate,
    acceptance_rate_at,
    at_typical_speed,
    conditional_acceptance,
    engine_gauge_ms,
    expected_tokens_per_step,
    fit_cost,
    fit_cost_model,
    gauge_weight,
    leviathan_expected_tokens,
    leviathan_improvement,
    measured_prediction,
    predict_candidates,
    replay_suffix,
    suffix_available,
)
from spectune.search import predict_study

# -- truncation and Leviathan's formulas ----------------------------------------------------------


def test_truncation_is_exact_on_recorded_counters() -> None:
    drafts, per_pos = 200, (170, 121, 80, 33, 9)  # drafts whose first i+1 tokens were accepted
    big_k = len(per_pos)
    full = SpecCounters(num_drafts=drafts, num_draft_tokens=drafts * big_k, num_accepted_tokens=sum(per_pos),
                        accepted_per_pos=per_pos).acceptance()
    assert full is not None
    profile = AcceptanceProfile(tuple(full.per_position))
    assert expected_tokens_per_step(full.per_position, big_k) == pytest.approx(full.mean_acceptance_length)
    assert expected_tokens_per_step(full.per_position, 0) == 1.0
    for k in range(1, big_k + 1):
        # what vLLM would have counted had the proposer drafted only the first k tokens of each draft
        cut = SpecCounters(num_drafts=drafts, num_draft_tokens=drafts * k, num_accepted_tokens=sum(per_pos[:k]),
                           accepted_per_pos=per_pos[:k]).acceptance()
        assert cut is not None
        assert expected_tokens_per_step(full.per_position, k) == pytest.approx(1 + cut.num_accepted_tokens / cut.num_drafts)
        assert expected_tokens_per_step(full.per_position, k) == pytest.approx(cut.mean_acceptance_length)
        assert acceptance_rate_at(full.per_position, k) == pytest.approx(cut.acceptance_rate)
        assert profile.truncated(k).tokens_per_step == pytest.approx(cut.mean_acceptance_length)
        assert profile.truncated(k).acceptance_rate == pytest.approx(cut.acceptance_rate)
    with pytest.raises(ValueError, match="truncation only shortens"):
        expected_tokens_per_step(full.per_position, big_k + 1)
    cond = conditional_acceptance(full.per_position)
    assert cond == pytest.approx([170 / 200, 121 / 170, 80 / 121, 33 / 80, 9 / 33])
    assert conditional_acceptance([0.5, 0.0, 0.0]) == [0.5, 0.0, 0.0]


def test_leviathan_formulas() -> None:
    assert leviathan_expected_tokens(0.5, 1) == pytest.approx(1.5)
    assert leviathan_expected_tokens(0.5, 3) == pytest.approx(1.875)
    assert leviathan_expected_tokens(0.8, 5) == pytest.approx((1 - 0.8**6) / 0.2)  # 3.68928
    assert leviathan_expected_tokens(0.0, 4) == 1.0
    # alpha -> 1: every drafted token accepted, k + 1 tokens a step, continuously
    for k in (1, 3, 7):
        assert leviathan_expected_tokens(1.0, k) == k + 1
        assert leviathan_expected_tokens(1 - 1e-9, k) == pytest.approx(k + 1, rel=1e-6)
        assert leviathan_improvement(1.0, k, 0.1) == pytest.approx((k + 1) / (0.1 * k + 1))
    # constant alpha is the special case per_position[i] = alpha^(i+1)
    assert expected_tokens_per_step(AcceptanceProfile.leviathan(0.7, 4).per_position, 4) == pytest.approx(
        leviathan_expected_tokens(0.7, 4))
    assert leviathan_improvement(0.8, 5, 0.05) == pytest.approx(3.68928 / 1.25)
    assert leviathan_improvement(0.8, 0, 0.3) == 1.0  # no speculation, no change
    # a dear proposer makes speculation slower than none
    assert leviathan_improvement(0.5, 3, 1.0) < 1.0
    assert leviathan_improvement(0.9, 8, 2.0) < 1.0
    with pytest.raises(ValueError):
        leviathan_expected_tokens(1.2, 3)


# -- suffix replay (no engine: Arctic Inference's cache driven as vLLM drives it) -----------------


def _req(prompt: list[int], output: list[int]) -> RequestSample:
    return RequestSample(prompt_id="p", ok=True, token_ids=output, prompt_token_ids=prompt,
                         output_tokens=len(output), prompt_tokens=len(prompt))


@pytest.mark.skipif(not suffix_available(), reason="arctic_inference is not installed")
def test_suffix_replay_learns_from_earlier_responses() -> None:
    rng = random.Random(0)
    prompt = [rng.randrange(1000, 30000) for _ in range(40)]
    output = [rng.randrange(1000, 30000) for _ in range(60)]  # no repetition inside, none with the prompt
    one = replay_suffix([_req(prompt, output)], 4)
    twice = replay_suffix([_req(prompt, output), _req(prompt, output)], 4)
    no_cache = replay_suffix([_req(prompt, output), _req(prompt, output)], 4, max_cached_requests=0)
    for r in (one, twice, no_cache):  # bookkeeping: every output token but the first from a decode step
        assert r.num_decode_tokens == r.num_requests * (len(output) - 1)
        # a step yields its accepted tokens and one more, unless the output ends with the accepted ones
        assert 0 <= r.num_steps - (r.num_decode_tokens - r.num_accepted_tokens) <= r.num_requests
        assert list(r.accepted_per_pos) == sorted(r.accepted_per_pos, reverse=True)
        assert sum(r.accepted_per_pos) == r.num_accepted_tokens and r.num_drafts <= r.num_steps
    assert one.num_accepted_tokens == 0
    # the second, identical request is drafted from the first one's response in the global tree
    assert twice.num_accepted_tokens > 0.5 * (len(output) - 1)
    assert twice.acceptance_rate > 0.9
    assert one.num_steps == len(output) - 1
    assert twice.num_steps - one.num_steps < (len(output) - 1) / 3  # the second request in few steps
    assert twice.profile().tokens_per_step == pytest.approx(twice.num_decode_tokens / twice.num_steps, rel=0.02)
    # without the global cache it is on its own again
    assert no_cache.num_accepted_tokens == 0
    acc = twice.acceptance()
    assert acc is not None and acc.mean_acceptance_length == pytest.approx(twice.mean_acceptance_length)


# -- draft replay: what the draft proposes along recorded outputs ----------------------------------


def test_draft_replay_counts_steps_as_the_engine_and_expects_what_max_tokens_cut_off() -> None:
    from spectune.predict import DraftGuesses, replay_draft

    # guess[n]: the draft's argmax after prompt + output[:n]; the last one looks past the output
    wrong_at_3 = (2, (10, 11, 12, 13, 14, 15), (10, 11, 12, 99, 14, 15, 77))
    all_right = (1, (20, 21, 22, 23, 24, 25, 26, 27), (20, 21, 22, 23, 24, 25, 26, 27, 5))
    one = replay_draft(DraftGuesses((wrong_at_3,)), 1)
    # n=1 draft [11] accepted -> n=3; [99] against 13 rejected -> n=4; [14] accepted -> n=6, the end
    assert (one.num_drafts, one.num_accepted_tokens, one.num_steps, one.num_truncated_drafts) == (3, 2, 3, 0)
    three = replay_draft(DraftGuesses((wrong_at_3, all_right)), 3)
    # first request: [11, 12, 99] two accepted -> n=4; [14, 15, 77] where the output ends after 15: cut
    # second: [21, 22, 23] and [25, 26, 27], all accepted
    assert (three.num_drafts, three.num_draft_tokens, three.num_accepted_tokens) == (4, 12, 10)
    assert three.accepted_per_pos == (4, 4, 2) and three.truncated_per_pos == (0, 0, 1)
    assert three.num_decode_tokens == 5 + 7 and three.num_steps == 4
    # the cut position counts with the acceptance of the third position in the drafts not cut: 2 of 3
    assert three.expected_per_pos == pytest.approx((4, 4, 2 + 2 / 3))
    assert three.mean_acceptance_length == 3.5  # the engine's counters lie between the two
    assert three.profile().mean_acceptance_length == pytest.approx(1 + (10 + 2 / 3) / 4)
    # the draft runs in transformers, not in the engine: its replay carries an interval, vLLM's own
    # n-gram code replayed does not
    from spectune.predict import DRAFT_REPLAY_SPREAD, replay_ngram

    assert three.spread == DRAFT_REPLAY_SPREAD > 0
    assert replay_ngram([_req([5, 6, 7], [5, 6, 7, 5, 6])], 2, 1, 3).spread == 0.0
    # near max_model_len the scheduler drafts only up to max_model_len - 1 tokens in all: with 2
    # prompt tokens and a limit of 6, n=1 drafts [11, 12] (both accepted) -> n=4 drafts nothing
    near = replay_draft(DraftGuesses((wrong_at_3,)), 3, max_model_len=6)
    assert (near.num_drafts, near.num_draft_tokens, near.num_accepted_tokens, near.num_steps) == (1, 2, 2, 3)
    with pytest.raises(ValueError, match="k must be >= 1"):
        replay_draft(DraftGuesses((wrong_at_3,)), 0)


# -- cost model ---------------------------------------------------------------------------------------


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
    m = _measurement(SpecConfig(method=Method.NGRAM, num_speculative_tokens=2), 8.0, [0.5, 0.2])
    assert engine_gauge_ms(m) == pytest.approx(50.0)
    assert engine_gauge_ms(m.model_copy(update={"concurrency": 4})) is None
    # a sweep's level 1 is a gauge whatever the headline
    one = LevelStats(concurrency=1, num_requests=4, num_failed=0, duration_seconds=1.0, output_throughput=90.0,
                     tpot_median_ms=8.0, ttft_median_ms=61.0, acceptance=None)
    assert engine_gauge_ms(m.model_copy(update={"concurrency": 4, "levels": [one]})) == pytest.approx(61.0)


# -- ranking over synthetic measurements -----------------------------------------------------------

_VERSIONS = Versions(spectune="test", vllm=None, torch=None, python="3")
_HARDWARE = Hardware(platform="cpu", cpu="test", cpu_count=2, memory_bytes=None, gpus=[])
T0, BASE_THROUGHPUT = 10.0, 100.0


def _stats(value: float | None) -> LatencyStats:
    return LatencyStats(count=1, mean=value, median=value, p90=value, p99=value)


def _measurement(spec: SpecConfig, tpot_ms: float, per_position: list[float] | None = None,
                 requests: list[RequestSample] | None = None, drafts: int = 100) -> Measurement:
    """A consistent Measurement: throughput ~ 1 / TPOT, every decode step drafted."""
    throughput = BASE_THROUGHPUT * T0 / tpot_ms
    acceptance = None
    if per_position is not None:
        accepted = round(drafts * sum(per_position))
        acceptance = AcceptanceStats(
            num_drafts=drafts, num_draft_tokens=drafts * len(per_position), num_accepted_tokens=accepted,
            acceptance_rate=accepted / (drafts * len(per_position)), mean_acceptance_length=1 + accepted / drafts,
            per_position=per_position)
        out = drafts + accepted + 1  # one request: the prefill's token, then `drafts` steps
        requests = [RequestSample(prompt_id="p0", ok=True, output_tokens=out, tpot_ms=tpot_ms)]
    requests = requests or [RequestSample(prompt_id="p0", ok=True, output_tokens=101, tpot_ms=tpot_ms)]
    out_tokens = sum(r.output_tokens or 0 for r in requests)
    window = WindowStats(duration_seconds=out_tokens / throughput, output_throughput=throughput,
                         tpot_median_ms=tpot_ms, tpot_p99_ms=tpot_ms * 1.2, ttft_median_ms=50.0, ttft_p99_ms=60.0,
                         e2el_median_ms=50.0 + 100 * tpot_ms, e2el_p99_ms=60.0 + 120 * tpot_ms)
    return Measurement(
        spec=spec, engine=EngineArgs(model="tgt", max_model_len=512),
        workload=WorkloadSpec(source="synthetic.jsonl"), concurrency=1, command=["vllm"], log_path=None,
        started_at=dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc), startup_seconds=1.0,
        duration_seconds=window.duration_seconds, num_requests=len(requests), num_failed=0, input_tokens=10,
        output_tokens=out_tokens, output_throughput=throughput, request_throughput=1.0,
        total_token_throughput=throughput, ttft_ms=_stats(50.0), tpot_ms=_stats(tpot_ms), itl_ms=_stats(tpot_ms),
        e2el_ms=_stats(window.e2el_median_ms), acceptance=acceptance, peak_memory_bytes=None,
        versions=_VERSIONS, hardware=_HARDWARE, windows=[window], requests=requests,
    )


def _tpot(c: float, k: int, per_position: list[float]) -> float:
    return T0 * (1 + c * k) / (1 + sum(per_position))


GOOD = [0.9, 0.8, 0.5, 0.2]  # a draft that agrees with the target over the first tokens
POOR = [0.2, 0.05, 0.01, 0.0]  # n-gram lookup on text that does not repeat itself


def _synthetic_study() -> tuple[Measurement, list[Measurement]]:
    baseline = _measurement(SpecConfig(), T0)
    good = SpecConfig(method=Method.DRAFT_MODEL, model="good-draft", num_speculative_tokens=4)
    ngram = SpecConfig(method=Method.NGRAM, num_speculative_tokens=4, prompt_lookup_min=1, prompt_lookup_max=3)
    return baseline, [_measurement(good, _tpot(0.1, 4, GOOD), GOOD), _measurement(ngram, _tpot(0.05, 4, POOR), POOR)]


def test_a_measured_configuration_is_moved_from_its_mean_over_its_engines() -> None:
    spec = SpecConfig(method=Method.DRAFT_MODEL, model="good-draft", num_speculative_tokens=4)
    slow, fast = _measurement(spec, _tpot(0.3, 4, GOOD), GOOD), _measurement(spec, _tpot(0.1, 4, GOOD), GOOD)
    both = measured_prediction([slow, fast])
    assert both is not None and both.source == "measured"
    assert both.output_throughput.value == pytest.approx((slow.output_throughput + fast.output_throughput) / 2)
    assert both.tpot_ms.value == pytest.approx((slow.tpot_ms.median + fast.tpot_ms.median) / 2)
    assert both.value.low == both.value.value == both.value.high == both.output_throughput.value
    one = measured_prediction([slow])
    assert one is not None and one.value.value == pytest.approx(slow.output_throughput)
    assert both.mean_acceptance_length == pytest.approx(1 + sum(GOOD))
    # a baseline has no counters: nothing to move
    assert measured_prediction([_measurement(SpecConfig(), T0)]) is None


def test_ranking_puts_the_clearly_better_candidate_first() -> None:
    baseline, measured = _synthetic_study()
    cands = [SpecConfig(method=Method.NGRAM, num_speculative_tokens=k, prompt_lookup_min=1, prompt_lookup_max=3)
             for k in (1, 2, 3)]
    cands += [SpecConfig(method=Method.DRAFT_MODEL, model="good-draft", num_speculative_tokens=k) for k in (2, 3, 6)]
    cands += [SpecConfig(method=Method.EAGLE, model="head", num_speculative_tokens=3), SpecConfig()]
    preds = predict_candidates(cands, baseline, measured)
    by = {p.label: p for p in preds}
    assert len(preds) == 7  # the baseline is no candidate
    assert [p.value.value for p in preds] == sorted((p.value.value for p in preds), reverse=True)
    best = preds[0]
    assert best.spec.method is Method.DRAFT_MODEL and best.source == "truncation"
    # by hand: c = 0.1 fitted exactly, E = 1 + 0.9 + 0.8 + 0.5 at k = 3; 1 + 0.9 + 0.8 = 2.7 at k = 2 and
    # about 3.4 + 0.2 * 0.4 + 0.2 * 0.4^2 at k = 6 do not pay for their cost
    assert best.label == "draft_model k=3 (good-draft)"
    assert best.tpot_ms.value == pytest.approx(T0 * 1.3 / 3.2)
    assert best.output_throughput.value == pytest.approx(BASE_THROUGHPUT * 3.2 / 1.3)
    assert best.tpot_ms.low <= best.tpot_ms.value <= best.tpot_ms.high
    assert best.output_throughput.low <= best.output_throughput.value <= best.output_throughput.high
    assert best.mean_acceptance_length == pytest.approx(3.2) and best.acceptance_rate == pytest.approx(2.2 / 3)
    # n-gram on text that hardly repeats helps little; truncation from its k=4 trial
    for k in (1, 2, 3):
        p = by[f"ngram k={k} lookup=1..3"]
        assert p.source == "truncation" and p.cost_source == "fit"
        assert p.output_throughput.value < best.output_throughput.value
    ext = by["draft_model k=6 (good-draft)"]
    assert ext.source == "extrapolation"
    assert ext.tokens_per_step.low == pytest.approx(1 + sum(GOOD))
    assert ext.tokens_per_step.high == pytest.approx(1 + sum(GOOD) + 2 * GOOD[-1])
    assert ext.tokens_per_step.value == pytest.approx(3.4 + 0.2 * 0.4 + 0.2 * 0.4**2)
    prior = by["eagle k=3 (head)"]
    assert prior.source == "prior" and prior.cost_source == "prior"
    assert prior.tokens_per_step.value == pytest.approx(leviathan_expected_tokens(0.6, 3))
    # another objective, minimised: the same order for TPOT
    by_tpot = predict_candidates(cands, baseline, measured, objective="tpot_median_ms", maximize=False)
    assert [p.label for p in by_tpot] == [p.label for p in preds]
    assert by_tpot[0].value.value == pytest.approx(best.tpot_ms.value)


SPACE = """
methods:
  none: {}
  ngram:
    num_speculative_tokens: {low: 1, high: 4}
    prompt_lookup_max: 3
    prompt_lookup_min: 1
  draft_model:
    models: ["${draft}"]
    num_speculative_tokens: [2, 4]
"""


def _store_study(url: str, name: str, space: Path, measurements: list[Measurement], draft: str | None,
                 objective: str = "output_throughput") -> None:
    """A study as run_study leaves it: its config, trials with spec attributes, measurements."""
    import optuna

    from spectune.measurement import spec_key
    from spectune.storage import MeasurementStore, open_optuna_storage

    s = optuna.create_study(study_name=name, storage=open_optuna_storage(url),
                            directions=["maximize" if objective == "output_throughput" else "minimize"])
    s.set_user_attr("objectives", [objective])
    s.set_user_attr("spectune_config", {"target": "tgt", "draft": draft, "space": str(space),
                                        "workload": {"source": "synthetic.jsonl"}, "objectives": [objective]})
    store = MeasurementStore(url)
    for m in measurements:
        value = getattr(m, objective) if objective == "output_throughput" else m.tpot_ms.median
        spec = m.spec.to_vllm() or {"method": "none"}
        s.add_trial(optuna.trial.create_trial(value=value, user_attrs={
            "config": m.spec.label(), "spec": spec, "spec_key": spec_key(m.spec.to_vllm()), "feasible": True}))
        t = s.get_trials(deepcopy=False)[-1]
        store.record(study_name=name, trial_id=t._trial_id, trial_number=t.number,
                     spec_key=spec_key(m.spec.to_vllm()), measurement=m)


def test_predict_study_ranks_the_unmeasured_candidates_of_the_stored_space(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from spectune.cli import app
    from spectune.results import open_study


    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    url = f"sqlite:///{tmp_path / 'p.db'}"
    baseline, measured = _synthetic_study()
    _store_study(url, "synthetic", space, [baseline, *measured], draft="good-draft")
    preds = predict_study(open_study(url, "synthetic"))
    labels = [p.label for p in preds]
    # measured: none, draft_model k=4 and ngram k=4; the other four are predicted
    assert sorted(labels) == sorted(["ngram k=1 lookup=1..3", "ngram k=2 lookup=1..3", "ngram k=3 lookup=1..3",
                                     "draft_model k=2 (good-draft)"])
    assert labels[0] == "draft_model k=2 (good-draft)"  # the only good proposer
    assert {p.source for p in preds} == {"truncation"}  # no token ids in this baseline: nothing to replay

    result = CliRunner().invoke(app, ["predict", "--storage", url, "--study", "synthetic", "--top", "2"],
                                env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "truncation" in result.output
    assert [label in result.output for label in labels] == [True, True, False, False]  # the top 2
    assert "4 candidates not measured" in result.output


def test_predict_study_needs_a_baseline(tmp_path: Path) -> None:
    from spectune.errors import ConfigError
    from spectune.results import open_study

    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    url = f"sqlite:///{tmp_path / 'p.db'}"
    _, measured = _synthetic_study()
    _store_study(url, "no-base", space, measured, draft="good-draft")
    with pytest.raises(ConfigError, match="no completed baseline"):
        predict_study(open_study(url, "no-base"))


# -- replay against real engines ------------------------------------------------------------------------

K = 3


@pytest.fixture(scope="module")
def runs(swept_study) -> dict[str, Measurement]:  # noqa: ANN001
    """Two real engines at temperature 0, float32, on the same prompts: the baseline and n-gram k=3
    (the headline windows of the shared sweep study)."""
    from spectune.results import open_study

    cfg, _ = swept_study
    view = open_study(cfg.storage, "sweep")
    base, ngram = (view.store.measurement(r.trial_id) for r in view.complete())
    assert base is not None and ngram is not None and ngram.spec.num_speculative_tokens == K
    return {"baseline": base, "ngram": ngram}


@pytest.mark.engine
def test_ngram_replay_agrees_with_vllm_counters(runs: dict[str, Measurement]) -> None:
    from spectune.predict import replay_ngram

    base, ngram = runs["baseline"], runs["ngram"]
    # the premise: at temperature 0 speculation leaves the outputs alone
    assert [r.token_ids for r in ngram.requests] == [r.token_ids for r in base.requests]
    assert all(r.token_ids and r.prompt_token_ids for r in base.requests)
    measured = ngram.acceptance
    assert measured is not None and measured.num_drafts > 0
    rep = replay_ngram(base.requests, K, 1, 3, max_model_len=base.engine.max_model_len)
    counts = [round(p * measured.num_drafts) for p in measured.per_position]
    report = (f"measured drafts/draft tokens/accepted {measured.num_drafts}/{measured.num_draft_tokens}/"
              f"{measured.num_accepted_tokens} per position {counts}, rate {measured.acceptance_rate:.4f}; replay "
              f"{rep.num_drafts}/{rep.num_draft_tokens}/{rep.num_accepted_tokens} per position "
              f"{list(rep.accepted_per_pos)}, rate {rep.acceptance_rate:.4f}, {rep.num_truncated_drafts} drafts "
              f"reaching past max_tokens (positions {list(rep.truncated_per_pos)})")
    # Exact: the same drafts at the same steps. The only freedom: a draft that runs past the recorded
    # output (max_tokens) was compared by the engine with tokens it then cut off; the replay cannot
    # see them, so the engine's counts lie between the replay's and the replay's plus those positions.
    assert (rep.num_drafts, rep.num_draft_tokens) == (measured.num_drafts, measured.num_draft_tokens), report
    assert rep.num_accepted_tokens <= measured.num_accepted_tokens <= rep.num_accepted_tokens + sum(
        rep.truncated_per_pos), report
    for i, c in enumerate(counts):
        assert rep.accepted_per_pos[i] <= c <= rep.accepted_per_pos[i] + rep.truncated_per_pos[i], report
    # in rates: within the share of drafted tokens that were cut off
    tolerance = sum(rep.truncated_per_pos) / rep.num_draft_tokens
    assert abs(rep.acceptance_rate - measured.acceptance_rate) <= tolerance + 1e-12, report
    assert tolerance <= 0.05, report
    for a, b in zip(rep.per_position, measured.per_position, strict=True):
        assert abs(a - b) <= tolerance * K + 1e-12, report


@pytest.mark.engine
def test_predict_study_replays_ngram_over_the_real_baseline(runs: dict[str, Measurement], tmp_path: Path) -> None:
    from spectune.results import open_study

    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    url = f"sqlite:///{tmp_path / 'real.db'}"
    _store_study(url, "real", space, [runs["baseline"], runs["ngram"]], draft=None)
    preds = predict_study(open_study(url, "real"))
    by = {p.label: p for p in preds}
    assert sorted(by) == ["ngram k=1 lookup=1..3", "ngram k=2 lookup=1..3", "ngram k=4 lookup=1..3"]
    assert {p.source for p in preds} == {"replay"}
    assert {p.cost_source for p in preds} == {"fit"}  # c fitted on the measured k=3 trial
    for p in preds:
        assert p.tokens_per_step.low == p.tokens_per_step.value == p.tokens_per_step.high
        assert 0 < p.output_throughput.low <= p.output_throughput.value <= p.output_throughput.high
        assert math.isfinite(p.value.value)
        assert p.note.endswith(f"over {len(runs['baseline'].requests)} requests")


@pytest.fixture(scope="module")
def draft_run(tiny_models, repetitive_prompts: Path, tmp_path_factory: pytest.TempPathFactory) -> Measurement:
    """A real engine of the tiny target drafting k=3 with the tiny draft (float32, temperature 0)."""
    from spectune.trial import measure
    from spectune.workloads import load_prompts

    wl = WorkloadSpec.model_validate({"source": str(repetitive_prompts), "num_prompts": 6, "concurrency": 2,
                                      "sampling": {"max_tokens": 48, "temperature": 0.0}})
    spec = SpecConfig(method=Method.DRAFT_MODEL, model=str(tiny_models.draft), num_speculative_tokens=K)
    return measure(tiny_engine_args(tiny_models.target), spec, wl, load_prompts(wl),
                   log_dir=tmp_path_factory.mktemp("draft-run"), startup_timeout=300)


@pytest.mark.engine
def test_draft_replay_agrees_with_vllm_counters(draft_run: Measurement, tiny_models) -> None:  # noqa: ANN001
    """The draft run offline (transformers, float32) along the outputs drafts what vLLM's draft
    proposer drafted: at temperature 0 the outputs are the target's own whatever the draft."""
    from spectune.predict import draft_guesses, replay_draft

    measured = draft_run.acceptance
    assert measured is not None and measured.num_drafts > 0
    assert all(r.token_ids and r.prompt_token_ids for r in draft_run.requests)
    guesses = draft_guesses(draft_run.requests, str(tiny_models.draft), dtype=draft_run.engine.dtype)
    rep = replay_draft(guesses, K, max_model_len=draft_run.engine.max_model_len)
    counts = [round(p * measured.num_drafts) for p in measured.per_position]
    report = (f"measured drafts/draft tokens/accepted {measured.num_drafts}/{measured.num_draft_tokens}/"
              f"{measured.num_accepted_tokens} per position {counts}; replay {rep.num_drafts}/{rep.num_draft_tokens}/"
              f"{rep.num_accepted_tokens} per position {list(rep.accepted_per_pos)}, cut off {list(rep.truncated_per_pos)}")
    # a model draft drafts k tokens at every decode step: the same steps, so the same drafts (a near
    # tie between the draft's top tokens falling the other way in the engine would move a step: 1 %)
    assert abs(rep.num_drafts - measured.num_drafts) <= 0.01 * measured.num_drafts, report
    assert rep.num_draft_tokens == K * rep.num_drafts and measured.num_draft_tokens == K * measured.num_drafts
    # the engine compared the positions max_tokens cut off with tokens the replay cannot see
    slack = 0.01 * measured.num_drafts
    for i, c in enumerate(counts):
        assert rep.accepted_per_pos[i] - slack <= c <= rep.accepted_per_pos[i] + rep.truncated_per_pos[i] + slack, report
    # what predictions read: those positions counted as likely accepted, within 1 % of vLLM's length
    predicted = rep.profile().mean_acceptance_length
    assert abs(predicted / measured.mean_acceptance_length - 1) < 0.01, (predicted, report)
