"""The learned acceptance model and the draft replay, checked on the recorded landscape."""

from __future__ import annotations

import math

import pytest

from spectune.config import Method
from spectune.landscape import Landscape
from spectune.predict import (
    DRAFT_REPLAY_SPREAD,
    LearnedAcceptance,
    TrainingTrial,
    measured_profile,
    predict_candidates,
)


def test_learned_model_predicts_a_held_out_draft_k_within_its_interval(landscape: Landscape) -> None:
    draft = sorted((p for p in landscape.points if p.spec.get("method") == "draft_model"),
                   key=lambda p: p.spec["num_speculative_tokens"])
    held = draft[len(draft) // 2]
    train = [TrainingTrial(p.measurement, {}) for p in landscape.points
             if p is not held and p.measurement is not None and p.spec.get("method", "none") != "none"]
    model = LearnedAcceptance.fit(train)
    assert model is not None and model.knows(Method.DRAFT_MODEL) and not model.knows(Method.EAGLE)
    assert held.measurement is not None
    truth = measured_profile(held.measurement)
    assert truth is not None
    profile, tokens = model.predict(held.measurement.spec, temperature=0.0, features={})
    assert len(profile.per_position) == held.spec["num_speculative_tokens"]
    assert tokens.low <= tokens.value <= tokens.high
    assert abs(profile.mean_acceptance_length / truth.mean_acceptance_length - 1) < 0.1
    # in a ranking it answers for a proposer the study itself has not measured, where the draft
    # cannot be replayed: a baseline that recorded no token ids
    base = next(p.measurement for p in landscape.points if p.spec.get("method", "none") == "none")
    assert base is not None
    base = base.model_copy(update={"requests": [r.model_copy(update={"token_ids": None}) for r in base.requests]})
    pred = predict_candidates([held.measurement.spec], base, [], learned=model, features={})[0]
    assert pred.source == "learned" and pred.mean_acceptance_length == pytest.approx(profile.mean_acceptance_length)
    assert math.isfinite(pred.value.value)
    # a configuration measured on two engines counts once: two drafts so measured teach nothing
    twice = [TrainingTrial(p.measurement, {}) for p in draft[:2] for _ in range(2) if p.measurement is not None]
    assert len(twice) == 4 and LearnedAcceptance.fit(twice) is None
    third = LearnedAcceptance.fit(twice + [TrainingTrial(draft[2].measurement, {})])  # type: ignore[arg-type]
    assert third is not None and third.counts == {Method.DRAFT_MODEL: 3}
    # on another workload (its features) the same configuration counts again
    other = [TrainingTrial(t.measurement, {"output_in_prompt_words.n2": 0.5}) for t in twice[::2]]
    fourth = LearnedAcceptance.fit(twice + other)
    assert fourth is not None and fourth.counts == {Method.DRAFT_MODEL: 4}


def test_draft_replay_predicts_every_measured_k_from_the_baseline_alone(landscape: Landscape) -> None:
    """The landscape's draft (rebuilt here from the same seed) run offline along the baseline's
    recorded outputs predicts the acceptance vLLM counted for each k, before any draft trial."""
    from transformers import AutoTokenizer

    base = next(p.measurement for p in landscape.points if p.spec.get("method", "none") == "none")
    drafts = [p.measurement for p in landscape.points if p.spec.get("method") == "draft_model"]
    assert base is not None and len(drafts) >= 5 and all(m is not None for m in drafts)
    # the tiny models are the recorded ones only where their build reproduces (same seed, same
    # Python standard library for the tokenizer's training text): the recorded prompts tell
    tokenizer = AutoTokenizer.from_pretrained(landscape.config().target)
    sample = next(r for r in base.requests if r.ok and r.token_ids)
    if tokenizer.decode(sample.token_ids) != sample.text:
        pytest.skip("the tiny models built here are not the recorded ones: their tokenizer decodes differently")
    preds = {p.label: p for p in predict_candidates([m.spec for m in drafts if m], base, [])}
    errors = {}
    for m in drafts:
        assert m is not None and m.acceptance is not None
        pred = preds[m.spec.label()]
        assert pred.source == "replay" and "the draft run offline" in pred.note
        # an interval for the numerics of two implementations only
        assert pred.tokens_per_step.high / pred.tokens_per_step.value - 1 == pytest.approx(DRAFT_REPLAY_SPREAD)
        errors[m.spec.label()] = pred.mean_acceptance_length / m.acceptance.mean_acceptance_length - 1
    assert max(map(abs, errors.values())) < 0.01, errors  # the stated tolerance: 1 % of acceptance length
    # a draft this machine does not have is predicted from its measured trials, as before
    away = [m.model_copy(update={"spec": m.spec.model_copy(update={"model": "/nowhere/draft"})})
            for m in drafts if m is not None]
    largest = max(away, key=lambda m: m.spec.num_speculative_tokens or 0)
    smaller = next(m for m in away if m.spec.num_speculative_tokens == 2)
    pred = predict_candidates([smaller.spec], base, [largest])[0]
    assert pred.source == "truncation"
