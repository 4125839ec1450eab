"""Ranking candidates over synthetic measurements, and predict_study over a stored study's space."""

from __future__ import annotations

from pathlib import Path

import pytest
from synthetic import (
    BASE_THROUGHPUT,
    GOOD,
    SPACE,
    T0,
    modelled_tpot,
    store_study,
    synthetic_measurement,
    synthetic_study,
)

from spectune.config import Method, SpecConfig
from spectune.predict import (
    leviathan_expected_tokens,
    measured_prediction,
    predict_candidates,
)
from spectune.search import predict_study


def test_a_measured_configuration_is_moved_from_its_mean_over_its_engines() -> None:
    spec = SpecConfig(method=Method.DRAFT_MODEL, model="good-draft", num_speculative_tokens=4)
    slow, fast = synthetic_measurement(spec, modelled_tpot(0.3, 4, GOOD), GOOD), synthetic_measurement(spec, modelled_tpot(0.1, 4, GOOD), GOOD)
    both = measured_prediction([slow, fast])
    assert both is not None and both.source == "measured"
    assert both.output_throughput.value == pytest.approx((slow.output_throughput + fast.output_throughput) / 2)
    assert both.tpot_ms.value == pytest.approx((slow.tpot_ms.median + fast.tpot_ms.median) / 2)
    assert both.value.low == both.value.value == both.value.high == both.output_throughput.value
    one = measured_prediction([slow])
    assert one is not None and one.value.value == pytest.approx(slow.output_throughput)
    assert both.mean_acceptance_length == pytest.approx(1 + sum(GOOD))
    # a baseline has no counters: nothing to move
    assert measured_prediction([synthetic_measurement(SpecConfig(), T0)]) is None


def test_ranking_puts_the_clearly_better_candidate_first() -> None:
    baseline, measured = synthetic_study()
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


def test_predict_study_ranks_the_unmeasured_candidates_of_the_stored_space(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from spectune.cli import app
    from spectune.results import open_study


    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    url = f"sqlite:///{tmp_path / 'p.db'}"
    baseline, measured = synthetic_study()
    store_study(url, "synthetic", space, [baseline, *measured], draft="good-draft")
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
    _, measured = synthetic_study()
    store_study(url, "no-base", space, measured, draft="good-draft")
    with pytest.raises(ConfigError, match="no completed baseline"):
        predict_study(open_study(url, "no-base"))
