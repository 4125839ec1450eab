"""The replays against real engines: n-gram and draft acceptance as vLLM's own counters count it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from conftest import tiny_engine_args
from synthetic import (
    SPACE,
    store_study,
)

from spectune.config import Method, SpecConfig, WorkloadSpec
from spectune.measurement import (
    Measurement,
)
from spectune.search import predict_study

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
    store_study(url, "real", space, [runs["baseline"], runs["ngram"]], draft=None)
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
