"""A worker told to stop politely (SIGTERM, as Kubernetes evicts a pod; Ctrl-C): its engines stop
within 10 s, its trials are handed back at once, and it exits 0 with nothing half-written;
another worker measures those trials without waiting for the heartbeat's grace period.

The engines are tests/fake_engine.py, a real process speaking vLLM's HTTP protocol in a process
group of its own, started by the worker as it starts vLLM: what is tested is the worker's
shutdown, not the engine's (a real engine stopped by Ctrl-C: tests/study/test_study.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psutil
import pytest
import yaml
from conftest import FAKE_ENGINE, group_is_gone, study_config

from spectune.search import snapshots

SPACE = ("methods:\n  none: {}\n  ngram:\n    num_speculative_tokens: [1, 2, 3]\n"
         "    prompt_lookup_max: 3\n    prompt_lookup_min: 1\n")
ENGINES = {"SPECTUNE_SERVE_COMMAND": f"{sys.executable} {FAKE_ENGINE} --model", "FAKE_ENGINE_BEHAVIOUR": "serve",
           "FAKE_ENGINE_TOKEN_MS": "150"}  # a trial of some seconds, so that it is stopped mid-way


def _worker(url: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "spectune.cli", "worker", "--storage", url, "--study", "evicted",
                             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **ENGINES},
                            # SIGINT as a terminal delivers it, even where pytest runs in the background
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # noqa: PLW1509


def _engine_groups(pid: int) -> set[int]:
    """Process groups of the engines a worker runs now (not their watchdogs)."""
    groups = set()
    for child in psutil.Process(pid).children():
        try:
            if "--port" in child.cmdline():
                groups.add(os.getpgid(child.pid))
        except (psutil.Error, ProcessLookupError):
            continue
    return groups


@pytest.mark.postgres
@pytest.mark.parametrize(("sig", "gpus"), [(signal.SIGTERM, None), (signal.SIGTERM, "0,1"), (signal.SIGINT, None)])
def test_a_stopped_worker_hands_its_trials_back_and_another_worker_takes_them_up(
        tmp_path: Path, repetitive_prompts: Path, pg_url: str, sig: signal.Signals, gpus: str | None) -> None:
    cfg = study_config(tmp_path, "stand-in", repetitive_prompts, SPACE, "evicted", trials=3, storage=pg_url)
    assert cfg.grace_period == 120  # what a handed-back trial does not wait for
    cfg_file = tmp_path / "study.yaml"
    cfg_file.write_text(yaml.safe_dump(json.loads(cfg.model_dump_json())))
    created = subprocess.run([sys.executable, "-m", "spectune.cli", "optimize", "--config", str(cfg_file), "--create-only"],
                             capture_output=True, text=True, timeout=120, check=False)
    assert created.returncode == 0, created.stderr
    slots = 2 if gpus else 1
    first = _worker(pg_url, *(["--gpus", gpus] if gpus else []))
    storage = optuna.storages.RDBStorage(pg_url)
    engines: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # every slot's trial RUNNING, its engine up and serving
            time.sleep(0.5)
            assert first.poll() is None, first.stderr.read() if first.stderr else ""
            engines = _engine_groups(first.pid)
            running = [t for t in optuna.load_study(study_name="evicted", storage=storage).trials
                       if t.state.name == "RUNNING"]
            if len(running) == slots and len(engines) == slots:
                break
        assert len(engines) == slots, "the worker never ran its engines"
        time.sleep(4)  # healthy, measuring
        stopped_at = time.monotonic()
        first.send_signal(sig)
        while not all(group_is_gone(g) for g in engines) and time.monotonic() - stopped_at < 15:
            time.sleep(0.1)
        engines_gone = time.monotonic() - stopped_at
        _, err = first.communicate(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)
    assert engines_gone <= 10, f"the engines took {engines_gone:.1f} s to stop"
    assert first.returncode == 0, err[-3000:]
    last = err.strip().splitlines()[-1]
    study = optuna.load_study(study_name="evicted", storage=storage)
    handed = [t for t in study.trials if t.state.name == "FAIL"]
    assert len(handed) == slots and all(t.user_attrs["fail_reason"] == "interrupted" for t in handed)
    numbers = ", ".join(str(t.number) for t in handed)
    assert last == (f"stopped by {sig.name}: engines stopped, trial{'s' if slots > 1 else ''} {numbers} handed back "
                    "to the study; 0 measured here"), err[-2000:]
    assert not any(t.state.name in ("RUNNING", "WAITING") for t in study.trials)  # nothing left half-way
    assert all("placement" in t.user_attrs and "config" in t.user_attrs for t in study.trials)

    second = _worker(pg_url, *(["--gpus", "0"] if gpus else []))  # one GPU per engine, as the first
    _, err = second.communicate(timeout=300)
    assert second.returncode == 0, err[-3000:]
    study = optuna.load_study(study_name="evicted", storage=storage)
    for t in handed:  # measured again by the second worker, well before the grace period had passed
        (again,) = [r for r in study.trials if r.user_attrs.get("retry_of") == t.number]
        assert again.state.name == "COMPLETE" and again.user_attrs["placement"]["pid"] == second.pid
        assert again.params == t.params
        assert (again.datetime_start - t.datetime_complete).total_seconds() < cfg.grace_period / 2
    finished = [s for s in snapshots(study) if s.finished]
    assert len(finished) == cfg.trials and len({s.rec.spec_key for s in finished}) == cfg.trials  # none lost or twice


def test_the_kubernetes_example_gives_an_evicted_worker_the_time_its_engines_take_to_stop() -> None:
    """SIGTERM, then at most STOP_TIMEOUT for the engine's own exit, then SIGKILL: 10 s in all;
    the pod's grace period must hold that with room for the trial's last writes."""
    from conftest import REPO

    from spectune.engines import STOP_TIMEOUT

    job = yaml.safe_load((REPO / "examples" / "k8s-workers.yaml").read_text())
    grace = job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert STOP_TIMEOUT < 10 and grace >= 2 * 10
