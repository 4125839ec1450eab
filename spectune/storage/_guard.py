"""A worker's calls to its storage carried through an outage (:class:`StorageGuard`)."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError

from spectune._util import STOPS
from spectune.errors import StorageError, StorageUnreachableError
from spectune.storage._urls import _describe, _first_line, safe_url

_logger = logging.getLogger("spectune.storage")

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
