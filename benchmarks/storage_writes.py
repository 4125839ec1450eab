"""A worker process's storage writes, timed (``fleet_load.py``'s worker mode), and the pooled figures.

:class:`WriteTimer` listens to SQLAlchemy's events on every Engine (Optuna's RDB storage and
spectune's own table alike): a transaction opens at ``begin``; a statement that writes marks it;
the dialect's COMMIT is wrapped, so that a transaction that wrote is timed from its begin to its
commit's end. The study's PostgreSQL advisory lock is followed too: how long a process waited for
it, held it, and what it wrote meanwhile.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_WRITE = re.compile(r"^\s*(INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+\"?(\w+)", re.IGNORECASE)


def _key(connection: Any) -> int:
    return id(getattr(connection, "dbapi_connection", connection))


def _study_key(parameters: Any) -> bool:
    """Whether an advisory lock call is a study's (spectune's schema lock has key 0, a study's another)."""
    return isinstance(parameters, dict) and parameters.get("b") not in (None, 0)


class WriteTimer:
    """Every storage write of this process from :meth:`install` on; :meth:`collect` returns them."""

    def __init__(self) -> None:
        self.clock = time.perf_counter
        self.statements: list[tuple[str, str, float]] = []
        self.commits: list[float] = []
        self.transactions: list[float] = []
        self.lock_waits: list[float] = []
        self.claims: list[tuple[float, int, float]] = []  # the study's lock held: seconds, writes, their seconds
        self.holding: list[Any] = []  # [acquired at, writes, their seconds] while this process holds it
        self.rolled_back = 0
        self.open_txn: dict[int, list[Any]] = {}  # connection -> [begun at, wrote]
        self.running: dict[int, float] = {}  # cursor -> statement started at
        self.guard = threading.Lock()

    def install(self) -> WriteTimer:
        import sqlalchemy as sa
        from sqlalchemy import event
        from sqlalchemy.engine.default import DefaultDialect

        event.listen(sa.engine.Engine, "begin", self._begin)
        event.listen(sa.engine.Engine, "rollback", self._rollback)
        event.listen(sa.engine.Engine, "before_cursor_execute", self._before)
        event.listen(sa.engine.Engine, "after_cursor_execute", self._after)
        do_commit, timer = DefaultDialect.do_commit, self

        def timed_commit(dialect: DefaultDialect, dbapi_connection: Any) -> None:
            t = timer.clock()
            try:
                do_commit(dialect, dbapi_connection)
            finally:
                timer._committed(dbapi_connection, t)

        DefaultDialect.do_commit = timed_commit  # type: ignore[method-assign]
        return self

    def _begin(self, conn: Any) -> None:
        with self.guard:
            self.open_txn[_key(conn.connection)] = [self.clock(), False]

    def _rollback(self, conn: Any) -> None:
        with self.guard:
            entry = self.open_txn.pop(_key(conn.connection), None)
            if entry and entry[1]:
                self.rolled_back += 1

    def _before(self, conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        now = self.clock()
        if "pg_advisory_unlock(" in statement and _study_key(parameters) and self.holding:
            at, writes, seconds = self.holding.pop()
            self.claims.append((now - at, writes, seconds))
        self.running[id(cursor)] = now

    def _after(self, conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        now = self.clock()
        took = now - self.running.pop(id(cursor), now)
        if "pg_advisory_lock(" in statement:
            if _study_key(parameters):
                self.lock_waits.append(took)
                self.holding[:] = [[now, 0, 0.0]]
            return
        if (m := _WRITE.match(statement)) is None:
            return
        self.statements.append((m.group(2).lower(), m.group(1).split()[0].upper(), took))
        with self.guard:
            if (entry := self.open_txn.get(_key(conn.connection))) is not None:
                entry[1] = True

    def _committed(self, dbapi_connection: Any, started: float) -> None:
        end = self.clock()
        with self.guard:
            entry = self.open_txn.pop(_key(dbapi_connection), None)
        if entry and entry[1]:
            self.commits.append(end - started)
            self.transactions.append(end - entry[0])
            if self.holding:  # one slot per process (PostgreSQL here): its writes while it holds the lock
                self.holding[0][1] += 1
                self.holding[0][2] += end - entry[0]

    def collect(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "statements": self.statements, "commits": self.commits,
                "transactions": self.transactions, "lock_waits": self.lock_waits, "claims": self.claims,
                "rolled_back_writes": self.rolled_back}


def pct(xs: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between the closest ranks (numpy's default)."""
    if not xs:
        return None
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def dist(xs: Sequence[float], unit: float = 1000.0, digits: int = 2) -> dict[str, Any]:
    """n, p50, p90, p99 and max of ``xs`` (seconds), in ms by default."""
    def r(x: float | None) -> float | None:
        return None if x is None else round(x * unit, digits)

    return {"n": len(xs), "p50": r(pct(xs, 50)), "p90": r(pct(xs, 90)), "p99": r(pct(xs, 99)),
            "max": r(max(xs) if xs else None)}


def pooled_writes(timings: Path) -> dict[str, Any]:
    """Every worker's timed storage writes (one JSON file each in ``timings``), pooled."""
    files = [json.loads(p.read_text()) for p in sorted(timings.glob("[0-9]*.json"))]
    statements = [s for f in files for s in f["statements"]]
    claims = [c for f in files for c in f["claims"]]
    by_table: dict[str, list[float]] = defaultdict(list)
    for table, verb, took in statements:
        by_table[f"{verb} {table}"].append(took)
    return {"storage_writes": {
        "transactions_ms": dist([x for f in files for x in f["transactions"]]),
        "commits_ms": dist([x for f in files for x in f["commits"]]),
        "statements_ms": dist([s[2] for s in statements]),
        "statements_by_table_ms": {k: dist(v) for k, v in sorted(by_table.items(), key=lambda kv: -len(kv[1]))},
        "study_lock_waits_ms": dist([x for f in files for x in f["lock_waits"]]),
        "study_lock_held_ms": dist([c[0] for c in claims]),
        "study_lock_held_seconds_total": round(sum(c[0] for c in claims), 2),
        "write_transactions_per_claim": dist([c[1] for c in claims], unit=1.0, digits=1),
        "write_seconds_per_claim": dist([c[2] for c in claims], unit=1.0, digits=3),
        "rolled_back_writes": sum(f["rolled_back_writes"] for f in files),
        "workers_reporting": len(files),
    }}
