"""The storage guard: which storage errors are an outage, how a call is tried again through one,
and the one line a worker stops with past its limit. The errors are real ones, raised by a SQLite
file another connection holds locked and by a PostgreSQL socket nobody listens on; the clock is
a stand-in, so that a 10-minute limit takes no time. The guard in a real outage, with worker
processes: tests/study/test_storage_outage.py."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
import sqlalchemy as sa

from spectune.errors import StorageError, StorageUnreachableError
from spectune.storage import MeasurementStore, StorageGuard, is_transient, safe_url


@pytest.fixture
def locked_sqlite(tmp_path: Path) -> Iterator[str]:
    """A SQLite file with spectune's and Optuna's tables, locked by another connection
    (``BEGIN EXCLUSIVE``) while the test runs; its URL waits for no lock (``timeout=0``)."""
    path = tmp_path / "locked.db"
    url = f"sqlite:///{path}?timeout=0"
    MeasurementStore(url)
    optuna.storages.RDBStorage(url)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        yield url
    finally:
        holder.execute("COMMIT")
        holder.close()


def _error(call) -> BaseException:  # noqa: ANN001
    with pytest.raises(Exception) as info:  # noqa: PT011 - any error the storage raises
        call()
    return info.value


def test_an_unreachable_or_locked_storage_is_transient_and_a_wrong_request_is_not(
        locked_sqlite: str, tmp_path: Path) -> None:
    locked = _error(lambda: sa.create_engine(locked_sqlite).connect().execute(sa.text("SELECT * FROM spectune_meta")))
    assert "database is locked" in str(locked) and is_transient(locked)
    wrapped = _error(lambda: MeasurementStore(locked_sqlite))
    assert isinstance(wrapped, StorageError) and is_transient(wrapped)  # spectune's, raised from the driver's
    optuna_error = _error(lambda: optuna.storages.RDBStorage(locked_sqlite, skip_compatibility_check=True,
                                                             skip_table_creation=True).get_all_studies())
    assert isinstance(optuna_error, optuna.exceptions.StorageInternalError) and is_transient(optuna_error)
    down = f"postgresql+psycopg://spectune:sekret@/db?host={tmp_path}&port=1"  # no server on this socket
    refused = _error(lambda: sa.create_engine(down).connect())
    assert isinstance(refused, sa.exc.OperationalError) and is_transient(refused)

    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    no_table = _error(lambda: sa.create_engine(fresh).connect().execute(sa.text("SELECT * FROM missing_table")))
    assert isinstance(no_table, sa.exc.OperationalError) and not is_transient(no_table)  # SQLite's, not an outage
    assert not is_transient(ValueError("database is locked"))


class _Clock:
    """Time that passes only when the guard sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_a_call_is_tried_again_until_the_storage_answers_and_the_outage_is_logged_at_its_start_and_end(
        locked_sqlite: str, caplog: pytest.LogCaptureFixture) -> None:
    locked = _error(lambda: MeasurementStore(locked_sqlite))
    clock = _Clock()
    guard = StorageGuard(locked_sqlite, limit=600, clock=clock, sleep=clock.sleep)
    answers: list[object] = [locked, locked, locked, locked, "rows"]

    def call() -> object:
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    with caplog.at_level(logging.WARNING, logger="spectune.storage"):
        assert guard.call("reading", call) == "rows"
    assert len(clock.sleeps) == 4 and all(0.8 <= b / a <= 3.0 for a, b in zip(clock.sleeps, clock.sleeps[1:]))
    assert 0.4 <= clock.sleeps[0] <= 0.6 and clock.sleeps[-1] <= 6  # from 0.5 s, doubling, at most 5 s
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2, warned  # not one line per try
    assert "unreachable (database is locked)" in warned[0] and "10 min" in warned[0]
    assert "reachable again after" in warned[1]
    assert guard.settled(0) and guard.gave_up is None


def test_past_the_limit_the_guard_gives_up_for_good_with_one_line_naming_the_storage(tmp_path: Path) -> None:
    url = f"postgresql+psycopg://spectune:sekret@/study?host={tmp_path}&port=1"
    refused = _error(lambda: sa.create_engine(url).connect())
    clock = _Clock()
    guard = StorageGuard(url, limit=60, clock=clock, sleep=clock.sleep)
    tries: list[float] = []

    def call() -> None:
        tries.append(clock.now)
        raise refused

    with pytest.raises(StorageUnreachableError) as info:
        guard.call("recording trial 3's measurement", call)
    message = str(info.value)
    assert "\n" not in message and "sekret" not in message and info.value.exit_code == 2
    assert message.startswith(f"storage {safe_url(url)} unreachable for 60 s (storage_outage_limit 60 s) while "
                              "recording trial 3's measurement: ")
    assert message.endswith("No such file or directory; the worker stopped its engines")
    assert clock.now - tries[0] == pytest.approx(60) and len(tries) > 10  # tried until the limit, not past it
    with pytest.raises(StorageUnreachableError):  # every later call: the worker is stopping
        guard.call("claiming a trial", lambda: None)
    assert guard.expired("anything") is info.value


def test_an_error_that_trying_again_does_not_mend_is_raised_at_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    clock = _Clock()
    guard = StorageGuard(url, clock=clock, sleep=clock.sleep)
    calls: list[int] = []

    def no_table() -> None:
        calls.append(1)
        with sa.create_engine(url).connect() as conn:
            conn.execute(sa.text("SELECT * FROM missing_table"))

    with pytest.raises(StorageError, match=r"^storage sqlite:///.* cannot be used: no such table: missing_table$"):
        guard.call("reading", no_table)
    with pytest.raises(KeyError):  # not a storage error: unchanged
        guard.call("reading", lambda: {}["x"])
    assert calls == [1] and clock.sleeps == [] and guard.settled(0)


def test_after_an_outage_the_storage_is_settled_only_once_it_has_answered_for_a_while(locked_sqlite: str) -> None:
    clock = _Clock()
    guard = StorageGuard(locked_sqlite, clock=clock, sleep=clock.sleep)
    assert guard.settled(60)  # no outage seen
    assert guard.failed(_error(lambda: MeasurementStore(locked_sqlite)))
    assert not guard.failed(ValueError("a bug")) and not guard.settled(60)
    clock.now += 30
    guard.succeeded()
    assert not guard.settled(60)
    clock.now += 60
    assert guard.settled(60)
