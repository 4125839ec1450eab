"""GPUs as the scheduler gave them: ``--gpus`` numbers count the worker's own
``CUDA_VISIBLE_DEVICES``, each trial's record names its devices by UUID, and slots on other GPU
models do not share a study unless asked. tests/fake_nvidia_smi.py stands in for ``nvidia-smi``
and tests/fake_engine.py for the engines (no GPU here)."""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

import optuna
import pytest
from conftest import FAKE_ENGINE, REPO, study_config

from spectune.engines import Platform, VLLMServer
from spectune.errors import ConfigError
from spectune.provenance import hardware
from spectune.results import open_study
from spectune.slots import Slot, parse_gpus
from spectune.trial import measure
from spectune.worker import run_study

FAKE = Platform(name="fake", serve_command=(sys.executable, str(FAKE_ENGINE), "--model"))
FAKE_MEASURE = functools.partial(measure, server_factory=functools.partial(VLLMServer, platform=FAKE))
SPACE = ("methods:\n  none: {}\n  ngram:\n    num_speculative_tokens: [1, 2, 3]\n"
         "    prompt_lookup_max: 3\n    prompt_lookup_min: 1\n")
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"


def _host(models: list[str]) -> str:
    return ";".join(f"{i},GPU-{i:04d}aaaa-bbbb,{m},81559 MiB" for i, m in enumerate(models))


@pytest.fixture
def gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A host of eight GPUs behind a stand-in nvidia-smi; engines are stand-ins that record themselves."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nexec {sys.executable} {REPO / 'tests' / 'fake_nvidia_smi.py'} \"$@\"\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SMI_GPUS", _host([H100] * 8))
    record = tmp_path / "engines"
    record.mkdir()
    monkeypatch.setenv("FAKE_ENGINE_RECORD", str(record))
    monkeypatch.setenv("FAKE_ENGINE_BEHAVIOUR", "serve")
    monkeypatch.setenv("FAKE_ENGINE_TOKEN_MS", "2")
    hardware.cache_clear()
    yield record
    hardware.cache_clear()


def test_gpu_numbers_count_the_gpus_the_scheduler_gave() -> None:
    given = {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    assert [s.label for s in parse_gpus("0,1", given)] == ["4", "5"]
    assert [s.label for s in parse_gpus("0-1,2-3", given)] == ["4,5", "6,7"]
    assert parse_gpus("2", {"CUDA_VISIBLE_DEVICES": "GPU-aa, GPU-bb, GPU-cc"}) == [Slot((2,), ("GPU-cc",))]
    assert parse_gpus("0,1", {}) == [Slot((0,)), Slot((1,))]  # nothing inherited: the host's numbers
    for text, env in (("4", given), ("0", {"CUDA_VISIBLE_DEVICES": ""})):
        with pytest.raises(ConfigError) as caught:
            parse_gpus(text, env)
        assert "\n" not in str(caught.value) and "--gpus counts those, from 0" in str(caught.value)
        assert f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}" in str(caught.value)


def test_engines_run_on_the_given_gpus_and_each_trial_names_its_devices_by_uuid(
        tmp_path: Path, repetitive_prompts: Path, gpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")  # what the scheduler gave the job
    cfg = study_config(tmp_path, "stand-in", repetitive_prompts, SPACE, "given", trials=4)
    run_study(cfg, gpus="0,1", measure_fn=FAKE_MEASURE)
    engines = [json.loads(p.read_text()) for p in gpus.glob("*.json")]
    assert {e["env"]["CUDA_VISIBLE_DEVICES"] for e in engines} == {"4", "5"}  # never the host's 0 and 1
    view = open_study(cfg.storage, "given")
    for row in view.complete():
        m = view.store.measurement(row.trial_id)
        device = row.placement.rpartition(" gpus ")[2]
        assert m is not None and device in ("4", "5")
        assert m.hardware.gpus == [f"{device}, GPU-000{device}aaaa-bbbb, {H100}, 81559 MiB"]
    study = optuna.load_study(study_name="given", storage=cfg.storage)
    assert study.user_attrs["gpu_model"] == H100


def test_slots_on_other_gpu_models_refuse_to_share_a_study_unless_asked(
        tmp_path: Path, repetitive_prompts: Path, gpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SMI_GPUS", _host([H100, A100, A100, A100]))
    cfg = study_config(tmp_path, "stand-in", repetitive_prompts, SPACE, "mixed", trials=3)
    with pytest.raises(ConfigError) as caught:
        run_study(cfg, gpus="0,1", measure_fn=FAKE_MEASURE)
    assert str(caught.value) == (f"--gpus: GPUs of different models (GPU 0: {H100}; GPU 1: {A100}) would not "
                                 "compare; --mixed-gpus to share the study anyway")
    assert not list(gpus.glob("*.json"))  # refused before any engine
    run_study(cfg, gpus="0", measure_fn=FAKE_MEASURE)  # the study measures on H100s
    with pytest.raises(ConfigError, match=f"measures on {H100}; this worker's GPUs are {A100}"):
        run_study(cfg.model_copy(update={"trials": 4}), gpus="1,2", measure_fn=FAKE_MEASURE)
    result = run_study(cfg.model_copy(update={"trials": 4}), gpus="1,2", measure_fn=FAKE_MEASURE, mixed_gpus=True)
    assert result.finished == 4
