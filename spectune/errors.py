"""spectune's exception tree.

Every error spectune raises on purpose derives from :class:`SpectuneError`. Foreign errors
(pydantic, SQLAlchemy, aiohttp, OS errors) are translated at the border with ``raise ... from e``
so that the CLI can turn them into one line and an exit code.

- :class:`ConfigError`: bad input from the user (a configuration, a file, a flag). Nothing was
  started and nothing was written. CLI exit code 2.
- :class:`EngineError`: an inference engine did not do its job (did not start, crashed, hung).
  Carries the engine's own reason (the last lines of its log). CLI exit code 1; inside a study
  it makes the trial FAIL and the study goes on.
- :class:`StorageError`: the study storage cannot be reached or used. CLI exit code 2.
  :class:`StorageUnreachableError`: a running worker's storage stayed unreachable past its
  ``storage_outage_limit`` (:class:`spectune.storage.StorageGuard`).
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "EngineCrashedError",
    "EngineError",
    "EngineStartError",
    "EngineTimeoutError",
    "SpectuneError",
    "StorageError",
    "StorageUnreachableError",
]


class SpectuneError(Exception):
    """Base class of every error spectune raises on purpose."""

    exit_code: int = 1


class ConfigError(SpectuneError, ValueError):
    """Invalid user input: a configuration, file or flag. Raised before anything starts."""

    exit_code = 2


class StorageError(SpectuneError):
    """The study storage cannot be reached or is not usable."""

    exit_code = 2


class StorageUnreachableError(StorageError):
    """A worker's storage stayed unreachable (down, or a SQLite file locked) past the worker's
    limit; the worker stops its engines and exits. Its message is one line naming the storage."""


class EngineError(SpectuneError):
    """An engine failed. ``reason`` is a one-line summary, ``log_tail`` the engine's last lines."""

    def __init__(self, reason: str, *, log_tail: str = "", log_path: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.log_tail = log_tail
        self.log_path = log_path

    def __str__(self) -> str:
        return self.reason


class EngineStartError(EngineError):
    """The engine exited or reported an error before it became healthy."""


class EngineCrashedError(EngineError):
    """The engine died while it was serving the workload."""


class EngineTimeoutError(EngineError):
    """The engine did not become healthy, or did not answer, within the allowed time."""
