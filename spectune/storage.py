"""Study storage: one place resolves the storage URL and owns spectune's own schema.

Optuna keeps studies and trials (its RDB storage, with heartbeats so that a dead worker's
trial is failed and retried). spectune keeps each trial's full Measurement, or its failure,
in its own table ``spectune_trials`` in the same database, linked by study name and trial id.
SQLite under ``storage/`` by default; PostgreSQL (``postgresql+psycopg://...``) when several
machines work on one study.

A running worker reaches its storage through one :class:`StorageGuard`, which carries its calls
through an outage (PostgreSQL down or restarting, a SQLite file locked by another process): it
tries them again with backoff until the storage answers, or until the worker's
``storage_outage_limit`` has passed (:class:`~spectune.errors.StorageUnreachableError`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import functools
import json
import logging
import os
import random
import re
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError

from spectune._util import STOPS
from spectune.errors import StorageError, StorageUnreachableError

if TYPE_CHECKING:
    import optuna

    from spectune.measurement import Measurement

__all__ = [
    "DEFAULT_OUTAGE_LIMIT",
    "DEFAULT_STORAGE",
    "MeasurementStore",
    "StorageGuard",
    "StoredTrial",
    "is_transient",
    "open_optuna_storage",
    "resolve_storage_url",
    "safe_url",
    "study_lock",
    "worker_claim",
]

_logger = logging.getLogger(__name__)

DEFAULT_STORAGE = "sqlite:///storage/spectune.db"
HEARTBEAT_INTERVAL = 30
GRACE_PERIOD = 120

SCHEMA_VERSION = 1
"""Version of spectune's own tables; a database written by a newer spectune is refused."""

_LOCK_NAMESPACE = 0x5EC7
"""First key of spectune's PostgreSQL advisory locks (the second: 0 for the schema, else a study)."""

_metadata = sa.MetaData()
meta_table = sa.Table(
    "spectune_meta",
    _metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.String(256), nullable=False),
)
studies_table = sa.Table(
    "spectune_studies",
    _metadata,
    sa.Column("study_name", sa.String(512), primary_key=True),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("definition", sa.Text, nullable=False),
)
"""What a worker on any machine needs to join a study: its configuration, its resolved search
space and its prompts (JSON), so that no file of the machine that created it is read again."""
trials_table = sa.Table(
    "spectune_trials",
    _metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("study_name", sa.String(512), nullable=False, index=True),
    sa.Column("trial_id", sa.Integer, nullable=False, unique=True),
    sa.Column("trial_number", sa.Integer, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("spec_key", sa.String(2048), nullable=False, index=True),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("error", sa.Text, nullable=True),
    sa.Column("measurement", sa.Text, nullable=True),
)


def resolve_storage_url(url: str | None = None, *, create: bool = True) -> str:
    """The storage URL to use: the argument, else ``$SPECTUNE_STORAGE``, else SQLite under storage/.

    A plain file path (``my.db``) means SQLite. The folder of a SQLite file is created, unless
    ``create`` is False (a command that reads studies): then nothing is written, and a SQLite
    file that does not exist is refused.

    Raises:
        StorageError: a SQLite path that is a folder or a file other than a SQLite database, a
            folder that cannot be created, or (``create=False``) no such file.
    """
    url = url or os.environ.get("SPECTUNE_STORAGE") or DEFAULT_STORAGE
    if "://" not in url:
        url = f"sqlite:///{url}"
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        path = _sqlite_path(url)
        if not create:
            if not path.exists():
                raise StorageError(f"no study in {safe_url(url)}: no such file")
            return url
        folder = path.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StorageError(f"storage {safe_url(url)} cannot be used: cannot create {folder}: {e.strerror}") from e
    return url


def safe_url(url: str) -> str:
    """The storage URL as it may be shown, logged or recorded: its password masked
    (``postgresql://user:***@host/db``), also in a URL SQLAlchemy cannot parse."""
    if "://" not in url:
        return url
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except (sa.exc.ArgumentError, ValueError):
        return re.sub(r"(://[^/@:]*):[^/@]*@", r"\1:***@", url)


def _sqlite_path(url: str) -> Path:
    """The file of a ``sqlite:///`` URL, checked to be a SQLite database where it exists.

    Raises:
        StorageError: the path is a folder, unreadable, or a file of another kind.
    """
    try:
        database = sa.engine.make_url(url).database or ""
    except (sa.exc.ArgumentError, ValueError):
        database = url.removeprefix("sqlite:///").split("?", 1)[0]
    if "\x00" in database:  # no file has one; os calls raise ValueError on it
        raise StorageError(f"storage {safe_url(url)} cannot be used: its path holds a NUL character")
    path = Path(database).expanduser()
    try:
        if path.is_dir():
            raise StorageError(f"storage {safe_url(url)} cannot be used: {path} is a folder")
        if path.exists():
            with path.open("rb") as f:
                head = f.read(16)
            if head and head != b"SQLite format 3\x00":
                raise StorageError(f"storage {safe_url(url)} cannot be used: {path} is not a SQLite database")
    except (OSError, ValueError) as e:  # ValueError: a NUL in the path
        raise StorageError(f"storage {safe_url(url)} cannot be used: {getattr(e, 'strerror', None) or e}") from e
    return path


def _describe(url: str, err: BaseException) -> str:
    return f"storage {safe_url(url)} cannot be used: {_first_line(url, err)}"


def _first_line(url: str, err: BaseException) -> str:
    """The first line of the driver's own error under ``err`` (looked for through Optuna's and
    spectune's wrappers), the storage's password masked: a driver may quote its connection string."""
    while not isinstance(err, sa.exc.DBAPIError) and err.__cause__ is not None:
        err = err.__cause__
    first = (str(getattr(err, "orig", None) or err).strip().splitlines() or [type(err).__name__])[0]
    try:
        password = sa.engine.make_url(url).password if "://" in url else None
    except (sa.exc.ArgumentError, ValueError):
        password = None
    if password:
        first = first.replace(str(password), "***")
    return first


CONNECT_TIMEOUT = 10
"""Seconds a connection to PostgreSQL may take (libpq's ``connect_timeout``, unless the URL sets
it): a host that does not answer fails the call instead of holding it past the outage limit."""


def _engine_kwargs(url: str) -> dict[str, Any]:
    """What every SQLAlchemy engine of spectune's is made with, Optuna's included."""
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    try:
        parsed = sa.engine.make_url(url)
    except (sa.exc.ArgumentError, ValueError):
        return kwargs
    if parsed.drivername in ("postgresql", "postgresql+psycopg", "postgresql+psycopg2") \
            and "connect_timeout" not in parsed.query:
        kwargs["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT}
    return kwargs


@functools.lru_cache(maxsize=8)
def _engine(url: str) -> sa.Engine:
    return sa.create_engine(url, **_engine_kwargs(url))


def _is_postgres(url: str) -> bool:
    return url.startswith(("postgresql", "postgres"))


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


def check_reachable(url: str) -> None:
    """Raise StorageError (one line) unless the database at ``url`` answers."""
    try:
        with _engine(url).connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except (SQLAlchemyError, ImportError, ValueError) as e:
        raise StorageError(_describe(url, e)) from e


def open_optuna_storage(
    url: str, *, retries: int = 1, heartbeat_interval: int = HEARTBEAT_INTERVAL,
    grace_period: int = GRACE_PERIOD,
) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage at ``url`` with heartbeats; a stale trial is failed and retried once.

    A worker beats every ``heartbeat_interval`` seconds while a trial runs; a RUNNING trial
    whose last beat is older than ``grace_period`` is failed by the next worker that starts a
    trial, and re-queued.
    """
    import warnings

    import optuna

    check_reachable(url)
    try:
        with _schema_lock(url), warnings.catch_warnings():
            # heartbeats are "experimental" in Optuna since 2.8; they are what distributed mode needs
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
            if retry is not None:  # Optuna >= 4.9
                callback = {"heartbeat_stale_trial_callback": retry(max_retry=retries)}
            else:
                callback = {"failed_trial_callback": optuna.storages.RetryFailedTrialCallback(max_retry=retries)}
            return optuna.storages.RDBStorage(
                url,
                heartbeat_interval=heartbeat_interval,
                grace_period=grace_period,
                engine_kwargs=_engine_kwargs(url),
                **callback,
            )
    except (SQLAlchemyError, ImportError, ValueError, RuntimeError) as e:
        raise StorageError(_describe(url, e)) from e


@dataclass(frozen=True)
class StoredTrial:
    """One row of spectune's table."""

    study_name: str
    trial_id: int
    trial_number: int
    spec_key: str
    state: str
    error: str | None
    measurement_json: str | None

    def measurement(self) -> Measurement | None:
        from spectune.config import RECORDED
        from spectune.measurement import Measurement

        if self.measurement_json is None:
            return None
        return Measurement.model_validate_json(self.measurement_json, context=RECORDED)


class MeasurementStore:
    """spectune's table of full measurements and failures, beside Optuna's tables.

    Safe to use from several processes and machines at once (each write is one transaction;
    ``trial_id`` is unique, so a trial is recorded once).
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self._engine = _engine(url)
        try:
            with _schema_lock(url):
                _metadata.create_all(self._engine)
                self._check_schema_version()
        except SQLAlchemyError as e:
            raise StorageError(_describe(url, e)) from e

    def _check_schema_version(self) -> None:
        """Record :data:`SCHEMA_VERSION` in a new database; refuse one written by a newer spectune."""
        with self._engine.begin() as conn:
            stored = conn.execute(sa.select(meta_table.c.value).where(meta_table.c.key == "schema_version")).scalar()
            if stored is None:
                conn.execute(sa.insert(meta_table).values(key="schema_version", value=str(SCHEMA_VERSION)))
            elif int(stored) > SCHEMA_VERSION:
                raise StorageError(
                    f"storage {safe_url(self.url)} holds spectune tables of schema "
                    f"version {stored}; this spectune reads up to version {SCHEMA_VERSION}: upgrade spectune")

    def record(
        self, *, study_name: str, trial_id: int, trial_number: int, spec_key: str,
        measurement: Measurement | None = None, error: str | None = None,
    ) -> None:
        """Store a trial's measurement (state COMPLETE) or its failure (state FAIL)."""
        row: dict[str, Any] = {
            "study_name": study_name, "trial_id": trial_id, "trial_number": trial_number,
            "created_at": dt.datetime.now(dt.timezone.utc), "spec_key": spec_key,
            "state": "COMPLETE" if measurement is not None else "FAIL", "error": error,
            "measurement": measurement.model_dump_json() if measurement is not None else None,
        }
        self._replace(trials_table, trials_table.c.trial_id == trial_id, row)

    def trials(self, study_name: str) -> list[StoredTrial]:
        """Every stored trial of a study, in trial order."""
        q = sa.select(trials_table).where(trials_table.c.study_name == study_name).order_by(
            trials_table.c.trial_number)
        return [
            StoredTrial(study_name=r.study_name, trial_id=r.trial_id, trial_number=r.trial_number,
                        spec_key=r.spec_key, state=r.state, error=r.error, measurement_json=r.measurement)
            for r in self._rows(q)
        ]

    def save_definition(self, study_name: str, definition: dict[str, Any]) -> None:
        """Store (or replace) what a worker needs to join ``study_name`` (:data:`studies_table`)."""
        row = {"study_name": study_name, "updated_at": dt.datetime.now(dt.timezone.utc),
               "definition": json.dumps(definition)}
        self._replace(studies_table, studies_table.c.study_name == study_name, row)

    def definition(self, study_name: str) -> dict[str, Any] | None:
        """What :meth:`save_definition` stored for ``study_name``, or None (a study of an earlier spectune)."""
        rows = self._rows(sa.select(studies_table.c.definition).where(studies_table.c.study_name == study_name))
        return json.loads(rows[0].definition) if rows else None

    def trial_ids(self, study_name: str) -> dict[int, int]:
        """Trial number -> trial id of the trials of ``study_name`` recorded here (the newest row
        of a number, should a study of that name have been deleted and made again)."""
        q = sa.select(trials_table.c.trial_number, trials_table.c.trial_id).where(
            trials_table.c.study_name == study_name).order_by(trials_table.c.id)
        return {r.trial_number: r.trial_id for r in self._rows(q)}

    def measurement(self, trial_id: int | None) -> Measurement | None:
        """The Measurement of trial ``trial_id``; None when it has none (failed, not run here)."""
        if trial_id is None:
            return None
        rows = self._rows(sa.select(trials_table.c.measurement).where(trials_table.c.trial_id == trial_id))
        if not rows or rows[0].measurement is None:
            return None
        from spectune.config import RECORDED
        from spectune.measurement import Measurement

        return Measurement.model_validate_json(rows[0].measurement, context=RECORDED)

    # -- one place for the transactions and the errors -------------------------------------------
    def _replace(self, table: sa.Table, where: sa.ColumnElement[bool], row: dict[str, Any]) -> None:
        """Delete the rows ``where`` matches and insert ``row``, in one transaction."""
        try:
            with self._engine.begin() as conn:
                conn.execute(sa.delete(table).where(where))
                conn.execute(sa.insert(table).values(**row))
        except SQLAlchemyError as e:
            raise StorageError(_describe(self.url, e)) from e

    def _rows(self, query: sa.Select[Any]) -> list[sa.Row[Any]]:
        try:
            with self._engine.connect() as conn:
                return list(conn.execute(query).all())
        except SQLAlchemyError as e:
            raise StorageError(_describe(self.url, e)) from e


# -- outages: the one place that tries a running worker's storage calls again -------------------

DEFAULT_OUTAGE_LIMIT = 600.0
"""Seconds a running worker waits for its storage to answer again before it stops (10 minutes;
a study's ``storage_outage_limit``)."""

_SQLITE_BUSY = ("database is locked", "database table is locked", "database schema is locked", "database is busy")

T = TypeVar("T")


def is_transient(err: BaseException) -> bool:
    """Whether ``err`` says that the storage cannot be reached now, rather than that a request
    is wrong: a PostgreSQL connection refused, lost or terminated, a server shutting down or
    starting up (SQLAlchemy's and the driver's OperationalError, a connection SQLAlchemy
    invalidated, the pool's timeout), a SQLite file busy or locked by another process. Optuna's
    StorageInternalError and spectune's StorageError are looked through to the error they were
    raised from (``raise ... from``); SQLite's other operational errors (no such table, a
    read-only file) are not transient."""
    seen: set[int] = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, sa.exc.DBAPIError) and e.connection_invalidated:
            return True
        if isinstance(e, sa.exc.DisconnectionError | sa.exc.TimeoutError):
            return True
        driver = e.orig if isinstance(e, sa.exc.DBAPIError) else e
        if isinstance(e, sa.exc.OperationalError) or _is_operational(driver):
            if type(driver).__module__.startswith("sqlite3"):
                return any(busy in str(driver).lower() for busy in _SQLITE_BUSY)
            return True
        e = e.__cause__
    return False


def _is_operational(err: BaseException | None) -> bool:
    """A DB-API driver's OperationalError (psycopg's, sqlite3's), which SQLAlchemy did not wrap."""
    return err is not None and any(c.__name__ == "OperationalError" and c.__module__.split(".")[0] in
                                   ("psycopg", "psycopg2", "sqlite3") for c in type(err).__mro__)


class StorageGuard:
    """Carries a running worker's storage calls through an outage: PostgreSQL stopped or
    restarting, its host unreachable, a SQLite file locked by another process.

    :meth:`call` runs a call and, while its error is transient (:func:`is_transient`), runs it
    again after a pause that doubles from 0.5 s to 5 s, until it answers. An outage is the
    process's: it starts at the first transient failure any call sees (a heartbeat's too, noted
    with :meth:`failed`) and ends at the first success after it; a warning names it when it
    starts and when it ends. Once it has lasted ``limit`` seconds the guard gives up for good:
    that call, and every later one, raises :class:`~spectune.errors.StorageUnreachableError`, a
    line naming the storage (password masked) and what was waiting for it.

    Contract for the calls given to :meth:`call`: each may be run more than once, so it must
    leave the study as one run would (a write that replaces, a read), or notice on a second run
    what its first did. Errors that are not transient go through at once: SQLAlchemy's and
    Optuna's storage errors as :class:`~spectune.errors.StorageError`, others unchanged.

    Thread-safe: the slots of a worker and their heartbeat threads share one guard.
    """

    first_delay = 0.5
    max_delay = 5.0

    def __init__(self, url: str, limit: float = DEFAULT_OUTAGE_LIMIT, *,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        self.url = url
        self.limit = limit
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._up_since: float | None = None
        self._last: BaseException | None = None
        self.gave_up: StorageUnreachableError | None = None
        """The error this guard gave up with; every call raises it from then on."""

    def call(self, what: str, fn: Callable[[], T], *, stoppable: bool = False) -> T:
        """``fn()``, run again while the storage is unreachable. ``what`` names the call in the
        error (``"recording trial 3"``). ``stoppable``: a polite stop (:data:`~spectune._util.STOPS`)
        may land in the pauses between tries (a call that leaves nothing half-written).

        Raises:
            StorageUnreachableError: the outage has lasted ``limit`` seconds, or the guard had given up.
            StorageError: a storage error that trying again does not mend.
        """
        delay = self.first_delay
        while True:
            if self.gave_up is not None:
                raise self.gave_up
            try:
                result = fn()
            except Exception as e:
                if not self.failed(e):
                    if isinstance(e, SQLAlchemyError) or type(e).__name__ == "StorageInternalError":
                        raise StorageError(_describe(self.url, e)) from e
                    raise
                if (err := self.expired(what)) is not None:
                    raise err from e
                pause = max(0.01, min(delay * random.uniform(0.8, 1.2), self._remaining()))
                if stoppable:
                    with STOPS.waiting():
                        self._sleep(pause)
                else:
                    self._sleep(pause)
                delay = min(2 * delay, self.max_delay)
                continue
            self.succeeded()
            return result

    def failed(self, err: BaseException) -> bool:
        """Note ``err`` from a storage call made elsewhere (a heartbeat); True when it is
        transient (the outage starts, or goes on), False when it says something else."""
        if not is_transient(err):
            return False
        with self._lock:
            self._last = err
            if self._down_since is None:
                self._down_since = self._clock()
                _logger.warning("storage %s unreachable (%s); waiting up to %s for it before this worker stops",
                                safe_url(self.url), _first_line(self.url, err), _seconds(self.limit))
        return True

    def succeeded(self) -> None:
        """Note that a storage call answered: an outage, if there was one, ends here."""
        with self._lock:
            if self._down_since is None:
                return
            now = self._clock()
            _logger.warning("storage %s reachable again after %s", safe_url(self.url),
                            _seconds(now - self._down_since))
            self._down_since, self._up_since = None, now

    def expired(self, what: str) -> StorageUnreachableError | None:
        """The error to stop with once the outage has lasted ``limit`` seconds (the guard gives
        up for good); None while the storage answers or the outage is shorter."""
        with self._lock:
            if self.gave_up is not None:
                return self.gave_up
            if self._down_since is None or self._clock() - self._down_since < self.limit:
                return None
            last = _first_line(self.url, self._last) if self._last is not None else "no answer"
            self.gave_up = StorageUnreachableError(
                f"storage {safe_url(self.url)} unreachable for {_seconds(self._clock() - self._down_since)} "
                f"(storage_outage_limit {_seconds(self.limit)}) while {what}: {last}; the worker stopped its engines")
            return self.gave_up

    def settled(self, seconds: float) -> bool:
        """Whether the storage answers and has answered for ``seconds`` since the last outage
        (or never failed): long enough for every live worker to have beaten its heartbeat again."""
        with self._lock:
            return self._down_since is None and (self._up_since is None or self._clock() - self._up_since >= seconds)

    def _remaining(self) -> float:
        with self._lock:
            since = self._down_since
        return self.limit if since is None else self.limit - (self._clock() - since)


def _seconds(value: float) -> str:
    return f"{value:.0f} s" if value < 120 else f"{value / 60:.1f} min".replace(".0 min", " min")
