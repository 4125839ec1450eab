"""The storage going away mid-study: PostgreSQL stopped for 60 s, a worker waiting past its limit,
a SQLite file locked by another process, a claim cut off half-way.

PostgreSQL is a server of this module's own (initdb and pg_ctl in a temporary folder, a unix
socket there and no TCP port; never the machine's server), stopped and started again by the
tests. The engines are tests/fake_engine.py, a real process speaking vLLM's HTTP protocol in a
process group of its own, started by each worker as it starts vLLM (``SPECTUNE_SERVE_COMMAND``):
what is tested is spectune and its storage, not the engine, and a stand-in lets a trial take
the seconds a test needs.

Heartbeats: the 60 s outage runs with the default heartbeat (every 30 s) and grace period
(120 s). A live worker's last beat before the outage is at most 30 s old when it starts, and it
beats again at most 30 s after the server is back: 60 + 30 < 120, so no trial can look stale.
Past the grace period spectune's own rule holds instead (a worker back from an outage judges
no trial stale for two heartbeat intervals): test_after_an_outage_no_trial_is_judged_stale_...
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import pwd
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import psutil
import pytest
import sqlalchemy as sa
from conftest import FAKE_ENGINE, group_is_gone, study_config

from spectune.engines import Platform, VLLMServer
from spectune.search import snapshots
from spectune.storage import MeasurementStore, StorageGuard, safe_url
from spectune.study import create_study
from spectune.trial import measure
from spectune.worker import Slot, _Worker, run_worker

SPACE = ("methods:\n  none: {}\n  ngram:\n    num_speculative_tokens: [1, 2, 3]\n"
         "    prompt_lookup_max: 3\n    prompt_lookup_min: 1\n")
FAKE_SERVE = f"{sys.executable} {FAKE_ENGINE} --model"
OUTAGE = 60
"""Seconds PostgreSQL is down mid-trial (issue 44)."""
PASSWORD = "sekret-outage"


def _pg_bin(name: str) -> str:
    found = shutil.which(name) or next((str(p) for p in sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))), None)
    if found is None:
        pytest.fail(f"{name} not found: these tests start a PostgreSQL server of their own (apt install postgresql)")
    return found


class OwnPostgres:
    """A PostgreSQL server in a temporary folder, listening on a unix socket there only."""

    port = 54329

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.data = folder / "data"
        as_postgres = os.geteuid() == 0  # initdb refuses to run as root
        self._prefix = ["runuser", "-u", "postgres", "--"] if as_postgres else []
        if as_postgres:
            os.chown(folder, pwd.getpwnam("postgres").pw_uid, -1)
        self._pg(_pg_bin("initdb"), "-A", "trust", "-U", "postgres", "--no-sync", "-D", str(self.data))
        self.start()

    def _pg(self, *args: str) -> None:
        done = subprocess.run([*self._prefix, *args], capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stdout + done.stderr

    def start(self) -> None:
        options = (f"-c listen_addresses='' -c unix_socket_directories={self.folder} -p {self.port} "
                   "-c fsync=off -c synchronous_commit=off -c full_page_writes=off")
        self._pg(_pg_bin("pg_ctl"), "start", "-w", "-D", str(self.data), "-l", str(self.folder / "server.log"),
                 "-o", options)

    def stop(self) -> None:
        self._pg(_pg_bin("pg_ctl"), "stop", "-w", "-m", "fast", "-D", str(self.data))

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def database(self, name: str) -> str:
        """A new database owned by a role with a password (trust lets it in; the URL carries it,
        which no output may show)."""
        admin = sa.create_engine(f"postgresql+psycopg://postgres@/postgres?host={self.folder}&port={self.port}",
                                 isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
        with admin.connect() as conn:
            if not conn.execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = 'spectune'")).scalar():
                conn.execute(sa.text(f"CREATE ROLE spectune LOGIN PASSWORD '{PASSWORD}'"))
            conn.execute(sa.text(f'CREATE DATABASE "{name}" OWNER spectune'))
        return f"postgresql+psycopg://spectune:{PASSWORD}@/{name}?host={self.folder}&port={self.port}"


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[OwnPostgres]:
    # initdb runs as the postgres user where the tests run as root: a folder it can reach
    folder = Path(tempfile.mkdtemp(prefix="spectune-pg-", dir="/tmp" if os.geteuid() == 0 else None))
    server = None
    try:
        server = OwnPostgres(folder)
        yield server
    finally:
        if server is not None and server.running():
            server.stop()
        shutil.rmtree(folder, ignore_errors=True)


def _engines_env(record: Path, token_ms: int) -> dict[str, str]:
    return {"SPECTUNE_SERVE_COMMAND": FAKE_SERVE, "FAKE_ENGINE_BEHAVIOUR": "serve",
            "FAKE_ENGINE_TOKEN_MS": str(token_ms), "FAKE_ENGINE_RECORD": str(record)}


def _worker(url: str, study: str, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "spectune.cli", "worker", "--storage", url, "--study", study, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env},
                            start_new_session=True)


def _engine_groups(pids: list[int]) -> set[int]:
    """Process groups of the engines the workers run now (children with ``--port``, not their watchdogs)."""
    groups = set()
    for pid in pids:
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            for child in psutil.Process(pid).children():
                with contextlib.suppress(psutil.Error, ProcessLookupError):
                    if "--port" in child.cmdline():
                        groups.add(os.getpgid(child.pid))
    return groups


def _wait_for_engines(procs: list[subprocess.Popen[str]], count: int, timeout: float = 120) -> set[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            assert p.poll() is None, p.communicate()[1][-3000:]
        groups = _engine_groups([p.pid for p in procs])
        if len(groups) >= count:
            return groups
        time.sleep(0.3)
    raise AssertionError(f"fewer than {count} engines started within {timeout} s")


def _end(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.communicate(timeout=30)


def _records(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def _nothing_lost_or_twice(url: str, name: str, trials: int) -> list[optuna.trial.FrozenTrial]:
    """Every trial of the study COMPLETE, one per candidate, each with its measurement in spectune's table."""
    study = optuna.load_study(study_name=name, storage=url)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * trials, [(t.number, t.state.name) for t in study.trials]
    finished = [s for s in snapshots(study) if s.finished]
    assert len(finished) == trials and len({s.rec.spec_key for s in finished}) == trials  # none lost, none twice
    rows = MeasurementStore(url).trials(name)
    assert sorted(r.trial_number for r in rows) == list(range(trials))
    assert all(r.state == "COMPLETE" and r.measurement() is not None for r in rows)
    return study.trials


@pytest.mark.postgres
def test_a_60_s_outage_mid_trial_loses_no_trial_measures_none_twice_and_starts_no_engine(
        own_postgres: OwnPostgres, tmp_path: Path, repetitive_prompts: Path) -> None:
    url = own_postgres.database("outage")
    cfg = study_config(tmp_path, "stand-in", repetitive_prompts, SPACE, "outage", trials=4, storage=url)
    assert OUTAGE + cfg.heartbeat_interval < cfg.grace_period  # no live trial looks stale (module docstring)
    create_study(cfg)
    record = tmp_path / "engines"
    record.mkdir()
    # a trial measures for about 10 s: the two running at the stop finish during the outage
    workers = [_worker(url, "outage", _engines_env(record, token_ms=100)) for _ in range(2)]
    try:
        _wait_for_engines(workers, 2)
        time.sleep(2)  # both measuring
        down = time.time()
        own_postgres.stop()
        time.sleep(OUTAGE)
        up = time.time()
        own_postgres.start()
        outs = [w.communicate(timeout=300) for w in workers]
    finally:
        _end(workers)
        if not own_postgres.running():
            own_postgres.start()
    for w, (_, err) in zip(workers, outs, strict=True):
        assert w.returncode == 0, err[-3000:]
        assert "unreachable" in err and "reachable again after" in err and "Traceback" not in err, err[-3000:]
        assert PASSWORD not in err
    trials = _nothing_lost_or_twice(url, "outage", 4)
    engines = _records(record)
    assert len(engines) == 4  # one engine per trial: none measured twice
    assert not [e for e in engines if down <= e["started"] <= up]  # no engine started while the storage was down
    during = [e for e in engines if down <= e.get("stopped", 0) <= up]
    assert len(during) == 2  # both measurements finished during the outage...
    written = [t for t in trials if t.datetime_complete.timestamp() >= up]
    assert len(written) >= 2  # ...and were written once the database was back
    assert not [t for t in trials if down <= t.datetime_complete.timestamp() <= up]


@pytest.mark.postgres
def test_past_the_limit_workers_stop_their_engines_and_exit_with_one_line_naming_the_storage(
        own_postgres: OwnPostgres, tmp_path: Path, repetitive_prompts: Path) -> None:
    url = own_postgres.database("limited")
    cfg = study_config(tmp_path, "stand-in", repetitive_prompts, SPACE, "limited", trials=4, storage=url,
                       heartbeat_interval=1)
    create_study(cfg)
    record = tmp_path / "engines"
    record.mkdir()
    # a trial would measure for about 30 s; the workers give up 3 s into the outage
    workers = [_worker(url, "limited", _engines_env(record, token_ms=300), "--storage-outage-limit", "3s")
               for _ in range(2)]
    try:
        engines = _wait_for_engines(workers, 2)
        time.sleep(1)
        running = {t.number for t in optuna.load_study(study_name="limited", storage=url).trials
                   if t.state.name == "RUNNING"}
        down = time.monotonic()
        own_postgres.stop()
        outs = [w.communicate(timeout=120) for w in workers]
        stopped_after = time.monotonic() - down
    finally:
        _end(workers)
        if not own_postgres.running():
            own_postgres.start()
    assert stopped_after < 20, f"the workers took {stopped_after:.0f} s to stop"  # their measurements were cut short
    assert all(group_is_gone(g) for g in engines)
    assert all("stopped" in e for e in _records(record))  # each engine stopped by its worker (SIGTERM)
    for w, (out, err) in zip(workers, outs, strict=True):
        assert w.returncode == 2, err[-3000:]
        assert "Traceback" not in err and PASSWORD not in err + out, err[-3000:]
        last = err.strip().splitlines()[-1]
        assert last.startswith(f"error: storage {safe_url(url)} unreachable for ")
        assert "(storage_outage_limit 3 s)" in last and last.endswith("the worker stopped its engines")
    study = optuna.load_study(study_name="limited", storage=url)  # the database is back
    left = {t.number for t in study.trials if t.state.name == "RUNNING"}
    assert left == running  # left RUNNING with their heartbeat: after the grace period, measured again


LOCKER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=60)
conn.execute("BEGIN EXCLUSIVE")
print(time.time(), flush=True)
time.sleep(float(sys.argv[2]))
print(time.time(), flush=True)
conn.execute("COMMIT")
"""


def test_a_sqlite_file_locked_by_another_process_mid_trial_loses_nothing(tmp_path: Path,
                                                                         repetitive_prompts: Path) -> None:
    cfg = study_config(tmp_path, "stand-in", repetitive_prompts, SPACE, "locked", trials=4)
    create_study(cfg)
    record = tmp_path / "engines"
    record.mkdir()
    worker = _worker(cfg.storage, "locked", _engines_env(record, token_ms=100), "--gpus", "0,1")  # two engines at once
    try:
        _wait_for_engines([worker], 2)
        time.sleep(2)
        locker = subprocess.run([sys.executable, "-c", LOCKER, cfg.storage.removeprefix("sqlite:///"), "20"],
                                capture_output=True, text=True, timeout=120, check=True)
        locked, released = map(float, locker.stdout.split())
        _, err = worker.communicate(timeout=300)
    finally:
        _end([worker])
    assert worker.returncode == 0, err[-3000:]
    assert "database is locked" in err and "reachable again after" in err and "Traceback" not in err, err[-3000:]
    trials = _nothing_lost_or_twice(cfg.storage, "locked", 4)
    engines = _records(record)
    assert len(engines) == 4
    assert not [e for e in engines if locked <= e["started"] <= released]
    assert len([e for e in engines if locked <= e.get("stopped", 0) <= released]) == 2  # finished while locked
    assert len([t for t in trials if t.datetime_complete.timestamp() >= released]) >= 2  # written after


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed")  # ask() outside optimize(), as workers do
def test_after_an_outage_no_trial_is_judged_stale_until_every_worker_could_beat_again(
        tmp_path: Path, repetitive_prompts: Path) -> None:
    cfg = study_config(tmp_path, "stand-in", repetitive_prompts, SPACE, "held", trials=4, heartbeat_interval=1,
                       grace_period=2)
    ctx = create_study(cfg)
    other = ctx.study.ask()  # another worker's trial, whose last beat is older than the grace period
    ctx.storage.record_heartbeat(other._trial_id)  # noqa: SLF001
    time.sleep(cfg.grace_period + 1)
    now = [0.0]
    guard = StorageGuard(ctx.url, clock=lambda: now[0])
    assert guard.failed(_locked())
    now[0] += 300  # an outage longer than the grace period
    guard.succeeded()
    worker = _Worker(ctx, None, None, [Slot()], None, guard)  # type: ignore[arg-type]
    worker.fail_stale()
    assert ctx.study.trials[other.number].state.name == "RUNNING"  # its worker may not have beaten again yet
    now[0] += 2 * cfg.heartbeat_interval
    worker.fail_stale()
    states = [t.state.name for t in ctx.study.trials]
    assert states == ["FAIL", "WAITING"]  # now stale, and queued again


@pytest.mark.timeout(180)  # a trial left RUNNING would make the worker wait for it forever
@pytest.mark.parametrize("cut", ["ask", "suggest"])
def test_a_claim_cut_off_by_the_storage_is_taken_up_again_and_leaves_no_orphan(
        tmp_path: Path, repetitive_prompts: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        cut: str) -> None:
    """The storage fails once right after a claim's trial was created (``ask``) or half-way
    through writing its candidate (``suggest``): the trial is claimed again, not left RUNNING."""
    from spectune.space import SearchSpace

    cfg = study_config(tmp_path, "stand-in", repetitive_prompts, SPACE, "cut", trials=2)
    ctx = create_study(cfg)
    monkeypatch.setenv("FAKE_ENGINE_BEHAVIOUR", "serve")
    fake = Platform(name="fake", serve_command=tuple(FAKE_SERVE.split()))
    stand_in = functools.partial(measure, server_factory=functools.partial(VLLMServer, platform=fake))
    target, name = (optuna.Study, "ask") if cut == "ask" else (SearchSpace, "suggest")
    original = getattr(target, name)
    failed: list[int] = []

    def once_then_lost(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        result = original(self, *args, **kwargs)  # done in the storage...
        if not failed:
            failed.append(1)  # ...but its answer lost with the connection
            raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from _locked()
        return result

    monkeypatch.setattr(target, name, once_then_lost)
    with caplog.at_level("INFO", logger="spectune"):
        result = run_worker(ctx, measure_fn=stand_in, poll_seconds=0.2)
    assert failed and result.measured == 2
    study = optuna.load_study(study_name="cut", storage=cfg.storage)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]  # no orphan RUNNING trial
    assert all(t.user_attrs["placement"]["pid"] == os.getpid() for t in study.trials)
    if cut == "ask":
        assert any("its claim was cut off; taken up" in r.getMessage() for r in caplog.records)


def test_the_outage_limit_is_a_setting_of_the_study_and_of_each_worker(tmp_path: Path,
                                                                       repetitive_prompts: Path) -> None:
    cfg = study_config(tmp_path, "stand-in", repetitive_prompts, SPACE, "limit", trials=2)
    assert cfg.storage_outage_limit == 600
    assert study_config(tmp_path, "stand-in", repetitive_prompts, SPACE, "limit", trials=2,
                        storage_outage_limit="90s").storage_outage_limit == 90
    bad = subprocess.run([sys.executable, "-m", "spectune.cli", "worker", "--study", "limit", "--storage",
                          str(tmp_path / "none.db"), "--storage-outage-limit", "soon"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0, bad.stderr
    assert "--storage-outage-limit: 'soon' is not a duration" in bad.stderr
    assert not (tmp_path / "none.db").exists()


def _locked() -> sa.exc.OperationalError:
    """The error SQLAlchemy raises for a SQLite file another process holds locked."""
    return sa.exc.OperationalError("SELECT", {}, sqlite3.OperationalError("database is locked"))
