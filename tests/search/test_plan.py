"""Guided search's plan: which candidate next, and when the rest is not worth measuring."""

from __future__ import annotations

import math

import pytest

from spectune.config import Method, SpecConfig
from spectune.predict import (
    Estimate,
    Prediction,
    plan_next,
    surprising,
)


def _pred(label: str, value: float, low: float, high: float) -> Prediction:
    spec = SpecConfig(method=Method.NGRAM, num_speculative_tokens=int(label[1:]))
    e = Estimate(value, low, high)
    return Prediction(label=label, spec=spec, source="replay", acceptance_rate=0.5, mean_acceptance_length=1.5,
                      tokens_per_step=e, tpot_ms=e, output_throughput=e, objective="output_throughput",
                      value=e, cost_source="fit")


def test_plan_skips_the_clearly_worse_and_alternates_promising_and_uncertain() -> None:
    ranking = [_pred("k1", 120, 115, 125), _pred("k2", 110, 60, 160), _pred("k3", 95, 90, 101.5)]
    first = plan_next(ranking, best=100.0, step=0)
    assert first.pick is not None and first.pick.label == "k1" and first.reason == "promising"
    assert [p.label for p in first.skipped] == ["k3"]  # 101.5 does not beat 100 by 2%
    second = plan_next(ranking, best=100.0, step=1)
    assert second.pick is not None and second.pick.label == "k2" and second.reason == "uncertain"
    # once the best measured is 125, nothing but the wide one could beat it
    third = plan_next(ranking, best=125.0, step=2)
    assert third.pick is not None and third.pick.label == "k2" and third.reason == "promising"
    assert plan_next(ranking, best=160.0, step=3).pick is None
    assert not plan_next([], best=1.0)


def test_a_contested_lead_takes_the_most_promising_whatever_the_step() -> None:
    ranking = [_pred("k1", 120, 115, 125), _pred("k2", 110, 60, 160)]
    assert plan_next(ranking, best=100.0, step=1).reason == "uncertain"
    contested = plan_next(ranking, best=100.0, step=1, contested=True)
    assert contested.pick is not None and contested.pick.label == "k1" and contested.reason == "promising"


def test_plan_minimising_uses_the_low_end() -> None:
    ranking = [_pred("k1", 50, 45, 55), _pred("k2", 60, 57, 63)]
    plan = plan_next(ranking, best=58.0, maximize=False, step=1)
    assert plan.pick is not None and plan.pick.label == "k1"
    assert [p.label for p in plan.skipped] == ["k2"]  # 57 is not below 58 by 2%


def test_plan_takes_the_promising_one_when_nothing_is_uncertain() -> None:
    ranking = [_pred("k1", 120, 119.9, 120.1), _pred("k2", 110, 109.9, 110.1)]
    plan = plan_next(ranking, best=100.0, step=1)
    assert plan.pick is not None and plan.pick.label == "k1" and plan.reason == "promising"


def test_a_measurement_is_surprising_outside_its_interval_beyond_the_margin() -> None:
    assert not surprising(90.0, 110.0, 100.0)
    assert not surprising(90.0, 110.0, 89.0) and not surprising(90.0, 110.0, 112.0)  # within 2% of an end
    assert surprising(90.0, 110.0, 88.0) and surprising(90.0, 110.0, 112.5)
    assert surprising(90.0, 110.0, 95.0, margin=-0.1)


def test_the_chance_to_beat_the_pick_by_the_tolerance_is_a_normal_tail() -> None:
    from spectune.predict import chance_to_beat

    # a candidate predicted exactly at the pick's value plus the tolerance: an even chance
    assert chance_to_beat(110.0, 5.0, 100.0, 0.0, tolerance=0.1) == pytest.approx(0.5)
    # 1.645 standard deviations below it: 5 %
    assert chance_to_beat(110.0 - 1.645 * 5.0, 5.0, 100.0, 0.0, tolerance=0.1) == pytest.approx(0.05, abs=1e-3)
    # the pick's own uncertainty raises a weaker candidate's chance; a larger tolerance lowers it
    low = chance_to_beat(95.0, 3.0, 100.0, 0.0, tolerance=0.02)
    assert chance_to_beat(95.0, 3.0, 100.0, 5.0, tolerance=0.02) > low > chance_to_beat(95.0, 3.0, 100.0, 0.0,
                                                                                         tolerance=0.1)
    # minimising: below the pick by the tolerance
    assert chance_to_beat(80.0, 1.0, 100.0, 0.0, tolerance=0.1, maximize=False) > 0.99
    assert chance_to_beat(95.0, 1.0, 100.0, 0.0, tolerance=0.1, maximize=False) < 0.01
    # nothing feasible measured yet: anything could beat it; exact predictions decide outright
    assert chance_to_beat(1.0, 0.0, -math.inf, 0.0, tolerance=0.02) == 1.0
    assert chance_to_beat(103.0, 0.0, 100.0, 0.0, tolerance=0.02) == 1.0
    assert chance_to_beat(101.0, 0.0, 100.0, 0.0, tolerance=0.02) == 0.0


def test_against_the_pick_a_candidate_is_measured_only_with_more_than_the_stop_chance() -> None:
    # predictions' optimistic ends are two standard deviations above their values
    ranking = [_pred("k1", 104, 96, 112), _pred("k2", 90, 70, 110), _pred("k3", 80, 78, 82)]
    plan = plan_next(ranking, pick=100.0, pick_sd=0.0, margin=0.05, step=0)
    # k1: 105 is 0.25 sd above 104, about 40 %; k2: 105 is 1.5 sd above 90, about 7 %; k3: none
    assert plan.chances["k1"] == pytest.approx(0.401, abs=0.01)
    assert plan.chances["k2"] == pytest.approx(0.067, abs=0.01) and plan.chances["k3"] < 1e-6
    assert [p.label for p in plan.candidates] == ["k1", "k2"] and [p.label for p in plan.skipped] == ["k3"]
    assert plan.pick is not None and plan.pick.label == "k1"
    # a larger tolerance leaves k2 below 5 %; the pick's own uncertainty lifts it again
    assert [p.label for p in plan_next(ranking, pick=100.0, margin=0.08).skipped] == ["k2", "k3"]
    assert [p.label for p in plan_next(ranking, pick=100.0, pick_sd=6.0, margin=0.08).skipped] == ["k3"]
    # nothing left with more than 5 %: stop
    assert plan_next(ranking, pick=130.0, margin=0.02).pick is None
    with pytest.raises(ValueError):
        plan_next(ranking)
