"""One study, many workers: ask-and-tell over a shared storage, GPU groups, dead workers.

PostgreSQL is the machine's own server (each test gets a database of its own); engines are
real vLLM engines on tiny models where the test is about engines, and tests/fake_engine.py (a
real process speaking the same HTTP protocol, which records its environment) where it is about
where engines run.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import optuna
import psutil
import pytest
import yaml
from conftest import FAKE_ENGINE, REPO, group_is_gone, study_config

from spectune.engines import Platform, VLLMServer
from spectune.errors import ConfigError, StorageError
from spectune.landscape import Landscape
from spectune.search import snapshots
from spectune.storage import MeasurementStore, worker_claim
from spectune.study import create_study, join_study
from spectune.trial import measure
from spectune.worker import Slot, parse_gpus, run_study, run_worker

FAKE_SERVE = f"{sys.executable} {FAKE_ENGINE} --model"
FAKE = Platform(name="fake", serve_command=tuple(FAKE_SERVE.split()))
NGRAM_SPACE = ("methods:\n  none: {}\n  ngram:\n    num_speculative_tokens: [1, 2, 3]\n"
               "    prompt_lookup_max: 3\n    prompt_lookup_min: 1\n")


def _spectune(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "spectune.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})


def _measured_keys(study: optuna.Study) -> Counter[str]:
    """How often each candidate was measured as a search trial (not a recheck, confirmation or reuse)."""
    return Counter(t.rec.spec_key for t in snapshots(study) if t.finished)


def _fake_engines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, token_ms: int = 20) -> Path:
    record = tmp_path / "engines"
    record.mkdir()
    monkeypatch.setenv("FAKE_ENGINE_RECORD_CLIENTS", "1")
    monkeypatch.setenv("FAKE_ENGINE_RECORD", str(record))
    monkeypatch.setenv("FAKE_ENGINE_BEHAVIOUR", "serve")
    monkeypatch.setenv("FAKE_ENGINE_TOKEN_MS", str(token_ms))
    return record


def _records(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


# -- GPU groups --------------------------------------------------------------------------------

def test_gpus_are_parsed_into_groups_and_bad_ones_refused() -> None:
    assert parse_gpus(None) == [Slot()]
    assert parse_gpus("0,1,2,3") == [Slot((0,)), Slot((1,)), Slot((2,)), Slot((3,))]
    assert parse_gpus("0-1,2-3") == [Slot((0, 1)), Slot((2, 3))]
    for bad, needle in (("0-1,2", "same number"), ("0,0", "two groups"), ("a", "GPU numbers"), ("3-1", "no GPU range"),
                        ("0-99999999999", "beyond any machine"), ("1024", "beyond any machine")):
        with pytest.raises(ConfigError, match=needle):
            parse_gpus(bad)


@pytest.mark.parametrize(("gpus", "groups", "tp"), [("0,1", {"0", "1"}, "1"), ("0-1,2-3", {"0,1", "2,3"}, "2")])
def test_each_gpu_group_runs_its_own_engine_at_the_same_time(tmp_path: Path, repetitive_prompts: Path,
                                                             monkeypatch: pytest.MonkeyPatch, gpus: str,
                                                             groups: set[str], tp: str) -> None:
    record = _fake_engines(tmp_path, monkeypatch)
    cfg = study_config(tmp_path, "stand-in", repetitive_prompts, NGRAM_SPACE, "placed", trials=4)
    fake_measure = functools.partial(measure, server_factory=functools.partial(VLLMServer, platform=FAKE))
    result = run_study(cfg, gpus=gpus, measure_fn=fake_measure)
    assert result.measured == 4 and result.finished == 4
    engines = _records(record)
    assert len(engines) == 4
    assert {e["env"]["CUDA_VISIBLE_DEVICES"] for e in engines} == groups  # every group used, each its own
    for e in engines:
        argv = e["argv"]
        assert argv[argv.index("--tensor-parallel-size") + 1] == tp
    spans = sorted((e["started"], e["stopped"], e["env"]["CUDA_VISIBLE_DEVICES"]) for e in engines)
    overlapping = [(a, b) for a, b in zip(spans, spans[1:], strict=False) if b[0] < a[1]]
    assert overlapping and all(a[2] != b[2] for a, b in overlapping)  # two engines at once, never on one group
    senders = {pid for e in engines for pid in e.get("clients", [])}
    assert senders and os.getpid() not in senders  # each trial's requests from a process of its own: no shared GIL
    study = optuna.load_study(study_name="placed", storage=cfg.storage)
    placed = {t.user_attrs["placement"]["gpus"] for t in study.trials}
    assert placed == groups  # where each trial ran is recorded with it, and shown
    from rich.console import Console

    from spectune._tables import render_study
    from spectune.results import open_study

    console = Console(record=True, width=240)
    render_study(open_study(cfg.storage, "placed"), console)
    shown = console.export_text()
    assert "ran on" in shown and all(f"gpus {g}" in shown for g in groups)
    # another worker must use groups of the same size: trials on other sizes would not compare
    other = "0-1" if gpus == "0,1" else "0"
    with pytest.raises(ConfigError, match="would not compare"):
        run_study(cfg.model_copy(update={"trials": 5}), gpus=other, measure_fn=fake_measure)


def test_a_worker_of_one_slot_sends_its_requests_itself_and_a_load_process_relays_its_progress(
        tmp_path: Path, repetitive_prompts: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from spectune.config import EngineArgs, Prompt, SpecConfig, WorkloadSpec
    from spectune.load import LoadProcess

    record = _fake_engines(tmp_path, monkeypatch)
    cfg = study_config(tmp_path, "stand-in", repetitive_prompts, NGRAM_SPACE, "alone", trials=2)
    run_study(cfg, measure_fn=functools.partial(measure, server_factory=functools.partial(VLLMServer, platform=FAKE)))
    assert {pid for e in _records(record) for pid in e.get("clients", [])} == {os.getpid()}  # one engine: no process
    prompts = [Prompt(id=f"p{i}", text="hello") for i in range(6)]
    seen: list[tuple[int, int]] = []
    with VLLMServer(EngineArgs(model="m"), SpecConfig(), log_path=tmp_path / "e.log", platform=FAKE,
                    startup_timeout=60) as server, LoadProcess() as process:
        result = process.run_load(server.base_url, server.served_model_name, prompts,
                                  WorkloadSpec(source="x.jsonl", concurrency=3, sampling={"max_tokens": 8}),
                                  api_key=server.api_key, progress=lambda d, t: seen.append((d, t)))
    assert [r.output_tokens for r in result.records] == [8] * 6 and result.concurrency == 3
    assert seen == [(i, 6) for i in range(1, 7)]


def test_a_space_fixing_tensor_parallelism_refuses_groups_of_another_size(tmp_path: Path, repetitive_prompts: Path) -> None:
    cfg = study_config(tmp_path, "stand-in", repetitive_prompts, "engine:\n  tensor_parallel_size: 2\n" + NGRAM_SPACE,
                       "fixed", trials=2)
    with pytest.raises(ConfigError, match="tensor_parallel_size 2"):
        run_study(cfg, gpus="0,1")


# -- SQLite: one process --------------------------------------------------------------------

def test_a_second_worker_process_on_one_sqlite_file_is_refused_naming_postgresql(tmp_path: Path,
                                                                                repetitive_prompts: Path) -> None:
    cfg = study_config(tmp_path, "stand-in", repetitive_prompts, NGRAM_SPACE, "solo", trials=2)
    create_study(cfg)
    with worker_claim(cfg.storage):
        proc = _spectune("worker", "--storage", cfg.storage, "--study", "solo")
        _, err = proc.communicate(timeout=120)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, err
    assert "in use by another spectune worker" in lines[0] and "PostgreSQL" in lines[0]


def test_a_database_of_a_newer_spectune_is_refused_in_one_line(tmp_path: Path) -> None:
    import sqlalchemy as sa

    url = f"sqlite:///{tmp_path / 'newer.db'}"
    MeasurementStore(url)
    with sa.create_engine(url).begin() as conn:
        conn.execute(sa.text("UPDATE spectune_meta SET value = '99' WHERE key = 'schema_version'"))
    proc = _spectune("show", "--storage", url)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and err.strip().count("\n") == 0, err
    assert "schema version 99" in err
    with pytest.raises(StorageError, match="upgrade spectune"):
        MeasurementStore(url)


# -- PostgreSQL: many workers ---------------------------------------------------------------

@pytest.mark.postgres
def test_guided_search_under_two_workers_measures_no_candidate_twice(tiny_models, pg_url: str, tmp_path: Path) -> None:
    landscape = Landscape.load(REPO / "benchmarks" / "landscapes" / "tiny_one_start.json").rebase(
        str(tiny_models.target), str(tiny_models.draft))
    config = landscape.config(storage=pg_url, study_name="two", sampler="guided", trials=8,
                              log_dir=str(tmp_path / "logs"))
    create_study(config)
    answer = landscape.measurer()
    lock = threading.Lock()

    def slow(*args: object, **kwargs: object):  # noqa: ANN202 - an engine run takes a while
        time.sleep(1.0)
        with lock:
            return answer(*args, **kwargs)

    results: list = []
    workers = [threading.Thread(target=lambda g=g: results.append(
        run_worker(join_study(pg_url, "two"), slots=[Slot((g,))], measure_fn=slow, poll_seconds=0.2))) for g in (0, 1)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=600)
    assert len(results) == 2
    study = optuna.load_study(study_name="two", storage=pg_url)
    measured = _measured_keys(study)
    assert measured and max(measured.values()) == 1  # no candidate measured twice as a search trial
    baseline = [t for t in study.trials if t.user_attrs.get("role") == "baseline"]
    assert len(baseline) == 1
    assert sum(measured.values()) <= config.trials  # the budget is the study's, not each worker's
    ran_on = Counter(t.user_attrs["placement"]["gpus"] for t in study.trials if t.state.name == "COMPLETE")
    assert set(ran_on) == {"0", "1"}  # both workers measured
    again = [t for t in study.trials if "confirms" in t.user_attrs]
    assert all(t.user_attrs.get("recheck") for t in again)  # measured twice only as an intended recheck


@pytest.mark.postgres
def test_two_processes_started_at_once_on_a_fresh_database_share_one_budget(
        tmp_path: Path, repetitive_prompts: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    record = _fake_engines(tmp_path, monkeypatch)
    cfg = study_config(tmp_path, "stand-in", repetitive_prompts, NGRAM_SPACE, "at-once", trials=4, storage=pg_url)
    cfg_file = tmp_path / "study.yaml"
    cfg_file.write_text(yaml.safe_dump(json.loads(cfg.model_dump_json())))
    env = {"SPECTUNE_SERVE_COMMAND": FAKE_SERVE}
    procs = [_spectune("optimize", "--config", str(cfg_file), env=env) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
        assert "4 of 4 trials finished" in err
    study = optuna.load_study(study_name="at-once", storage=pg_url)
    measured = _measured_keys(study)
    assert sum(measured.values()) == 4 and max(measured.values()) == 1  # four candidates, each once
    assert len({e["pid"] for e in _records(record)}) == 4
    by_worker = Counter(t.user_attrs["placement"]["pid"] for t in study.trials)
    assert len(by_worker) == 2  # both processes measured


def _engine_groups(worker_pids: list[int]) -> dict[int, int]:
    """Process groups of the engines each worker runs now (worker pid -> engine pgid)."""
    groups = {}
    for pid in worker_pids:
        try:
            for child in psutil.Process(pid).children():
                if "--port" in child.cmdline():
                    groups[pid] = os.getpgid(child.pid)
        except (psutil.Error, ProcessLookupError):
            continue
    return groups


@pytest.mark.engine
@pytest.mark.postgres
def test_three_workers_one_killed_mid_trial_the_study_completes_and_nothing_is_left(
        tiny_models, repetitive_prompts: Path, tmp_path: Path, pg_url: str) -> None:
    cfg = study_config(tmp_path, tiny_models.target, repetitive_prompts, NGRAM_SPACE, "fleet", trials=4,
                       storage=pg_url, heartbeat_interval=1, grace_period=4)
    cfg_file = tmp_path / "study.yaml"
    cfg_file.write_text(yaml.safe_dump(json.loads(cfg.model_dump_json())))
    created = _spectune("optimize", "--config", str(cfg_file), "--create-only")
    assert created.wait(timeout=120) == 0, created.stderr.read() if created.stderr else ""
    workers = [_spectune("worker", "--storage", pg_url, "--study", "fleet") for _ in range(3)]
    pids = [w.pid for w in workers]
    seen: dict[int, int] = {}
    victim = None
    try:
        deadline = time.monotonic() + 300
        while victim is None and time.monotonic() < deadline:
            time.sleep(1)
            seen.update(_engine_groups(pids))
            victim = next((w for w in workers if w.pid in seen and w.poll() is None), None)
        assert victim is not None, "no worker started an engine"
        time.sleep(3)  # the engine is loading the model; the trial is RUNNING
        victim.send_signal(signal.SIGKILL)
        survivors = [w for w in workers if w is not victim]
        deadline = time.monotonic() + 600
        while any(w.poll() is None for w in survivors) and time.monotonic() < deadline:
            seen.update(_engine_groups([w.pid for w in survivors]))
            time.sleep(1)
        for w in survivors:
            _, err = w.communicate(timeout=10)
            assert w.returncode == 0, err[-2000:]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
            w.wait(timeout=30)
    for _ in range(100):  # the killed worker's engine dies with it (its watchdog stops the group)
        if all(group_is_gone(g) for g in seen.values()):
            break
        time.sleep(0.2)
    assert all(group_is_gone(g) for g in seen.values()), "an engine outlived its worker"
    study = optuna.load_study(study_name="fleet", storage=pg_url)
    states = Counter(t.state.name for t in study.trials)
    assert states == {"COMPLETE": 4, "FAIL": 1}, [(t.number, t.state.name, t.user_attrs) for t in study.trials]
    dead = next(t for t in study.trials if t.state.name == "FAIL")
    assert dead.user_attrs["placement"]["pid"] == victim.pid and "fail_reason" not in dead.user_attrs
    retried = optuna.storages.RetryHeartbeatStaleTrialCallback.retried_trial_number
    retry = [t for t in study.trials if retried(t) == dead.number]
    assert [t.state.name for t in retry] == ["COMPLETE"]  # failed by its heartbeat, retried by another worker
    assert retry[0].user_attrs["placement"]["pid"] != victim.pid
    measured = _measured_keys(study)
    assert sum(measured.values()) == 4 and max(measured.values()) == 1  # none lost, none completed twice


# -- the previous engine's memory ---------------------------------------------------------------

@pytest.mark.parametrize(("busy", "starts"), [(2, True), (3, False)])
def test_an_engine_refused_for_memory_not_yet_free_is_started_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    busy: int, starts: bool) -> None:
    from spectune.config import EngineArgs, SpecConfig
    from spectune.errors import EngineSlotError

    _fake_engines(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_ENGINE_BUSY_STARTS", str(busy))
    server = VLLMServer(EngineArgs(model="m"), SpecConfig(), log_path=tmp_path / "e.log", platform=FAKE,
                        startup_timeout=60, memory_waits=(0.2, 0.2))
    if starts:
        with server:
            assert server.is_running()
    else:
        with pytest.raises(EngineSlotError, match="less than desired GPU memory utilization") as caught, server:
            pass
        assert caught.value.cause == "memory held by another process"  # the slot's fault: its trial is handed back
    assert not server.is_running()
    log = (tmp_path / "e.log").read_text()
    assert log.count("# spectune:") == min(busy + 1, 3)  # each start in the one log


def test_memory_not_yet_free_is_told_apart_from_a_configuration_that_does_not_fit() -> None:
    from spectune.engines import MEMORY_BUSY, summarize_failure

    busy = [
        "ValueError: Free memory on device (3.1/79.2 GiB) on startup is less than desired GPU memory utilization "
        "(0.9, 71.28 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
        "ValueError: Free memory on device cuda:0 (3.1/79.2 GiB) on startup is less than desired GPU memory "
        "utilization (0.9, 71.28 GiB).",
        "ValueError: Free memory on device cuda:1 (40.0/79.2 GiB) on startup is less than the engine's budget "
        "after excluding external process's weights (60.0 GiB).",
        "ValueError: Available memory on node 0 (1.2/23.4 GiB) is less than desired CPU memory utilization",
    ]
    fits_not = [
        "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    ]
    assert all(MEMORY_BUSY.search(summarize_failure(["INFO loading", line])) for line in busy)
    assert not any(MEMORY_BUSY.search(summarize_failure([line])) for line in fits_not)
