"""Choosing what to deploy: SLOs, noise band, baseline fallback (no engine: synthetic trials)."""

from __future__ import annotations

import math

import datetime as dt

import optuna
import pytest

from spectune.config import EngineArgs, SpecConfig, WorkloadSpec
from spectune.load import LoadResult, RequestRecord
from spectune.measurement import SLO, Measurement, Objective
from spectune.results import StudyView, pooled_spread
from spectune.storage import MeasurementStore
from spectune.trial import summarize


def _study(trials: list[tuple[str, float, float | None, bool]]) -> StudyView:
    """(label, throughput, noise, feasible) per trial; the first is the baseline."""
    study = optuna.create_study(direction="maximize", study_name="s")
    study.set_user_attr("objectives", ["output_throughput"])
    base = trials[0][1]
    for i, (label, value, noise, feasible) in enumerate(trials):  # each trial a configuration of its own
        spec = {"method": "none"} if label == "none" else {"method": "ngram", "num_speculative_tokens": i}
        study.add_trial(optuna.trial.create_trial(
            value=value, params={}, distributions={},
            user_attrs={"config": label, "spec": spec, "speedup": value / base, "noise": noise, "feasible": feasible},
        ))
    return StudyView(study, MeasurementStore("sqlite:///:memory:"), "sqlite:///:memory:")


def test_a_config_that_breaks_the_slo_never_wins() -> None:
    view = _study([("none", 10.0, 0.01, True), ("fast but late", 20.0, 0.01, False), ("ngram k=2", 13.0, 0.01, True)])
    choice = view.best()
    assert choice.row.label == "ngram k=2" and not choice.is_baseline


def test_within_the_noise_band_the_baseline_is_exported_and_said_so() -> None:
    view = _study([("none", 10.0, 0.02, True), ("ngram k=2", 10.3, 0.02, True)])
    choice = view.best()
    assert choice.is_baseline and choice.row.label == "none"
    assert "within the noise band" in choice.reason and choice.noise_band == pytest.approx(0.04)
    clear = _study([("none", 10.0, 0.02, True), ("ngram k=2", 12.0, 0.02, True)]).best()
    assert not clear.is_baseline and "1.20x" in clear.reason


def test_one_window_uses_the_noise_floor() -> None:
    choice = _study([("none", 10.0, None, True), ("ngram k=2", 10.3, None, True)]).best()
    assert choice.is_baseline and choice.noise_band == pytest.approx(0.04)


def test_nothing_better_than_the_baseline() -> None:
    choice = _study([("none", 10.0, 0.01, True), ("ngram k=2", 8.0, 0.01, True)]).best()
    assert choice.is_baseline and "no speculative configuration" in choice.reason


def _measurement(ttfts: list[float], e2els: list[float], tokens: int):  # noqa: ANN202
    records = [RequestRecord(prompt_id=str(i), ok=True, ttft=t, e2el=e, output_tokens=tokens, prompt_tokens=5)
               for i, (t, e) in enumerate(zip(ttfts, e2els, strict=True))]
    result = LoadResult(records=records, duration=sum(e2els), concurrency=1)
    return summarize([result], spec=SpecConfig(), engine=EngineArgs(model="m"),
                     workload=WorkloadSpec(source="x"), acceptance=None, command=[], log_path=None,
                     started_at=dt.datetime.now(dt.timezone.utc), startup_seconds=1.0, peak_memory_bytes=None)


def test_slo_violations_are_optuna_constraints() -> None:
    m = _measurement([0.1, 0.2, 0.3], [1.0, 1.0, 1.0], 11)
    assert Objective.TPOT_MEDIAN.of(m) == pytest.approx((1.0 - 0.2) / 10 * 1000)
    v = SLO(ttft_p99_ms=250, tpot_median_ms=100, min_output_throughput=5).violations(m)
    assert v["ttft_p99_ms"] > 0  # p99 TTFT near 300 ms breaks 250 ms
    assert v["tpot_median_ms"] == pytest.approx(80 - 100)
    assert v["min_output_throughput"] == pytest.approx(5 - 33 / 3.0)
    assert SLO().violations(m) == {}


def test_tokens_delivered_in_a_burst_are_told_by_the_engine_cores_own_timing() -> None:
    from spectune.measurement import EngineTimingStats

    # 11 tokens a request: the client saw the first at 0.9 s of 1.0, the ten gaps after it 10 ms each
    m = _measurement([0.9, 0.9], [1.0, 1.0], 11)
    assert m.bursty_delivery is None  # without the engine's timing nothing tells
    steady = m.model_copy(update={"engine_timing": EngineTimingStats(requests=2, prefill_ms=20.0, tpot_ms=12.0)})
    assert steady.bursty_delivery is False
    # the engine core spent 90 ms per token: the tokens waited and came at once
    burst = m.model_copy(update={"engine_timing": EngineTimingStats(requests=2, prefill_ms=20.0, tpot_ms=90.0)})
    assert burst.bursty_delivery is True
    # the trial's record carries it to what show and the report say beside the figures
    from spectune.objective import headline

    study = optuna.create_study(direction="maximize", study_name="burst")
    for label, measured in (("none", steady), ("ngram k=2", burst)):
        spec = {"method": "none"} if label == "none" else {"method": "ngram", "num_speculative_tokens": 2}
        attrs = {**headline(measured).model_dump(exclude_none=True), "config": label, "spec": spec}
        study.add_trial(optuna.trial.create_trial(value=measured.output_throughput, params={}, distributions={},
                                                  user_attrs=attrs))
    rows = {r.label: r for r in StudyView(study, MeasurementStore("sqlite:///:memory:"), "sqlite:///:memory:").rows}
    assert rows["none"].note == ""
    assert "tokens reached the client in bursts" in rows["ngram k=2"].note


def test_two_objectives_choose_from_the_feasible_pareto_front() -> None:
    study = optuna.create_study(directions=["maximize", "minimize"], study_name="pareto")
    study.set_user_attr("objectives", ["output_throughput", "tpot_median_ms"])
    rows = [("none", 10.0, 50.0, True), ("dominated", 11.0, 60.0, True), ("fast", 14.0, 45.0, True),
            ("faster but breaks the SLO", 20.0, 30.0, False), ("low latency", 12.0, 20.0, True)]
    for i, (label, tput, tpot, feasible) in enumerate(rows):
        spec = {"method": "none"} if label == "none" else {"method": "ngram", "num_speculative_tokens": i}
        study.add_trial(optuna.trial.create_trial(
            values=[tput, tpot], params={}, distributions={},
            user_attrs={"config": label, "spec": spec, "speedup": tput / 10.0, "noise": 0.01, "feasible": feasible},
            system_attrs={} if feasible else {"constraints": [1.0]},
        ))
    view = StudyView(study, MeasurementStore("sqlite:///:memory:"), "sqlite:///:memory:")
    choice = view.best()
    assert choice.row.label == "fast"  # on the front, feasible, best first objective


def test_memory_limits_are_constraints_relative_to_the_limit_and_named_when_broken() -> None:
    m = _measurement([0.1], [1.0], 11).model_copy(update={"peak_memory_bytes": 3 * 2**30, "kv_cache_tokens": 8000})
    v = SLO(max_memory="2GiB", min_kv_cache_tokens=10_000).violations(m)
    assert v == {"max_memory": pytest.approx(0.5), "min_kv_cache_tokens": pytest.approx(0.2)}
    assert SLO(max_memory="4GiB", min_kv_cache_tokens=4000).violations(m) == {
        "max_memory": pytest.approx(-0.25), "min_kv_cache_tokens": pytest.approx(-1.0)}
    unknown = m.model_copy(update={"kv_cache_tokens": None})  # an engine without the gauge: not checked
    assert SLO(min_kv_cache_tokens=10_000).violations(unknown) == {}
    study = optuna.create_study(direction="maximize", study_name="mem")
    study.set_user_attr("objectives", ["output_throughput"])
    for label, value, constraints in (("none", 10.0, {"max_memory": -0.1}), ("ngram k=4", 20.0, {"max_memory": 0.5})):
        spec = {"method": "none"} if label == "none" else {"method": "ngram", "num_speculative_tokens": 4}
        study.add_trial(optuna.trial.create_trial(value=value, params={}, distributions={}, user_attrs={
            "config": label, "spec": spec, "noise": 0.01, "feasible": max(constraints.values()) <= 0,
            "constraints": constraints, "peak_memory_bytes": 3 * 2**30, "memory_kind": "gpu"}))
    view = StudyView(study, MeasurementStore("sqlite:///:memory:"), "sqlite:///:memory:")
    fast = next(r for r in view.rows if r.label == "ngram k=4")
    assert fast.note == "breaks max_memory" and fast.memory == "3.00 GiB"
    choice = view.best()  # faster, but it does not fit: never chosen, and said so
    assert choice.is_baseline and "(1 that did break max_memory)" in choice.reason


def test_the_engines_spread_pools_each_configurations_variance_by_its_degrees_of_freedom() -> None:
    # (1, 1) has none; (1, 3) a variance of 2 over a squared mean of 4; (2,) one engine, no say;
    # (4, 4, 4) none with two degrees of freedom: sqrt(0.5 / 4), not the mean of the spreads
    assert pooled_spread([[1.0, 1.0], [1.0, 3.0], [2.0], [4.0, 4.0, 4.0]]) == pytest.approx((0.5 / 4) ** 0.5)
    assert pooled_spread([[2.0], []]) is None


def _paired_study(tmp_path, base_e2els: list[list[float]], fast_e2els: list[list[float]]) -> StudyView:  # noqa: ANN001
    """A baseline and one n-gram configuration, each measured on one engine per list of per-prompt
    end-to-end latencies (prompts 0..n-1, 11 tokens each), stored as a study keeps them."""
    from spectune.measurement import spec_key
    from spectune.storage import open_optuna_storage

    url = f"sqlite:///{tmp_path}/paired.db"
    study = optuna.create_study(direction="maximize", study_name="paired", storage=open_optuna_storage(url))
    study.set_user_attr("objectives", ["output_throughput"])
    store = MeasurementStore(url)
    ngram = SpecConfig(method="ngram", num_speculative_tokens=4, prompt_lookup_min=1, prompt_lookup_max=3)
    for spec, runs in ((SpecConfig(), base_e2els), (ngram, fast_e2els)):
        for e2els in runs:
            m = _measurement([0.05] * len(e2els), e2els, 11).model_copy(update={"spec": spec})
            half = len(e2els) // 2  # two windows of different prompts
            windows = [m.windows[0].model_copy(update={"output_throughput": 11 * len(w) / sum(w)})
                       for w in (e2els[:half], e2els[half:])]
            m = m.model_copy(update={"windows": windows, "output_throughput": sum(w.output_throughput for w in windows) / 2})
            study.add_trial(optuna.trial.create_trial(value=m.output_throughput, user_attrs={
                "config": spec.label(), "spec": spec.to_vllm() or {"method": "none"},
                "spec_key": spec_key(spec.to_vllm()), "feasible": True,
                "noise": abs(windows[0].output_throughput - windows[1].output_throughput) / 2 / m.output_throughput}))
            t = study.get_trials(deepcopy=False)[-1]
            store.record(study_name="paired", trial_id=t._trial_id, trial_number=t.number,
                         spec_key=spec_key(spec.to_vllm()), measurement=m)
    return StudyView(optuna.load_study(study_name="paired", storage=open_optuna_storage(url)), store, url)


def test_the_band_pairs_prompts_so_that_their_variety_cancels(tmp_path) -> None:  # noqa: ANN001
    from spectune.results import BAND_Z, PRIOR_ENGINE_SPREAD

    # slow prompts in the first window, fast ones in the second: the windows differ by 3x, yet
    # the configuration is 2x faster on every prompt, within 2 %
    base = [1.0, 1.2, 1.1, 0.9, 0.3, 0.35, 0.4, 0.33]
    gain = [2.0, 2.02, 1.98, 2.0, 1.99, 2.01, 2.0, 1.97]
    view = _paired_study(tmp_path, [base], [[e / g for e, g in zip(base, gain, strict=True)]])
    choice = view.best()
    assert choice.band_kind == "paired band" and not choice.is_baseline
    rows = {r.label: r for r in view.complete()}
    windows = rows["none"].noise + rows[choice.row.label].noise  # the windows' noise: 3x apart
    assert windows > 0.5 and choice.noise_band < windows
    # one engine each, nothing measured twice: the engine starts are as uncertain as the prior says
    floor = BAND_Z * PRIOR_ENGINE_SPREAD * 2 ** 0.5
    assert floor < choice.noise_band < floor * 1.01
    assert choice.spread is not None and choice.spread.source == "prior" and choice.engine_spread is None
    # the band is a half-width on the log of the gain: the interval the reason states
    low, high = choice.interval
    assert low == pytest.approx(choice.speedup * math.exp(-choice.noise_band))
    assert high == pytest.approx(choice.speedup * math.exp(choice.noise_band))
    assert f"{choice.speedup:.2f}x, {low:.2f}-{high:.2f}x the baseline" in choice.reason and low > 1.0


def test_a_gain_is_kept_only_where_its_interval_clears_the_baseline(tmp_path) -> None:  # noqa: ANN001
    from spectune.results import BAND_Z, PRIOR_ENGINE_SPREAD

    # 1.55x on every prompt: past the band's half-width as a linear gain (0.55 > 0.50), but its
    # interval on the log reaches below 1 (ln 1.55 = 0.44): the baseline is kept
    base = [1.0, 1.2, 1.1, 0.9, 0.3, 0.35, 0.4, 0.33]
    view = _paired_study(tmp_path, [base], [[e / 1.55 for e in base]])
    choice = view.best()
    band = BAND_Z * PRIOR_ENGINE_SPREAD * 2 ** 0.5
    assert choice.noise_band == pytest.approx(band, rel=0.01) and 0.55 > band > math.log(1.55)
    assert choice.is_baseline and choice.within_band and "within the paired band" in choice.reason


def test_the_paired_band_widens_with_what_the_prompts_disagree_on_and_with_the_engines(tmp_path) -> None:  # noqa: ANN001
    import math
    import statistics

    from spectune.results import BAND_Z

    base = [1.0, 1.2, 1.1, 0.9, 0.3, 0.35, 0.4, 0.33]
    gain = [2.0, 0.9, 1.5, 1.1, 1.8, 0.8, 1.4, 1.3]  # speculation helps some prompts, slows others
    fast = [e / g for e, g in zip(base, gain, strict=True)]
    # two engines each, the second 20 % slower on every prompt
    view = _paired_study(tmp_path, [base, [e * 1.2 for e in base]], [fast, [e * 1.2 for e in fast]])
    choice = view.best()
    spread = choice.engine_spread
    assert spread is not None and spread > 0.1
    se = statistics.stdev(math.log(g) for g in gain) / math.sqrt(len(gain))
    assert choice.noise_band == pytest.approx(BAND_Z * math.sqrt(se ** 2 + spread ** 2 / 2 + spread ** 2 / 2))
    # the gain (1.29x by the windows) is within it: the baseline is kept, and the reason says why
    assert choice.is_baseline and "within the paired band" in choice.reason


def test_when_nothing_beats_the_baseline_its_band_is_that_of_the_gap_to_the_runner_up(tmp_path) -> None:  # noqa: ANN001
    from spectune.results import BAND_Z, PRIOR_ENGINE_SPREAD

    base = [1.0, 1.2, 1.1, 0.9, 0.3, 0.35, 0.4, 0.33]
    view = _paired_study(tmp_path, [base], [[e * 1.1 for e in base]])  # 10 % slower on every prompt
    choice = view.best()
    assert choice.is_baseline and "no speculative configuration measured better" in choice.reason
    assert choice.band_kind == "paired band"
    assert choice.noise_band == pytest.approx(BAND_Z * PRIOR_ENGINE_SPREAD * 2 ** 0.5, rel=0.01)


def test_over_a_load_mix_the_band_pairs_each_levels_own_prompts_weighted() -> None:
    import math
    import statistics

    from spectune.results import paired_gap_error
    from spectune.trial import level_stats

    mix = WorkloadSpec(source="x", concurrency_levels=[1, 4], level_weights=[3, 1])

    def measured(head: list[float], busy: list[float], kept: bool = True) -> Measurement:
        m = _measurement([0.05] * len(head), head, 11)
        records = [RequestRecord(prompt_id=f"b{i}", ok=True, ttft=0.05, e2el=e, output_tokens=11, prompt_tokens=5)
                   for i, e in enumerate(busy)]
        level = level_stats(4, LoadResult(records=records, duration=sum(busy), concurrency=4), None)
        assert [r.text for r in level.requests] == [""] * len(busy)  # kept without texts and token ids
        if not kept:  # stored before levels kept their requests
            level = level.model_copy(update={"requests": []})
        return m.model_copy(update={"workload": mix, "levels": [m.level_at(1), level]})

    head = [1.0, 1.2, 1.1, 0.9, 0.3, 0.35]
    busy = [2.0, 2.4, 1.8, 2.2, 2.6, 1.9]
    gain_head = [1.5, 1.4, 1.6, 1.5, 1.45, 1.55]
    gain_busy = [1.0, 1.3, 0.8, 1.1, 0.9, 1.2]  # the busy level's prompts disagree more
    a = measured([e / g for e, g in zip(head, gain_head, strict=True)], [e / g for e, g in zip(busy, gain_busy, strict=True)])
    b = measured(head, busy)
    objective = Objective.OUTPUT_THROUGHPUT

    def se(gains: list[float]) -> float:
        return statistics.stdev(math.log(g) for g in gains) / math.sqrt(len(gains))

    error, over_mix = paired_gap_error([a], [b], objective)  # type: ignore[misc]
    assert over_mix and error == pytest.approx(math.hypot(0.75 * se(gain_head), 0.25 * se(gain_busy)))
    old = measured(head, busy, kept=False)  # a level without its requests: the headline level's alone
    assert paired_gap_error([a], [old], objective) == (pytest.approx(se(gain_head)), False)
    single = [m.model_copy(update={"workload": WorkloadSpec(source="x"), "levels": []}) for m in (a, b)]
    assert paired_gap_error(single[:1], single[1:], objective) == (pytest.approx(se(gain_head)), False)
