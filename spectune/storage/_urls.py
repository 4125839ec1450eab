"""Where a study's storage is: its URL resolved once, shown with the password masked, and the
SQLAlchemy engine every part of spectune reaches it through."""

from __future__ import annotations

import functools
import logging
import os
import re
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from spectune.errors import StorageError

_logger = logging.getLogger("spectune.storage")

DEFAULT_STORAGE = "sqlite:///storage/spectune.db"


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


