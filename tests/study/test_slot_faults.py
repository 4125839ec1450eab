"""A slot's faults are not the candidate's: an engine that cannot start for a reason of its GPUs,
port or environment hands its trial back, uncounted; a slot that fails so twice in a row leaves
the study; a baseline that fails stops it. The engines are tests/fake_engine.py failing as a
CUDA build of vLLM does, message for message (no engine here has GPUs to fail)."""

from __future__ import annotations

import functools
import json
import logging
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import optuna
import pytest
import yaml
from conftest import FAKE_ENGINE, study_config
from fake_engine import FAULTS

from spectune.config import EngineArgs, SpecConfig
from spectune.engines import Platform, VLLMServer, slot_fault
from spectune.errors import (
    BaselineFailedError,
    EngineSlotError,
    EngineStartError,
    SlotsLostError,
)
from spectune.search import snapshots
from spectune.trial import measure
from spectune.worker import run_study

FAKE = Platform(name="fake", serve_command=(sys.executable, str(FAKE_ENGINE), "--model"))
SPACE = ("methods:\n  none: {}\n  ngram:\n    num_speculative_tokens: [1, 2, 3]\n"
         "    prompt_lookup_max: 3\n    prompt_lookup_min: 1\n")
FAKE_MEASURE = functools.partial(measure, server_factory=functools.partial(VLLMServer, platform=FAKE))


@pytest.fixture
def engines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    record = tmp_path / "engines"
    record.mkdir()
    monkeypatch.setenv("FAKE_ENGINE_RECORD", str(record))
    monkeypatch.setenv("FAKE_ENGINE_BEHAVIOUR", "serve")
    monkeypatch.setenv("FAKE_ENGINE_TOKEN_MS", "2")
    return record


def _fails(monkeypatch: pytest.MonkeyPatch, fault: str, gpus: str | None = None, spec: str | None = None) -> None:
    monkeypatch.setenv("FAKE_ENGINE_FAULT", fault)
    for name, value in (("FAKE_ENGINE_FAULT_GPUS", gpus), ("FAKE_ENGINE_FAULT_SPEC", spec)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)


@pytest.mark.parametrize(("fault", "cause"), [("invalid device", "devices"), ("no gpus", "devices"),
                                              ("busy", "devices"), ("nccl", "NCCL"), ("port", "port"),
                                              ("gated", "model access"), ("oom", None)])
def test_each_failure_of_a_cuda_build_is_told_the_slots_or_the_candidates(fault: str, cause: str | None) -> None:
    assert slot_fault(FAULTS[fault]) == cause


def test_a_model_nobody_may_read_is_the_slots_fault_when_it_is_the_target_and_the_candidates_when_it_is_the_draft() -> None:
    gated = FAULTS["gated"]
    assert slot_fault(gated, draft="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B") == "model access"
    drafted = [line.replace("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.2-1B-Instruct") for line in gated]
    assert slot_fault(drafted, draft="meta-llama/Llama-3.2-1B-Instruct") is None
    # out of memory with NCCL errors from the peers: the configuration's, not the link's
    assert slot_fault(FAULTS["nccl"] + FAULTS["oom"]) is None


def test_an_engine_that_cannot_start_on_its_devices_raises_the_slots_fault(tmp_path: Path, engines: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    _fails(monkeypatch, "invalid device")
    server = VLLMServer(EngineArgs(model="m"), SpecConfig(), log_path=tmp_path / "e.log", platform=FAKE, startup_timeout=60)
    with pytest.raises(EngineSlotError, match="invalid device ordinal") as caught, server:
        pass
    assert caught.value.cause == "devices" and not server.is_running()
    _fails(monkeypatch, "oom")
    with pytest.raises(EngineStartError, match="CUDA out of memory") as caught, \
            VLLMServer(EngineArgs(model="m"), SpecConfig(), log_path=tmp_path / "f.log", platform=FAKE, startup_timeout=60):
        pass
    assert not isinstance(caught.value, EngineSlotError)


def test_a_gpu_that_fails_twice_leaves_the_study_and_its_trials_are_measured_on_the_others(
        tmp_path: Path, repetitive_prompts: Path, engines: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    _fails(monkeypatch, "busy", gpus="1")  # another job holds GPU 1
    cfg = study_config(tmp_path, "stand-in", repetitive_prompts, SPACE, "slots", trials=4)
    with caplog.at_level(logging.WARNING, logger="spectune"):
        result = run_study(cfg, gpus="0,1", measure_fn=FAKE_MEASURE)
    trials = snapshots(optuna.load_study(study_name="slots", storage=cfg.storage))
    back = [t for t in trials if t.state == "FAIL"]
    told = [(t.number, t.rec.placement.gpus, t.rec.fail_reason) for t in back]
    assert len(back) == 2 and all(t.rec.fail_reason.startswith("handed back (devices): ") for t in back), told
    assert all(t.rec.placement.gpus == "1" for t in back) and not any(t.engine_failed for t in trials), told
    done = [t for t in trials if t.state == "COMPLETE"]
    assert len(done) == 4 == result.finished == result.measured and {t.rec.placement.gpus for t in done} == {"0"}
    assert Counter(t.rec.spec_key for t in done).most_common(1)[0][1] == 1  # each candidate once: none lost
    retried = {t.rec.retry_of: t for t in trials if t.rec.retry_of is not None}
    assert all(t.number in retried for t in back)  # each handed back is measured again: GPU 1, then GPU 0
    assert retried[back[-1].number].state == "COMPLETE" and retried[back[0].number].number == back[-1].number
    out = [r.getMessage() for r in caplog.records if "taken out of the study" in r.getMessage()]
    assert len(out) == 1 and out[0].startswith("GPU 1 is taken out of the study: 2 engines in a row failed")
    starts = Counter(json.loads(p.read_text())["env"].get("CUDA_VISIBLE_DEVICES") for p in engines.glob("*.json"))
    assert starts["1"] == 2 and starts["0"] >= 4, starts  # no third start on GPU 1 (GPU 0's may rebind a port)


def test_a_candidate_that_does_not_fit_is_its_own_result_and_the_study_goes_on(
        tmp_path: Path, repetitive_prompts: Path, engines: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fails(monkeypatch, "oom", spec='"num_speculative_tokens": 3')
    cfg = study_config(tmp_path, "stand-in", repetitive_prompts, SPACE, "oom", trials=4)
    result = run_study(cfg, measure_fn=FAKE_MEASURE)
    trials = snapshots(optuna.load_study(study_name="oom", storage=cfg.storage))
    (failed,) = [t for t in trials if t.state == "FAIL"]
    assert failed.engine_failed and "CUDA out of memory" in failed.rec.fail_reason and failed.finished
    assert result.failed == 1 and result.finished == 4 and result.measured == 3


def test_a_worker_whose_only_slot_fails_twice_stops_in_one_line_and_counts_nothing(
        tmp_path: Path, repetitive_prompts: Path, engines: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fails(monkeypatch, "nccl")
    cfg = study_config(tmp_path, "stand-in", repetitive_prompts, SPACE, "lost", trials=3)
    with pytest.raises(SlotsLostError, match="every slot failed 2 times in a row") as caught:
        run_study(cfg, measure_fn=FAKE_MEASURE)
    assert "\n" not in str(caught.value) and "ncclSystemError" in str(caught.value)
    trials = snapshots(optuna.load_study(study_name="lost", storage=cfg.storage))
    assert [t.state for t in trials] == ["FAIL", "FAIL"] and not any(t.finished for t in trials)
    assert trials[1].rec.retry_of == 0  # the baseline, handed back and tried again


def test_a_baseline_that_fails_stops_the_study_in_one_line(tmp_path: Path, repetitive_prompts: Path, engines: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    _fails(monkeypatch, "oom", spec="none")  # the target alone does not fit
    cfg = study_config(tmp_path, "stand-in", repetitive_prompts, SPACE, "nobase", trials=3)
    cfg_file = tmp_path / "study.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    env = {**os.environ, "SPECTUNE_SERVE_COMMAND": f"{sys.executable} {FAKE_ENGINE} --model"}
    run = subprocess.run([sys.executable, "-m", "spectune.cli", "optimize", "--config", str(cfg_file)],
                         capture_output=True, text=True, env=env, timeout=300, check=False)
    errors = [line for line in run.stderr.splitlines() if line.startswith("error")]
    assert run.returncode == 1 and len(errors) == 1, run.stderr[-3000:]
    assert "the baseline (no speculation) failed" in errors[0] and "CUDA out of memory" in errors[0]
    trials = snapshots(optuna.load_study(study_name="nobase", storage=cfg.storage))
    assert len(trials) == 1 and trials[0].engine_failed  # no candidate measured against nothing
    with pytest.raises(BaselineFailedError):  # and a worker that joins later stops at once
        run_study(cfg, measure_fn=FAKE_MEASURE)
    assert len(optuna.load_study(study_name="nobase", storage=cfg.storage).trials) == 1


def test_a_port_taken_between_its_choice_and_the_engines_bind_is_chosen_again(
        tmp_path: Path, engines: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import socket

    from spectune.engines import _vllm

    with socket.socket() as held:  # another process's listener on the port found free
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        chosen = iter([taken])
        real = _vllm.free_port
        monkeypatch.setattr(_vllm, "free_port", lambda host="127.0.0.1": next(chosen, None) or real(host))
        server = VLLMServer(EngineArgs(model="m"), SpecConfig(), log_path=tmp_path / "e.log", platform=FAKE,
                            startup_timeout=60)
        with caplog.at_level(logging.WARNING, logger="spectune"), server:
            assert server.port != taken and httpx_ok(server.base_url + "/health")
        assert [r.getMessage() for r in caplog.records] == [
            f"engine could not bind port {taken}, taken since it was found free; starting it again on port {server.port}"]
        assert "address already in use" in (tmp_path / "e.log").read_text().lower()
        # a port the user gave is theirs: taken, it is the slot's fault, not tried elsewhere
        given = VLLMServer(EngineArgs(model="m"), SpecConfig(), log_path=tmp_path / "f.log", platform=FAKE,
                           startup_timeout=60, port=taken)
        with pytest.raises(EngineSlotError) as caught, given:
            pass
        assert caught.value.cause == "port" and given.port == taken


def httpx_ok(url: str) -> bool:
    import httpx

    return httpx.get(url, timeout=10).status_code == 200
