"""GPU memory that means something: the engine's own account of its weights (target and draft),
else its devices' memory read by device, not by process, so that it holds in containers and on
MIG. tests/fake_engine.py and tests/fake_nvidia_smi.py stand in for a GPU engine and the driver."""

from __future__ import annotations

import functools
import os
import sys
import time
from pathlib import Path

import pytest
from conftest import FAKE_ENGINE, REPO, study_config

from spectune.config import EngineArgs, Method, SpecConfig
from spectune.engines import Platform, VLLMServer
from spectune.engines._gpu_memory import weights_from_log
from spectune.results import open_study
from spectune.trial import measure
from spectune.worker import run_study

GPU = Platform(name="gpu", serve_command=(sys.executable, str(FAKE_ENGINE), "--model"))
DRAFT = SpecConfig(method=Method.DRAFT_MODEL, model="org/draft", num_speculative_tokens=3)
GIB = 2**30


@pytest.fixture
def gpu_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Four GPUs, device 3 already holding 5000 MiB of another process's; stand-in engines."""
    bin_dir, state = tmp_path / "bin", tmp_path / "smi"
    bin_dir.mkdir()
    state.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nexec {sys.executable} {REPO / 'tests' / 'fake_nvidia_smi.py'} \"$@\"\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SMI_GPUS", ";".join(f"{i},GPU-{i},NVIDIA H100 80GB HBM3,81559 MiB,{5000 if i == 3 else 0} MiB"
                                                  for i in range(4)))
    monkeypatch.setenv("FAKE_SMI_STATE", str(state))
    monkeypatch.setenv("FAKE_ENGINE_BEHAVIOUR", "serve")
    monkeypatch.setenv("FAKE_ENGINE_TOKEN_MS", "2")
    monkeypatch.setenv("FAKE_ENGINE_GPU_MIB", "72000")  # vLLM takes its budget, whatever it needs
    return state


def test_the_weights_are_summed_over_the_workers_each_counted_once() -> None:
    lines = ["(Worker_TP0 pid=11) INFO [gpu_model_runner.py:5150] Model loading took 7.5000 GiB memory and 3.1 seconds",
             "(Worker_TP1 pid=12) INFO [gpu_model_runner.py:5150] Model loading took 7.5000 GiB memory and 3.2 seconds",
             "(Worker_TP1 pid=12) INFO [gpu_model_runner.py:5150] Model loading took 7.5000 GiB memory and 3.2 seconds",
             "INFO unrelated"]
    assert weights_from_log(lines) == 15 * GIB
    assert weights_from_log(["INFO 12-07 [gpu_model_runner.py:5150] Model loading took 2.25 GiB memory and 1 s"]) \
        == round(2.25 * GIB)
    assert weights_from_log(["INFO nothing loaded"]) is None


def _server(tmp_path: Path, spec: SpecConfig, gpus: str, **env: str) -> VLLMServer:
    args = EngineArgs(model="org/target", tensor_parallel_size=len(gpus.split(",")),
                      env={"CUDA_VISIBLE_DEVICES": gpus, **env})
    return VLLMServer(args, spec, log_path=tmp_path / f"{spec.label()}-{gpus}.log", platform=GPU, startup_timeout=60)


def test_a_gpu_engine_reports_its_weights_as_it_accounts_for_them_and_a_draft_adds_its_own(
        tmp_path: Path, gpu_host: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_ENGINE_WEIGHTS_GIB", "15")
    monkeypatch.setenv("FAKE_ENGINE_DRAFT_GIB", "2")
    figures = {}
    for spec in (SpecConfig(), DRAFT):
        with _server(tmp_path, spec, "0,1") as server:
            pass
        figures[spec.method] = (server.memory_kind, server.peak_memory_bytes())
    assert figures == {Method.NONE: ("gpu_weights", 15 * GIB), Method.DRAFT_MODEL: ("gpu_weights", 17 * GIB)}


def test_without_the_engines_account_its_devices_memory_is_read_by_device_beyond_what_others_held(
        tmp_path: Path, gpu_host: Path) -> None:
    with _server(tmp_path, SpecConfig(), "3") as server:  # no PID matches: a container's view
        time.sleep(2.5)  # a sample every 2 s
    assert server.memory_kind == "gpu_device" and server.peak_memory_bytes() == 72000 * 2**20
    assert not list(gpu_host.iterdir())  # the stand-in gave its devices back


def test_max_memory_rules_out_the_configuration_whose_weights_exceed_it_on_gpus(
        tmp_path: Path, repetitive_prompts: Path, gpu_host: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_ENGINE_WEIGHTS_GIB", "15")
    monkeypatch.setenv("FAKE_ENGINE_DRAFT_GIB", "2")
    space = ("methods:\n  none: {}\n  draft_model:\n    models: [org/draft]\n    num_speculative_tokens: 3\n"
             "  ngram:\n    num_speculative_tokens: 3\n    prompt_lookup_max: 3\n    prompt_lookup_min: 1\n")
    cfg = study_config(tmp_path, "org/target", repetitive_prompts, space, "mem", trials=3,
                       slo={"max_memory": "16GiB"})
    fake = functools.partial(measure, server_factory=functools.partial(VLLMServer, platform=GPU))
    run_study(cfg, measure_fn=fake)
    rows = {r.label.split()[0]: r for r in open_study(cfg.storage, "mem").complete()}
    assert {name: r.feasible for name, r in rows.items()} == {"none": True, "ngram": True, "draft_model": False}
    assert rows["draft_model"].memory == "17.00 GiB weights" and rows["none"].memory == "15.00 GiB weights"
