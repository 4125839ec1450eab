"""Offline replays of drafts and heads hold no lock and load no more than the machine can: a
replay runs in one thread while the others go on without it, none starts under the study's
lock, and a head's target counts towards the size limit. The replay itself is a stand-in that
takes its time (the real ones: tests/predict/test_replay_engines.py, test_head_engines.py)."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import FAKE_ENGINE, study_config

from spectune.engines import Platform, VLLMServer
from spectune.predict import DraftReplays, _draft_replay
from spectune.results import StudyView
from spectune.search import StudyStrategy
from spectune.study import create_study
from spectune.trial import measure
from spectune.worker import Slot, run_worker


@dataclass
class Request:
    prompt_token_ids: list[int]
    token_ids: list[int]
    ok: bool = True


REQUESTS = [Request([1, 2, 3], [4, 5, 6]), Request([7, 8], [9, 10])]


@pytest.fixture
def slow_replay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[float]]:
    """A draft folder on this machine whose replay takes 3 s; the replay's start and end times."""
    folder = tmp_path / "draft"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"\0" * 64)
    window: list[float] = []

    def slow(requests, folder, dtype=None):  # noqa: ANN001, ANN202
        window.append(time.time())
        time.sleep(3)
        window.append(time.time())
        return f"guesses of {folder}"

    monkeypatch.setattr(_draft_replay, "draft_guesses", slow)
    return folder, window


def test_a_replay_runs_in_one_thread_while_another_goes_on_without_it(slow_replay: tuple[Path, list[float]]) -> None:
    folder, window = slow_replay
    drafts = DraftReplays()
    first = threading.Thread(target=drafts.guesses, args=(REQUESTS, str(folder)))
    first.start()
    while not window:
        time.sleep(0.01)
    t0 = time.monotonic()
    assert drafts.guesses(REQUESTS, str(folder)) is None  # running elsewhere: not waited for
    assert time.monotonic() - t0 < 1.0
    first.join()
    assert drafts.guesses(REQUESTS, str(folder)) == f"guesses of {folder}" and len(window) == 2  # ran once, kept


def test_under_the_lock_no_replay_starts_and_no_pending_one_is_remembered_as_missing(
        slow_replay: tuple[Path, list[float]]) -> None:
    folder, window = slow_replay
    drafts = DraftReplays()
    with drafts.cached_only():
        got = drafts.acceptance("draft k=3", REQUESTS, lambda: drafts.guesses(REQUESTS, str(folder)))
    assert got is None and not window
    assert drafts.guesses(REQUESTS, str(folder)) is not None  # outside: it runs
    assert drafts.acceptance("draft k=3", REQUESTS, lambda: drafts.guesses(REQUESTS, str(folder))) is not None


def test_a_heads_replay_counts_its_target_and_is_skipped_in_one_line_when_too_large(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    head, target = tmp_path / "head", tmp_path / "target"
    for folder, size in ((head, 2**20), (target, 3 * 2**30)):  # a 3 GiB target: 6 GiB in float32
        folder.mkdir()
        with (folder / "model.safetensors").open("wb") as f:
            f.truncate(size)  # sparse: nothing written
    ran: list[str] = []
    monkeypatch.setattr(_draft_replay, "head_chains", lambda *a, **kw: ran.append("ran") or "chains")
    with caplog.at_level(logging.WARNING, logger="spectune.predict"):
        assert DraftReplays().chains(REQUESTS, str(head), str(target), dtype="float32") is None
    assert not ran
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"head {head} is not replayed offline: it and its target take 6.0 GiB in float32, "
                           "more than 4 GiB to run on the CPU")
    assert DraftReplays().chains(REQUESTS, str(head), str(target), dtype="bfloat16") == "chains"  # 3 GiB: runs


def test_a_second_slot_is_not_held_while_the_first_replays(tmp_path: Path, repetitive_prompts: Path,
                                                          slow_replay: tuple[Path, list[float]],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    folder, window = slow_replay
    record = tmp_path / "engines"
    record.mkdir()
    for key, value in (("FAKE_ENGINE_RECORD", str(record)), ("FAKE_ENGINE_BEHAVIOUR", "serve"),
                       ("FAKE_ENGINE_TOKEN_MS", "2")):
        monkeypatch.setenv(key, value)

    class Replaying(StudyStrategy):
        """Grid search whose next decision would like a draft's replay along the baseline's outputs."""

        def prepare(self, study) -> None:  # noqa: ANN001
            base = StudyView(study, self.store, self.url).baseline()
            if base is not None and (m := self.store.measurement(base.trial_id)) is not None:
                self.drafts.guesses(m.requests, str(folder), dtype="float32")

    space = ("methods:\n  none: {}\n  ngram:\n    num_speculative_tokens: [1, 2, 3, 4]\n"
             "    prompt_lookup_max: 3\n    prompt_lookup_min: 1\n")
    cfg = study_config(tmp_path, "stand-in", repetitive_prompts, space, "replaying", trials=5)
    ctx = create_study(cfg)
    strategy = Replaying(space=ctx.space, store=ctx.store, url=ctx.url, sampler="grid", objectives=1,
                         trials=5, confirm=0)
    fake = Platform(name="fake", serve_command=(sys.executable, str(FAKE_ENGINE), "--model"))
    result = run_worker(ctx, slots=[Slot((0,)), Slot((1,))], strategy=strategy, poll_seconds=0.2,
                        measure_fn=lambda *a, **kw: measure(*a, **kw, server_factory=lambda *x, **y: VLLMServer(
                            *x, **y, platform=fake)))
    assert result.finished == 5 and len(window) == 2  # the replay ran once, in one slot's thread
    started = [json.loads(p.read_text())["started"] for p in record.glob("*.json")]
    assert any(window[0] < s < window[1] for s in started), (window, sorted(started))  # the other slot measured
