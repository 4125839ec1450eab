"""Other users of the same host: engines listen on loopback with a fresh API key that spectune's
client sends and nothing records; storage passwords are shown nowhere; the dashboard says when
it listens beyond loopback; no model's own code runs unless the user asks.

The API key's way through a real engine is tested by the engine contract
(tests/engines/test_engine_contract.py: a request without it is refused) and, through a whole
study, export and report, by :func:`test_the_api_key_of_a_real_engine_is_in_no_record_export_report_or_log`.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import FAKE_ENGINE, study_config

from spectune._util import validate
from spectune.config import EngineArgs, Prompt, SpecConfig, WorkloadSpec
from spectune.engines import Platform, VLLMServer, _address, build_command
from spectune.errors import ConfigError
from spectune.load import run_load

STAND_IN = Platform(name="stand-in", serve_command=(sys.executable, str(FAKE_ENGINE), "--model"))
NGRAM_SPACE = "methods:\n  none: {}\n  ngram:\n    num_speculative_tokens: 2\n    prompt_lookup_max: 3\n    prompt_lookup_min: 1\n"


def _server(tmp_path: Path, **engine: object) -> VLLMServer:
    return VLLMServer(EngineArgs(model="stand-in", env={"FAKE_ENGINE_BEHAVIOUR": "serve"}, **engine), SpecConfig(),
                      log_path=tmp_path / "engine.log", startup_timeout=60, platform=STAND_IN)


# -- engines: loopback, a fresh key, no remote code ----------------------------------------------

def test_each_engine_listens_on_loopback_with_a_key_of_its_own_that_its_command_line_lacks(tmp_path: Path) -> None:
    a, b = _server(tmp_path), _server(tmp_path)
    assert a.command[a.command.index("--host") + 1] == "127.0.0.1"
    assert a.api_key and b.api_key and a.api_key != b.api_key and len(a.api_key) >= 32
    for server in (a, b):
        assert server.api_key not in " ".join(server.command) and "--api-key" not in server.command
        assert server.api_key not in server.args.model_dump_json()  # what a Measurement records


def test_an_engine_on_an_ipv6_loopback_gets_a_free_port_there_and_is_reached_in_brackets(tmp_path: Path) -> None:
    server = _server(tmp_path, host="::1")
    assert server.base_url == f"http://[::1]:{server.port}"
    with server:
        result = run_load(server.base_url, server.served_model_name, [Prompt(id="p", text="hello")],
                          WorkloadSpec(source="x.jsonl", sampling={"max_tokens": 4}), api_key=server.api_key)
    assert [r.ok for r in result.records] == [True] and result.records[0].output_tokens


def test_an_inherited_vllm_port_does_not_reach_the_engines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_PORT", "tcp://10.96.0.12:8000")  # what a Kubernetes Service named vllm sets
    monkeypatch.setenv("FAKE_ENGINE_RECORD", str(tmp_path))
    own = VLLMServer(EngineArgs(model="stand-in", env={"FAKE_ENGINE_BEHAVIOUR": "serve", "VLLM_PORT": "29500"}),
                     SpecConfig(), log_path=tmp_path / "engine.log", startup_timeout=60, platform=STAND_IN)
    with _server(tmp_path), own:
        pass
    envs = [json.loads(p.read_text())["env"] for p in sorted(tmp_path.glob("*.json"))]
    assert sorted(env.get("VLLM_PORT", "-") for env in envs) == ["-", "29500"]  # the engine's own env may set it


def test_a_key_the_user_would_set_is_refused_in_one_line() -> None:
    for engine in ({"extra_args": {"api-key": "mine"}}, {"extra_args": {"api_key": "mine"}},
                   {"env": {"VLLM_API_KEY": "mine"}}):
        with pytest.raises(ConfigError, match="set by spectune itself") as info:
            validate(EngineArgs, {"model": "m", **engine}, "engine")
        assert "\n" not in str(info.value) and "mine" not in str(info.value)


def test_engines_in_spectune_s_own_environment_want_the_key_on_every_route_but_health_and_metrics(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's own check guards /v1, /v2, /inference and /cohere; its other routes (SageMaker's
    /invocations generates text) want the key through spectune's middleware."""
    import asyncio

    from spectune.engines._guard import GUARD, RequireKey

    own = Platform(name="cpu", serve_command=("python", "-m", "api", "--model"), own_python=True)
    assert build_command(EngineArgs(model="m"), SpecConfig(), 1, own)[-2:] == ["--middleware", GUARD]
    elsewhere = Platform(name="gpu", serve_command=("srun", "vllm", "serve"))  # perhaps without spectune
    assert "--middleware" not in build_command(EngineArgs(model="m"), SpecConfig(), 1, elsewhere)

    async def engine(scope: dict, receive: object, send) -> None:  # noqa: ANN001
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"answered"})

    async def statuses(headers: dict[str, str]) -> dict[str, int]:
        transport = httpx.ASGITransport(app=RequireKey(engine))
        async with httpx.AsyncClient(transport=transport, base_url="http://engine") as client:
            return {path: (await client.post(path, headers=headers)).status_code
                    for path in ("/health", "/metrics", "/metrics/", "/invocations", "/tokenize", "/v1/completions",
                                 "/healthz", "/pause")}

    monkeypatch.setenv("VLLM_API_KEY", "the-key")
    anyone = asyncio.run(statuses({}))
    assert {p for p, code in anyone.items() if code == 200} == {"/health", "/metrics", "/metrics/"}
    assert set(anyone.values()) == {200, 401}
    assert set(asyncio.run(statuses({"Authorization": "Bearer the-key"})).values()) == {200}
    assert set(asyncio.run(statuses({"Authorization": "Bearer another"})).values()) == {200, 401}
    monkeypatch.delenv("VLLM_API_KEY")
    assert set(asyncio.run(statuses({})).values()) == {200}  # no key set: nothing to check


def test_a_host_beyond_loopback_is_said_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(_address, "_warned_hosts", set())
    with caplog.at_level(logging.WARNING, logger="spectune.engines"):
        _server(tmp_path)
        _server(tmp_path, host="localhost")
        assert not caplog.records  # loopback: nothing to say
        _server(tmp_path, host="0.0.0.0")
        _server(tmp_path, host="0.0.0.0")
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "0.0.0.0" in said[0] and "reachable from other machines" in said[0]


def test_the_stand_in_like_vllm_answers_only_requests_with_the_engine_key(tmp_path: Path) -> None:
    workload = WorkloadSpec(source="inline", sampling={"max_tokens": 4})
    prompts = [Prompt(id="p", text="hi")]
    with _server(tmp_path) as server:
        refused = run_load(server.base_url, server.served_model_name, prompts, workload)
        answered = run_load(server.base_url, server.served_model_name, prompts, workload, api_key=server.api_key)
        assert httpx.get(f"{server.base_url}/metrics", timeout=5).status_code == 200  # open, as vLLM's
    assert refused.records[0].error == 'HTTP 401: {"error": "Unauthorized"}'
    assert answered.records[0].ok
    assert server.api_key not in (tmp_path / "engine.log").read_text()


def test_vllm_gets_remote_code_only_when_the_user_asks(tmp_path: Path) -> None:
    plain = _server(tmp_path)
    assert not any("trust-remote-code" in part for part in plain.command)
    asked = _server(tmp_path, extra_args={"trust-remote-code": True})
    assert "--trust-remote-code" in asked.command


def test_a_checkpoint_s_own_tokenizer_code_never_runs_when_spectune_reads_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The pairing check loads tokenizers that are no tokenizer.json through transformers; a
    folder that names code of its own (``auto_map``) is read without running it."""
    from spectune.pairing import check_pairing

    marker = tmp_path / "code-ran"
    monkeypatch.setenv("SPECTUNE_TEST_MARKER", str(marker))
    folders = []
    for name in ("target", "draft"):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "tok.py").write_text("import os, pathlib\npathlib.Path(os.environ['SPECTUNE_TEST_MARKER']).write_text('ran')\n"
                                       "from transformers import PreTrainedTokenizer\nclass Tok(PreTrainedTokenizer):\n    pass\n")
        (folder / "vocab.json").write_text(json.dumps({"a": 0, "b": int(name == "draft") + 1}))
        (folder / "tokenizer_config.json").write_text(json.dumps({"auto_map": {"AutoTokenizer": ["tok.Tok", None]}}))
        folders.append(folder)
    with caplog.at_level(logging.WARNING, logger="spectune.pairing"):
        check_pairing(str(folders[0]), str(folders[1]), "draft_model")  # cannot compare: passes, says so
    assert not marker.exists()
    assert "cannot load the tokenizer" in caplog.text and "custom code" in caplog.text


# -- storage passwords and the dashboard ----------------------------------------------------------

def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spectune.cli", *args], capture_output=True, text=True, timeout=300,
                          check=False, env={**os.environ, **(env or {})})


@pytest.mark.postgres
def test_a_storage_password_is_in_no_message_log_record_report_or_export(tmp_path: Path, repetitive_prompts: Path,
                                                                         pg_url: str) -> None:
    """A study on PostgreSQL with a password in its URL (the machine's server trusts local
    connections and ignores it), measured on stand-in engines, then every reading command."""
    import sqlalchemy as sa

    secret = "s3cret-Pa55word"
    url = pg_url.replace("postgres@", f"postgres:{secret}@", 1)
    cfg = study_config(tmp_path, "stand-in", repetitive_prompts, NGRAM_SPACE, "pw", trials=2, storage=url)
    cfg_file = tmp_path / "study.yaml"
    cfg_file.write_text(yaml.safe_dump(json.loads(cfg.model_dump_json())))
    engines = {"SPECTUNE_SERVE_COMMAND": f"{sys.executable} {FAKE_ENGINE} --model", "FAKE_ENGINE_BEHAVIOUR": "serve"}
    out = tmp_path / "out"
    runs = {
        "optimize": _cli("--verbose", "optimize", "--config", str(cfg_file), env=engines),
        "create-only": _cli("optimize", "--config", str(cfg_file), "--create-only"),
        "show": _cli("show", "--storage", url, "--study", "pw"),
        "show --json": _cli("show", "--storage", url, "--study", "pw", "--json"),
        "export": _cli("export", "--storage", url, "--study", "pw", "-o", str(out / "best.yaml")),
        "report md": _cli("report", "--storage", url, "--study", "pw", "-o", str(out / "report.md")),
        "report html": _cli("report", "--storage", url, "--study", "pw", "-o", str(out / "report.html")),
        "no such study": _cli("worker", "--storage", url, "--study", "nope"),
        "unreachable": _cli("show", "--storage", url.replace(":5432/", ":1/")),
    }
    for name, run in runs.items():
        assert run.returncode == (2 if name in ("no such study", "unreachable") else 0), (name, run.stderr[-2000:])
        assert secret not in run.stdout + run.stderr, name
    assert "postgres:***@127.0.0.1" in runs["optimize"].stderr  # the URL is shown, masked
    for name in ("no such study", "unreachable"):  # one line, the URL masked
        assert runs[name].stderr.count("\n") == 1 and "postgres:***@" in runs[name].stderr, runs[name].stderr
    files = [p for p in tmp_path.rglob("*") if p.is_file() and p != cfg_file]
    assert {p.name for p in out.iterdir()} >= {"best.yaml", "report.md", "report.html"}
    for path in files:  # the export, its provenance, the reports, the engines' logs
        assert secret.encode() not in path.read_bytes(), path
    engine = sa.create_engine(pg_url)
    try:  # what the database keeps of the study: its configuration and definition too
        with engine.connect() as conn:
            for table in sa.inspect(conn).get_table_names():
                rows = conn.execute(sa.text(f'SELECT * FROM "{table}"')).all()
                assert secret not in repr(rows), table
    finally:
        engine.dispose()


def test_the_dashboard_says_in_one_line_when_it_listens_beyond_loopback(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "spectune.cli", "dashboard", "--storage", str(tmp_path / "s.db"),
                             "--host", "0.0.0.0", "--port", "0"],  # noqa: S104 - what is tested
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            # SIGINT as a terminal delivers it, even where pytest runs in the background
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # noqa: PLW1509
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any("optuna-dashboard at" in line for line in lines):
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
        proc.communicate(timeout=30)
    said = [line for line in lines if "0.0.0.0" in line and "optuna-dashboard at" not in line]
    assert len(said) == 1, lines
    assert "the dashboard listens on 0.0.0.0: anyone who reaches it can change or delete studies" in said[0]
    assert any("optuna-dashboard at http://0.0.0.0:" in line for line in lines), lines


# -- a real engine: its key in nothing spectune writes ---------------------------------------------

@pytest.mark.engine
def test_the_api_key_of_a_real_engine_is_in_no_record_export_report_or_log(
        tiny_models, repetitive_prompts: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from spectune.export import export_best
    from spectune.report import write_report
    from spectune.results import open_study
    from spectune.trial import measure
    from spectune.worker import run_study

    keys: list[str] = []
    anyone: dict[str, int] = {}

    class Watched(VLLMServer):
        """Notes its key, and what its routes answer a request without it, once healthy."""

        def start(self) -> None:
            super().start()
            keys.append(self.api_key)
            for path in ("/v1/completions", "/invocations"):
                anyone[path] = httpx.post(f"{self.base_url}{path}", timeout=60,
                                          json={"model": self.served_model_name, "prompt": "hi", "max_tokens": 1}).status_code
            anyone["/metrics"] = httpx.get(f"{self.base_url}/metrics", timeout=30).status_code

    cfg = study_config(tmp_path, tiny_models.target, repetitive_prompts, NGRAM_SPACE, "keyed", trials=1)
    with caplog.at_level(logging.DEBUG):
        result = run_study(cfg, measure_fn=functools.partial(measure, server_factory=Watched))
        assert result.measured == 1
        view = open_study(cfg.storage, "keyed")
        exported = export_best(view, tmp_path / "out" / "best.yaml")
        write_report(view, tmp_path / "out" / "report.md", "md")
        write_report(view, tmp_path / "out" / "report.html", "html")
        shown = json.dumps(view.record(), default=str)
    (key,) = keys
    assert anyone == {"/v1/completions": 401, "/invocations": 401, "/metrics": 200}
    assert view.rows[0].state == "COMPLETE"  # spectune's own requests carried the key
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert exported.path in written and exported.provenance_path in written
    assert any(p.suffix == ".log" for p in written) and any(p.suffix == ".db" for p in written)
    for path in written:  # the study's database, the engine's log, the export, its provenance, the reports
        assert key.encode() not in path.read_bytes(), path
    assert key not in caplog.text and key not in shown
