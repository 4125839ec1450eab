"""How far predictions miss on a study's own measured configurations (leave-one-out)."""

from __future__ import annotations

import pytest
from synthetic import GOOD, T0, modelled_tpot, synthetic_measurement

from spectune.config import Method, SpecConfig
from spectune.predict import StudyInputs


def _draft(k: int, slower: float = 1.0):  # noqa: ANN202
    spec = SpecConfig(method=Method.DRAFT_MODEL, model="good-draft", num_speculative_tokens=k)
    return synthetic_measurement(spec, modelled_tpot(0.1, k, GOOD[:k]) * slower, GOOD[:k])


def _inputs(measured) -> StudyInputs:  # noqa: ANN001
    return StudyInputs([], synthetic_measurement(SpecConfig(), T0), measured, "output_throughput", True, {}, None)


def test_a_consistent_study_is_predicted_within_a_few_percent_of_what_it_measured() -> None:
    errors = _inputs([_draft(2), _draft(3), _draft(4)]).errors()
    assert errors is not None
    assert {e.n for e in errors.figures.values()} == {3}
    assert errors.figures["mean_acceptance_length"].median < 0.01  # truncated from k=4 (k=4: extrapolated from k=3)
    assert errors.figures["value"].median < 0.03
    assert "3 measured configurations" in errors.line() and "output_throughput off by" in errors.line()
    record = errors.record()
    assert [c["config"] for c in record["configs"]] == [f"draft_model k={k} (good-draft)" for k in (2, 3, 4)]


def test_a_configuration_its_neighbours_do_not_explain_shows_in_the_error() -> None:
    errors = _inputs([_draft(2), _draft(3, slower=1.3), _draft(4)]).errors()
    assert errors is not None
    assert errors.figures["value"].max > 0.15  # k=3 ran 30 % slower than its neighbours' cost says
    assert errors.figures["mean_acceptance_length"].median < 0.01  # acceptance does not depend on speed
    one = _inputs([_draft(4)]).errors()  # one configuration: predicted from the priors alone
    assert one is not None and one.figures["value"].n == 1


def test_no_speculative_configuration_measured_means_no_error_to_report() -> None:
    assert _inputs([]).errors() is None
    with pytest.raises(KeyError):
        _inputs([_draft(2)]).errors().figures["throughput"]  # type: ignore[union-attr]
