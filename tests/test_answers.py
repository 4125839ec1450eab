"""Answers held against the baseline's: the comparison, its classification and the rule (no engine)."""

from __future__ import annotations

import pytest

from spectune.answers import ROUNDING_MARGIN, AnswerRule, compare, rounding_margin
from spectune.config import EngineArgs, Sampling, SpecConfig
from spectune.measurement import AnswerMargins, PromptMargins, RequestSample
from tests.predict.synthetic import synthetic_measurement

BASE = {"a": [1, 2, 3, 4, 5], "b": [7, 8, 9], "c": [4, 4, 4, 4], "d": [5, 6]}
MARGINS = {"a": [3.0, 2.5, 1e-6, 4.0, 1.0], "b": [2.0, 0.3, 5.0], "c": [1.0, 1.0, 1.0, 1.0], "d": [9.0, 9.0]}


def answers(outputs: dict[str, list[int] | None], spec: SpecConfig | None = None, dtype: str = "float32",
            margins: dict[str, list[float]] | None = None, again: dict[str, list[int]] | None = None,
            temperature: float = 0.0):  # noqa: ANN201
    requests = [RequestSample(prompt_id=p, ok=ids is not None, token_ids=ids, output_tokens=len(ids or []))
                for p, ids in outputs.items()]
    m = synthetic_measurement(spec or SpecConfig(method="none"), 10.0, requests=requests)
    m.engine = EngineArgs(model="tgt", dtype=dtype)
    m.workload = m.workload.model_copy(update={"sampling": Sampling(temperature=temperature)})
    if margins is not None:
        ids = {**BASE, **(again or {})}
        m.answer_margins = AnswerMargins(seconds=1.0, window_seconds=2.0, requests={
            p: PromptMargins(token_ids=ids[p], margins=g) for p, g in margins.items()})
    return m


NGRAM = SpecConfig(method="ngram", num_speculative_tokens=3, prompt_lookup_max=3)


def test_identical_answers_are_counted_and_keep_every_rule() -> None:
    f = compare(answers(BASE, margins=MARGINS), answers(BASE, NGRAM))
    assert (f.compared, f.identical, f.rounding, f.changed, f.first, f.first_difference_median) == (4, 4, 0, 0, None, None)
    assert f.label == "same 4/4" and all(f.broken(rule) == 0 for rule in AnswerRule)


def test_a_difference_at_a_near_tie_is_rounding_elsewhere_changed() -> None:
    trial = {**BASE, "a": [1, 2, 99, 4, 5], "b": [7, 99, 9]}  # a at a near-tie (1e-6), b at a margin of 0.3
    f = compare(answers(BASE, margins=MARGINS), answers(trial, NGRAM))  # float32: margin 0.02
    assert (f.identical, f.rounding, f.changed, f.first_difference_median) == (2, 1, 1, 1.5)
    assert (f.first.prompt_id, f.first.token, f.first.kind, f.first.margin) == ("b", 1, "changed", 0.3)
    assert f.broken(AnswerRule.ROUNDING) == 1 and f.broken(AnswerRule.IDENTICAL) == 2 and f.broken(AnswerRule.OFF) == 0
    line = f.refusal("ngram k=3", AnswerRule.ROUNDING)
    assert line == ("ngram k=3: 1 of 4 answers changed beyond rounding; first changed: prompt b at output token 1 "
                    f"(the baseline's margin there 0.3 > {ROUNDING_MARGIN['float32']:.3g})")
    # in bfloat16 the same margin of 0.3 lies within what rounding moves: both are rounding
    f16 = compare(answers(BASE, margins=MARGINS, dtype="bfloat16"), answers(trial, NGRAM, dtype="bfloat16"))
    assert (f16.rounding, f16.changed, f16.refusal("x", AnswerRule.ROUNDING)) == (2, 0, None)
    assert f16.refusal("x", AnswerRule.IDENTICAL).startswith("x: 2 of 4 answers differ from the baseline's; first rounding: prompt a")


def test_an_answer_that_stops_early_or_goes_on_differs_where_the_shorter_ends() -> None:
    f = compare(answers(BASE, margins=MARGINS), answers({**BASE, "c": [4, 4], "d": [5, 6, 7]}, NGRAM))
    assert (f.first.prompt_id, f.first.token, f.first.kind) == ("c", 2, "changed")
    assert (f.changed, f.unclassified) == (1, 1)  # d goes on past the baseline's last margin: unclassified


def test_where_the_baseline_left_its_own_answer_the_difference_is_rounding() -> None:
    again = {"c": [4, 4, 8, 8]}  # asked again, the baseline itself left its answer at token 2
    f = compare(answers(BASE, margins=MARGINS, again=again), answers({**BASE, "c": [4, 4, 4, 9]}, NGRAM))
    assert (f.rounding, f.changed, f.first.margin) == (1, 0, None)


def test_without_margins_a_difference_is_unclassified_and_only_the_identical_rule_counts_it() -> None:
    f = compare(answers(BASE), answers({**BASE, "a": [1, 9]}, NGRAM))
    assert (f.unclassified, f.changed, f.broken(AnswerRule.ROUNDING), f.broken(AnswerRule.IDENTICAL)) == (1, 0, 0, 1)
    assert f.summary() == "same 3/4 (1 unclassified)"


def test_failed_requests_and_unknown_prompts_are_not_compared_and_nothing_at_temperature_above_zero() -> None:
    f = compare(answers({**BASE, "b": None}, margins=MARGINS), answers({"a": BASE["a"], "b": [7], "z": [1]}, NGRAM))
    assert (f.compared, f.identical) == (1, 1)
    assert compare(answers(BASE, temperature=0.7), answers(BASE, NGRAM, temperature=0.7)) is None
    assert compare(answers(BASE), answers({"a": None}, NGRAM)) is None


@pytest.mark.parametrize(("dtypes", "expected"), [
    (("float32", "float32"), ROUNDING_MARGIN["float32"]), (("float32", "bfloat16"), ROUNDING_MARGIN["bfloat16"]),
    (("auto",), ROUNDING_MARGIN["bfloat16"]), ((None, "float16"), ROUNDING_MARGIN["bfloat16"])])
def test_the_rounding_margin_is_the_coarsest_dtypes(dtypes: tuple, expected: float) -> None:
    assert rounding_margin(*dtypes) == expected
