"""spectune's exception tree.

Every error spectune raises on purpose derives from :class:`SpectuneError`. Foreign errors
(pydantic, SQLAlchemy, aiohttp, OS errors) are translated at the border with ``raise ... from e``
so that the CLI can turn them into one line and an exit code.

- :class:`ConfigError`: bad input from the user (a configuration, a file, a flag). Nothing was
  started and nothing was written. CLI exit code 2.
- :class:`EngineError`: an inference engine did not do its job (did not start, crashed, hung).
  Carries the engine's own reason (the last lines of its log). CLI exit code 1; inside a study
  it makes the trial FAIL and the study goes on. :class:`EngineSlotError`: it failed for a
  reason of its slot (devices, port, model access), not of its configuration: the trial is
  handed back. :class:`BaselineFailedError`: the baseline failed, so the study stops.
- :class:`StorageError`: the study storage cannot be reached or used. CLI exit code 2.
  :class:`StorageUnreachableError`: a running worker's storage stayed unreachable past its
  ``storage_outage_limit`` (:class:`spectune.storage.StorageGuard`).
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "EngineCrashedError",
    "BaselineFailedError",
    "EngineError",
    "EngineSlotError",
    "EngineStartError",
    "EngineTimeoutError",
    "SlotsLostError",
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


class EngineSlotError(EngineStartError):
    """The engine did not start for a reason of its slot or environment (``cause``: devices,
    NCCL, port, memory held by another process, model access), not of its configuration: the
    trial is handed back, uncounted, for another slot or a retry."""

    def __init__(self, reason: str, *, cause: str, log_tail: str = "", log_path: str | None = None) -> None:
        super().__init__(reason, log_tail=log_tail, log_path=log_path)
        self.cause = cause


class BaselineFailedError(EngineError):
    """The baseline (no speculation) failed for a reason of its own configuration: nothing can
    be compared with it, so the study stops (one line, CLI exit code 1)."""


class SlotsLostError(EngineError):
    """Every slot of a worker was taken out of the study, each after two engines in a row failed
    for reasons of the slot: the worker stops (one line, CLI exit code 1)."""
