"""Locks over one storage: a study's (PostgreSQL advisory locks, or a file beside the SQLite
database), the schema's, and a worker's claim."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError

from spectune.errors import StorageError

_logger = logging.getLogger("spectune.storage")

from spectune.storage._urls import _describe, _engine, _is_postgres, safe_url

_LOCK_NAMESPACE = 0x5EC7
"""First key of spectune's PostgreSQL advisory locks (the second: 0 for the schema, else a study)."""

def _study_key(study_name: str) -> int:
    """A study's advisory-lock key: a signed 32-bit hash of its name, never 0 (the schema's)."""
    key = zlib.crc32(study_name.encode()) & 0x7FFFFFFF
    return key or 1


@contextlib.contextmanager
def _advisory_lock(url: str, key: int) -> Iterator[None]:
    """Hold PostgreSQL's session advisory lock (spectune's namespace, ``key``) on a connection of
    its own; released on exit, and by the server when this process dies."""
    with _engine(url).connect() as conn:
        conn.execute(sa.text("SELECT pg_advisory_lock(:a, :b)"), {"a": _LOCK_NAMESPACE, "b": key})
        conn.commit()
        try:
            yield
        finally:
            conn.execute(sa.text("SELECT pg_advisory_unlock(:a, :b)"), {"a": _LOCK_NAMESPACE, "b": key})
            conn.commit()


_local_locks: dict[tuple[str, str], threading.Lock] = {}
_local_locks_guard = threading.Lock()


@contextlib.contextmanager
def study_lock(url: str, study_name: str) -> Iterator[None]:
    """Let one worker at a time choose a trial of study ``study_name`` and start it.

    On PostgreSQL a session advisory lock, shared by every worker on every machine (a worker that
    dies lets go with its connection); on SQLite, which serves the workers of one process only
    (:func:`worker_claim`), a lock between that process's threads. Held for the time it takes
    to decide and to create the trial, never while an engine runs.

    Raises:
        StorageError: the database cannot be reached.
    """
    if _is_postgres(url):
        try:
            with _advisory_lock(url, _study_key(study_name)):
                yield
        except SQLAlchemyError as e:
            raise StorageError(_describe(url, e)) from e
        return
    with _local_locks_guard:
        lock = _local_locks.setdefault((url, study_name), threading.Lock())
    with lock:
        yield


@contextlib.contextmanager
def _schema_lock(url: str) -> Iterator[None]:
    """Serialise schema creation between processes that open a fresh PostgreSQL database at
    the same moment (both would create the same tables and types; one would fail)."""
    if _is_postgres(url):
        with _advisory_lock(url, 0):
            yield
    else:
        yield


_claims: dict[Path, tuple[IO[str], int]] = {}
_claims_guard = threading.Lock()


@contextlib.contextmanager
def worker_claim(url: str) -> Iterator[None]:
    """Claim a SQLite storage for this process's workers; several processes on one SQLite
    file are refused in one line naming PostgreSQL. Other databases need no claim: their
    workers share a study through Optuna's RDB storage and :func:`study_lock`.

    The claim is a lock on ``<database>.workers.lock`` beside the file, let go on exit or when
    the process dies; re-entrant within the process (its threads and nested calls share it).

    Raises:
        StorageError: another process works on this SQLite file.
    """
    path = url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else None
    if path is None or path == ":memory:":
        yield
        return
    lock_path = Path(path).expanduser().resolve().with_name(Path(path).name + ".workers.lock")
    with _claims_guard:
        handle, count = _claims.get(lock_path, (None, 0))
        if handle is None:
            handle = _take(lock_path, url)
        _claims[lock_path] = (handle, count + 1)
    try:
        yield
    finally:
        with _claims_guard:
            handle, count = _claims.pop(lock_path)
            if count > 1:
                _claims[lock_path] = (handle, count - 1)
            else:
                handle.close()  # lets go of the lock


def _take(lock_path: Path, url: str) -> IO[str]:
    handle: IO[str] = lock_path.open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise StorageError(
            f"storage {safe_url(url)} is in use by another spectune worker ({holder}); SQLite serves the "
            "workers of one process: give several workers a PostgreSQL storage "
            "(--storage postgresql+psycopg://USER@HOST/DB)") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}\n")
    handle.flush()
    return handle


