"""Load held: 8 worker processes and 200 trials on one PostgreSQL study, and 4 workers on one
SQLite file, against stand-in engines that answer fast.

What is measured is spectune and its storage, so each engine is ``tests/fake_engine.py`` (a real
process speaking vLLM's HTTP protocol: ``/health``, ``/metrics``, streamed ``/v1/completions``),
started by spectune itself in place of vLLM (``SPECTUNE_SERVE_COMMAND``), answering each request
with ``--max-tokens`` tokens ``--token-ms`` apart. The study: a grid over n-gram lookup
(``num_speculative_tokens`` 1..20 x ``prompt_lookup_max`` 1..10, and the baseline: 201
candidates), a tiny workload (``--num-prompts`` prompts, one window, no warm-up request).

1. The study is created once (``spectune optimize --create-only``), then the workers start at
   once, each ``spectune worker --storage URL --study NAME`` in a process of its own (as on
   several machines), run through spectune's own CLI entry point (:func:`spectune.cli.main`)
   by this script in worker mode, which times every storage write the process makes (SQLAlchemy
   events; spectune's code is unchanged) and writes them to a file per worker.
2. SQLite serves the workers of one process (a second process on the file is refused in one
   line naming PostgreSQL, :func:`spectune.storage.worker_claim`), so ``--sqlite-workers`` run as
   the slots of one ``spectune worker --gpus 0,1,2,3`` process; ``--sqlite-workers - 1`` more
   processes are started once it works, to check that each is refused (exit 2, one line) and
   writes nothing.

It reports, per storage:

- trials lost or duplicated (goal 0): Optuna's trials against spectune's measurement table
  (:class:`spectune.storage.MeasurementStore`): every COMPLETE trial has exactly one measurement,
  no trial number or candidate is measured twice, none is left RUNNING or WAITING, ``--trials``
  COMPLETE in all, one engine start per measurement and every engine stopped;
- the storage's write latency at the 50th and 99th percentiles: each transaction that wrote
  (INSERT, UPDATE or DELETE), from its begin to the end of its COMMIT, as spectune's process
  saw it; also each write statement and each COMMIT alone, by table, and the waits for the
  study's lock (PostgreSQL's advisory lock);
- spectune's overhead per trial (median and 90th percentile): the trial's wall time (Optuna's
  start to complete) minus the time the engine spent answering (its start-up until healthy, as
  spectune's client measured it, plus its measured windows); the gap between a worker's trials
  (telling one, choosing and starting the next under the study's lock); and how late spectune
  saw an engine healthy after the engine was ready (its health poll, counted in the start-up).

    .venv/bin/python benchmarks/fleet_load.py                    # 8 workers on PostgreSQL, 4 on SQLite, 200 trials each
    nice -n 19 .venv/bin/python benchmarks/fleet_load.py --workers 2 --trials 20 --sqlite-workers 2 --out /tmp/fl.json

PostgreSQL: a database of its own (``spectune_fleet_load_<random>``) is created through
``--pg-admin`` (default the machine's server, trust auth) and dropped afterwards. Writes
benchmarks/results/fleet_load.json with the date, the machine (its processor's features) and
versions.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from storage_writes import WriteTimer, dist, pooled_writes  # beside this script

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
FAKE_ENGINE = REPO / "tests" / "fake_engine.py"
PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
SPACE = """\
description: fleet_load's grid, 201 candidates (any proposer suits a stand-in engine)
methods:
  none: {}
  ngram:
    num_speculative_tokens: {low: 1, high: 20}
    prompt_lookup_max: {low: 1, high: 10}
    prompt_lookup_min: 1
"""
WORKER_MODE = "_worker"


# -- worker mode: spectune's CLI with its storage writes timed ------------------------------------


def _worker_main(timings: Path, argv: list[str]) -> None:
    """``spectune ARGV`` through its console entry point, its storage writes written to ``timings``."""
    collect = WriteTimer().install().collect
    from spectune.cli import main

    try:
        main(argv)
    finally:
        timings.write_text(json.dumps(collect()))


# -- the benchmark ---------------------------------------------------------------------------------


@contextlib.contextmanager
def _postgres_database(admin: str) -> Iterator[str]:
    """A database of this run's own on the server at ``admin``, dropped afterwards."""
    import sqlalchemy as sa

    name = f"spectune_fleet_load_{uuid.uuid4().hex[:12]}"
    engine = sa.create_engine(admin, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield str(sa.engine.make_url(admin).set(database=name).render_as_string(hide_password=False))
    finally:
        with engine.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        engine.dispose()


def _spectune(args: list[str], env: dict[str, str], output: Path, timings: Path | None = None) -> subprocess.Popen[str]:
    """``spectune ARGS`` in a process (and session) of its own, its output to the file
    ``output``; in worker mode when ``timings``."""
    cmd = ([sys.executable, str(Path(__file__).resolve()), WORKER_MODE, str(timings), *args] if timings
           else [sys.executable, "-m", "spectune.cli", *args])
    with output.open("w") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO,
                                start_new_session=True)


def _lines(output: Path) -> list[str]:
    return [ln for ln in output.read_text(errors="replace").splitlines() if ln.strip()]


def _stop(procs: Sequence[subprocess.Popen[str]]) -> None:
    """Stop the processes this script started that still run: SIGTERM (a worker's polite stop),
    then SIGKILL to its session after 30 s."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def _study_file(work: Path, storage: str, name: str, args: argparse.Namespace) -> Path:
    import yaml

    prompts = work / "prompts.jsonl"
    with prompts.open("w") as f:
        for i in range(max(args.num_prompts, 2)):
            f.write(json.dumps({"id": f"p{i}", "prompt": f"def f{i}(x):\n    return x + {i}\n"}) + "\n")
    (work / "space.yaml").write_text(SPACE)
    study = {
        "target": "stand-in", "space": str(work / "space.yaml"), "trials": args.trials, "storage": storage,
        "study_name": name, "sampler": "grid", "repeats": 1, "confirm": 0,
        "workload": {"source": str(prompts), "num_prompts": args.num_prompts, "concurrency": 1,
                     "warmup_requests": 0, "sampling": {"max_tokens": args.max_tokens, "temperature": 0.0}},
        "log_dir": str(work / "logs"), "startup_timeout": 120,
    }
    path = work / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def _run(kind: str, storage: str, workers: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One study on ``storage`` run by ``workers`` workers; what happened, checked and timed."""
    work.mkdir(parents=True)
    engines = work / "engines"
    engines.mkdir()
    timings = work / "timings"
    timings.mkdir()
    name = f"fleet-load-{kind}-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "SPECTUNE_SERVE_COMMAND": f"{sys.executable} {FAKE_ENGINE} --model",
           "FAKE_ENGINE_BEHAVIOUR": "serve", "FAKE_ENGINE_TOKEN_MS": str(args.token_ms),
           "FAKE_ENGINE_RECORD": str(engines), "TMPDIR": str(work)}
    output = work / "output"
    output.mkdir()
    created = _spectune(["optimize", "--config", str(_study_file(work, storage, name, args)), "--create-only"], env,
                        output / "create.txt")
    if created.wait(timeout=300) != 0:
        raise SystemExit(f"{kind}: the study was not created (exit {created.returncode}): "
                         f"{_lines(output / 'create.txt')[-5:]}")

    sqlite = storage.startswith("sqlite")
    commands = ([["worker", "--storage", storage, "--study", name, "--gpus", ",".join(map(str, range(workers)))]]
                if sqlite else [["worker", "--storage", storage, "--study", name]] * workers)
    t0 = time.monotonic()
    started = dt.datetime.now(dt.timezone.utc)
    procs = [_spectune(c, env, output / f"{i}.txt", timings / f"{i}.json") for i, c in enumerate(commands)]
    refused: list[dict[str, Any]] = []
    try:
        if sqlite and workers > 1:
            refused = _refused_on_sqlite(procs[0], storage, name, workers - 1, env, timings, output)
        deadline = t0 + args.timeout
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        print(f"{kind}: workers still running after {args.timeout} s; stopping them", file=sys.stderr)
    finally:
        _stop(procs)
    wall = time.monotonic() - t0
    exits = [{"pid": p.pid, "exit": p.returncode, "last_lines": _lines(output / f"{i}.txt")[-3:]}
             for i, p in enumerate(procs)]
    result = _check(storage, name, args.trials, engines)
    result.update(pooled_writes(timings))
    held = result["storage_writes"]["study_lock_held_seconds_total"]
    result["storage_writes"]["study_lock_busy_share"] = round(held / wall, 3) if wall > 0 and held else None
    result.update(_overhead(storage, name, engines, started.timestamp()))
    return {"storage": kind, "workers": workers,
            "processes": 1 if sqlite else workers, "wall_seconds": round(wall, 2),
            "trials_per_minute": round(result["complete"] / wall * 60, 1) if wall > 0 else None,
            "started": started.isoformat(timespec="seconds"), "worker_exits": exits,
            "second_processes_on_sqlite": refused or None, **result}


def _refused_on_sqlite(first: subprocess.Popen[str], storage: str, name: str, n: int, env: dict[str, str],
                       timings: Path, output: Path) -> list[dict[str, Any]]:
    """Once ``first`` holds the SQLite file (its claim names its pid), start ``n`` more worker
    processes on it: each should be refused in one line, exit 2, and write nothing."""
    lock = Path(storage.removeprefix("sqlite:///") + ".workers.lock")
    deadline = time.monotonic() + 120
    while f"pid {first.pid}" not in (lock.read_text() if lock.exists() else "") and time.monotonic() < deadline:
        if first.poll() is not None:
            return []
        time.sleep(0.2)
    others = [_spectune(["worker", "--storage", storage, "--study", name], env, output / f"refused-{i}.txt",
                        timings / f"refused-{i}.json") for i in range(n)]
    out = []
    for i, p in enumerate(others):
        try:
            p.wait(timeout=300)
        except subprocess.TimeoutExpired:
            _stop([p])
        lines = _lines(output / f"refused-{i}.txt")
        timed = timings / f"refused-{i}.json"
        writes = len(json.loads(timed.read_text())["transactions"]) if timed.exists() else None
        out.append({"exit": p.returncode, "lines": lines, "storage_writes": writes})
    return out


def _check(storage: str, name: str, expected: int, engines: Path) -> dict[str, Any]:
    """Optuna's trials against spectune's table: what was lost, what measured twice."""
    import optuna

    from spectune.records import TrialRecord
    from spectune.storage import MeasurementStore

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trials = optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
    rows = MeasurementStore(storage).trials(name)
    states = Counter(t.state.name for t in trials)
    complete = {t.number: t for t in trials if t.state.name == "COMPLETE"}
    by_number = Counter(r.trial_number for r in rows)
    measured = {r.trial_number for r in rows if r.state == "COMPLETE" and r.measurement_json is not None}
    ids = {t.number: t._trial_id for t in trials}
    candidates = Counter(TrialRecord.of(t).spec_key for t in complete.values()
                         if TrialRecord.of(t).duplicate_of is None)
    records = [json.loads(p.read_text()) for p in engines.glob("*.json")]
    check = {
        "expected": expected,
        "complete": len(complete),
        "states": dict(states),
        "fail_reasons": dict(Counter(TrialRecord.of(t).fail_reason or "engine" for t in trials
                                     if t.state.name == "FAIL")),
        "left_running": sorted(t.number for t in trials if t.state.name == "RUNNING"),
        "left_waiting": sorted(t.number for t in trials if t.state.name == "WAITING"),
        "complete_without_measurement": sorted(set(complete) - measured),
        "measurement_without_complete": sorted(measured - set(complete)),
        "measurement_of_another_trial_id": sorted(r.trial_number for r in rows
                                                  if ids.get(r.trial_number) != r.trial_id),
        "numbers_measured_twice": sorted(n for n, c in by_number.items() if c > 1),
        "candidates_measured_twice": sorted(k for k, c in candidates.items() if c > 1),
        "engine_starts": len(records),
        "engines_not_stopped": sum(1 for r in records if "stopped" not in r),
    }
    check["lost"] = (max(0, expected - len(complete)) + len(check["complete_without_measurement"])
                     + len(check["measurement_of_another_trial_id"]) + len(check["left_running"])
                     + len(check["left_waiting"]))
    check["duplicated"] = (max(0, len(complete) - expected) + len(check["numbers_measured_twice"])
                           + len(check["candidates_measured_twice"]) + len(check["measurement_without_complete"])
                           + max(0, len(records) - len(rows)))
    return check


def _overhead(storage: str, name: str, engines: Path, launched: float) -> dict[str, Any]:
    """Per COMPLETE trial: its wall time, the engine's share, spectune's share, and the gap
    before it on its worker; per worker, the time from its launch to its first trial."""
    import optuna

    from spectune.records import TrialRecord
    from spectune.storage import MeasurementStore

    trials = [t for t in optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
              if t.state.name == "COMPLETE"]
    store = MeasurementStore(storage)
    ready = defaultdict(list)  # port -> the stand-ins' ready times (their record, before they bind)
    for p in engines.glob("*.json"):
        r = json.loads(p.read_text())
        argv = r.get("argv", [])
        if "--port" in argv:
            ready[argv[argv.index("--port") + 1]].append(r["started"])
    walls, engine_s, over, lags = [], [], [], []
    per_worker: dict[tuple[str, int, str | None], list[tuple[float, float]]] = defaultdict(list)
    for t in trials:
        m = store.measurement(t._trial_id)
        if m is None or t.datetime_start is None or t.datetime_complete is None:
            continue
        wall = (t.datetime_complete - t.datetime_start).total_seconds()
        engine = m.startup_seconds + sum(w.duration_seconds for w in m.windows)
        walls.append(wall)
        engine_s.append(engine)
        over.append(wall - engine)
        spawned = m.started_at.timestamp()
        port = m.command[m.command.index("--port") + 1] if "--port" in m.command else None
        seen = [r for r in ready.get(port or "", []) if spawned <= r <= spawned + m.startup_seconds + 1]
        if seen:
            lags.append(spawned + m.startup_seconds - min(seen))
        place = TrialRecord.of(t).placement
        if place is not None:
            per_worker[(place.host, place.pid, place.gpus)].append(
                (t.datetime_start.timestamp(), t.datetime_complete.timestamp()))
    gaps, first = [], []
    for spans in per_worker.values():
        spans.sort()
        gaps += [b[0] - a[1] for a, b in zip(spans, spans[1:], strict=False)]
        first.append(spans[0][0] - launched)
    return {"per_trial_seconds": {
        "trial_wall": dist(walls, unit=1.0, digits=3),
        "engine_answering": dist(engine_s, unit=1.0, digits=3),
        "spectune_overhead": dist(over, unit=1.0, digits=3),
        "gap_between_trials": dist(gaps, unit=1.0, digits=3),
        "health_seen_after_ready": dist(lags, unit=1.0, digits=3),
        "worker_launch_to_first_trial": dist(first, unit=1.0, digits=3),
    }}


def _commit() -> dict[str, Any]:
    """The checkout's commit, and whether spectune's code differs from it (uncommitted changes)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False).stdout.strip()

    return {"commit": git("rev-parse", "HEAD") or None,
            "spectune_uncommitted_changes": bool(git("status", "--porcelain", "--", "spectune",
                                                     "tests/fake_engine.py"))}


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == WORKER_MODE:
        _worker_main(Path(sys.argv[2]), sys.argv[3:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=8, help="Worker processes on the PostgreSQL study (0: none).")
    parser.add_argument("--sqlite-workers", type=int, default=4, help="Workers on the SQLite file (0: none).")
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--token-ms", type=float, default=2.0, help="The stand-in's milliseconds per token.")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--num-prompts", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900.0, help="Seconds a study may take before it is stopped.")
    parser.add_argument("--pg-admin", default=PG_ADMIN, help="A PostgreSQL URL that may create databases.")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "fleet_load.json")
    args = parser.parse_args()
    if args.trials > 201:
        parser.error("--trials: the grid holds 201 candidates")

    from spectune.provenance import hardware, versions

    began = dt.datetime.now(dt.timezone.utc)
    load_before = os.getloadavg()
    runs = []
    work = Path(tempfile.mkdtemp(prefix="spectune-fleet-load-"))
    try:
        if args.workers:
            with _postgres_database(args.pg_admin) as url:
                runs.append(_run("postgresql", url, args.workers, args, work / "postgresql"))
        if args.sqlite_workers:
            runs.append(_run("sqlite", f"sqlite:///{work / 'sqlite' / 'study.db'}", args.sqlite_workers, args,
                             work / "sqlite"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    import sqlalchemy

    server = None
    if args.workers:
        with contextlib.suppress(Exception):
            engine = sqlalchemy.create_engine(args.pg_admin)
            with engine.connect() as conn:
                server = conn.execute(sqlalchemy.text("SHOW server_version")).scalar()
            engine.dispose()
    import optuna

    out = {
        "schema_version": 1,
        "date": began.isoformat(timespec="seconds"),
        "settings": {"trials": args.trials, "sampler": "grid", "candidates": 201, "token_ms": args.token_ms,
                     "max_tokens": args.max_tokens, "num_prompts": args.num_prompts, "concurrency": 1,
                     "repeats": 1, "warmup_requests": 0, "engine": "tests/fake_engine.py --behaviour serve",
                     "niceness": os.nice(0)},
        "versions": {**versions().model_dump(), "optuna": optuna.__version__, "sqlalchemy": sqlalchemy.__version__,
                     "postgresql": server, **_commit()},
        "hardware": hardware().model_dump(),
        "load_average": {"start": load_before, "end": os.getloadavg()},
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    for r in runs:
        w, o = r["storage_writes"], r["per_trial_seconds"]
        print(f"{r['storage']:10s} {r['workers']} workers in {r['processes']} process(es): "
              f"{r['complete']}/{r['expected']} "
              f"complete in {r['wall_seconds']} s; lost {r['lost']}, duplicated {r['duplicated']}; "
              f"write transactions p50 {w['transactions_ms']['p50']} ms p99 {w['transactions_ms']['p99']} ms "
              f"(n={w['transactions_ms']['n']}); overhead per trial median {o['spectune_overhead']['p50']} s "
              f"p90 {o['spectune_overhead']['p90']} s, gap between trials median {o['gap_between_trials']['p50']} s"
              + (f"; the study's lock held {w['study_lock_busy_share']:.0%} of the time" if w["study_lock_busy_share"]
                 else ""))
        for e in r["worker_exits"]:
            if e["exit"] != 0:
                print(f"  worker {e['pid']} exit {e['exit']}: {e['last_lines']}")
        for e in r["second_processes_on_sqlite"] or []:
            print(f"  a second process on SQLite: exit {e['exit']}, {len(e['lines'])} line(s), "
                  f"{e['storage_writes']} write(s): {e['lines'][-1] if e['lines'] else ''}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
