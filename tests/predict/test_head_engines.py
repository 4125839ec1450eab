"""The tiny target's EAGLE-3 head on real engines: served by vLLM, beating the tiny draft, and
replayed offline as vLLM's counters count it."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import tiny_engine_args

from spectune.config import Method, SpecConfig, WorkloadSpec
from spectune.measurement import Measurement

K = 3
WORKLOAD = {"source": "humaneval", "num_prompts": 8, "sampling": {"max_tokens": 64, "temperature": 0.0}}


@pytest.fixture(scope="module")
def head_runs(tiny_models, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Measurement]:  # noqa: ANN001
    """Two real engines of the tiny target on the same HumanEval prompts (float32, temperature 0):
    drafting k=3 with its EAGLE-3 head, and with its draft model."""
    from spectune.trial import measure
    from spectune.workloads import load_prompts

    wl = WorkloadSpec.model_validate(WORKLOAD)
    prompts = load_prompts(wl)
    specs = {"eagle3": SpecConfig(method=Method.EAGLE3, model=str(tiny_models.eagle3), num_speculative_tokens=K),
             "draft": SpecConfig(method=Method.DRAFT_MODEL, model=str(tiny_models.draft), num_speculative_tokens=K)}
    return {name: measure(tiny_engine_args(tiny_models.target), spec, wl, prompts,
                          log_dir=tmp_path_factory.mktemp(f"{name}-run"), startup_timeout=300)
            for name, spec in specs.items()}


@pytest.mark.engine
def test_vllm_serves_the_head_and_it_beats_the_draft(head_runs: dict[str, Measurement]) -> None:
    head, draft = head_runs["eagle3"].acceptance, head_runs["draft"].acceptance
    assert head is not None and draft is not None and head.num_drafts > 0 and draft.num_drafts > 0
    assert head_runs["eagle3"].num_failed == 0
    # the head reads the target's own hidden states: it is accepted more often than the separate draft
    assert head.mean_acceptance_length >= draft.mean_acceptance_length, (head, draft)
    assert len(head.per_position) == K and head.per_position[0] > 0.3
    # at temperature 0 in float32 speculation leaves the target's outputs alone
    assert [r.token_ids for r in head_runs["eagle3"].requests] == [r.token_ids for r in head_runs["draft"].requests]


@pytest.mark.engine
def test_head_replay_agrees_with_vllm_counters(head_runs: dict[str, Measurement], tiny_models) -> None:  # noqa: ANN001
    """The head run offline (the target's hidden states from transformers, the head's own forward,
    a greedy chain) drafts what vLLM's EAGLE-3 proposer drafted."""
    from spectune.predict import head_chains, replay_head

    run = head_runs["eagle3"]
    measured = run.acceptance
    assert measured is not None
    chains = head_chains(run.requests, str(tiny_models.eagle3), str(tiny_models.target), dtype=run.engine.dtype)
    rep = replay_head(chains, K, max_model_len=run.engine.max_model_len)
    counts = [round(p * measured.num_drafts) for p in measured.per_position]
    report = (f"measured {measured.num_drafts}/{measured.num_accepted_tokens} per position {counts}; replay "
              f"{rep.num_drafts}/{rep.num_accepted_tokens} per position {list(rep.accepted_per_pos)}, "
              f"cut off {list(rep.truncated_per_pos)}")
    assert abs(rep.num_drafts - measured.num_drafts) <= 0.01 * measured.num_drafts, report
    predicted = rep.profile().mean_acceptance_length
    assert abs(predicted / measured.mean_acceptance_length - 1) < 0.03, (predicted, report)
    for mine, theirs in zip(rep.profile().per_position, measured.per_position, strict=True):
        assert abs(mine - theirs) < 0.05, report
    # deeper chains than the engine ran: each k drafts k tokens a step, and accepts no fewer in all
    longer = [replay_head(chains, k, max_model_len=run.engine.max_model_len) for k in range(1, 9)]
    assert [r.num_draft_tokens for r in longer] == [k * r.num_drafts for k, r in enumerate(longer, 1)]
    lengths = [r.profile().mean_acceptance_length for r in longer]
    assert lengths == sorted(lengths) and lengths[2] == pytest.approx(predicted)


@pytest.mark.engine
def test_guided_search_predicts_head_candidates_by_replay(head_runs: dict[str, Measurement]) -> None:
    """A study's predictions for the head at a k not yet run come from its replay, not a prior."""
    from spectune.predict import DraftReplays
    from spectune.predict._rank import _acceptance

    run = head_runs["eagle3"]
    spec = SpecConfig(method=Method.EAGLE3, model=run.spec.model, num_speculative_tokens=5)
    found = _acceptance(spec, run, [], {}, DraftReplays())
    assert found.source == "replay" and "the head run offline" in found.note
    assert len(found.profile.per_position) == 5
    three = _acceptance(run.spec, run, [], {}, DraftReplays())
    assert found.tokens.value > three.tokens.value > 1.0


def test_head_training_resumes_where_it_stopped(tiny_models, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """An interrupted training starts again at its last saved step, and training with other
    settings reuses the target's answers, without asking the target again."""
    import spectune.checkpoints._head as head_mod
    from spectune.checkpoints import HEAD_MARKER, HeadTraining, build_eagle3_head

    prompts = ["def add(a, b):\n    return", "import os\nimport sys\n", "class Stack:\n    def push(self, x):"]
    dest = tmp_path / "head"

    def build(steps: int, stop_at: int | None = None) -> list[int]:
        seen: list[int] = []

        def hook(phase: str, done: int, total: int) -> None:
            if phase.startswith("training"):
                seen.append(done)
                if done == stop_at:
                    raise KeyboardInterrupt  # Ctrl-C

        training = HeadTraining(steps=steps, batch_size=4, max_new_tokens=8, window=24)
        if stop_at is None:
            build_eagle3_head(tiny_models.target, prompts, dest, training=training, progress=hook)
        else:
            with pytest.raises(KeyboardInterrupt):
                build_eagle3_head(tiny_models.target, prompts, dest, training=training, progress=hook)
        return seen

    assert build(60, stop_at=55)[0] == 0
    assert not dest.exists() and len(list((tmp_path / ".head.resume").glob("train-*.pt"))) == 1

    def no_data(*args, **kwargs):  # noqa: ANN002, ANN003
        raise AssertionError("the target's answers were computed again")

    monkeypatch.setattr(head_mod, "_head_data", no_data)
    assert build(70, stop_at=52)[0] == 0  # other settings: a training of its own, on the same data
    steps = build(70)
    assert steps[0] == 50 and steps[-1] == 69  # resumed at its last save
    marker = (dest / HEAD_MARKER).read_text()
    assert '"eagle3"' in marker and not (tmp_path / ".head.resume").exists()
    config = (dest / "config.json").read_text()
    assert '"speculators_model_type": "eagle3"' in config and str(tiny_models.target.resolve()) in config
