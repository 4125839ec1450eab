"""The engine contract: what spectune needs from an inference server, whatever it is."""

from __future__ import annotations

import abc
from types import TracebackType


class EngineServer(abc.ABC):
    """A running inference server with an OpenAI-compatible HTTP API and Prometheus metrics.

    Used as a context manager: ``__enter__`` starts the server and returns once it is healthy;
    ``__exit__`` stops it and everything it started, on every path (success, error, Ctrl-C).

    Not thread-safe: one owner starts, queries and stops it. ``base_url`` may be shared with
    any number of client coroutines or threads once the server is healthy.

    Raises (from ``start``):
        EngineStartError: the server exited or reported an error before it became healthy;
            the error carries the server's last log lines.
        EngineTimeoutError: it did not become healthy in time (it has been stopped).
    """

    @abc.abstractmethod
    def start(self) -> None:
        """Start the server and wait until it answers its health check."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop the server and every process it started. Idempotent; never raises for a dead server."""

    @property
    @abc.abstractmethod
    def base_url(self) -> str:
        """``http://host:port`` of the running server."""

    @property
    @abc.abstractmethod
    def served_model_name(self) -> str:
        """The model name to put in API requests."""

    @property
    def api_key(self) -> str | None:
        """The key the server's API (``/v1``) wants as ``Authorization: Bearer KEY``; None when it
        wants none. A secret: sent in requests only, never logged nor recorded. ``/health`` and
        ``/metrics`` need no key."""
        return None

    @abc.abstractmethod
    def is_running(self) -> bool:
        """Whether the server process is still alive."""

    @abc.abstractmethod
    def failure_reason(self) -> str:
        """One line saying why the server stopped or failed, from its own log."""

    @abc.abstractmethod
    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the server's log."""

    @abc.abstractmethod
    def peak_memory_bytes(self) -> int | None:
        """What the server takes, in terms that differ between configurations: on GPUs its
        weights (target and draft) as it accounts for them, else its devices' memory beyond
        what they held before it; on a CPU its process tree's largest resident memory
        (:attr:`memory_kind`)."""

    @property
    def memory_kind(self) -> str:
        """What :meth:`peak_memory_bytes` measures: ``gpu_weights``, ``gpu_device`` or ``host_rss``."""
        return "host_rss"

    def __enter__(self) -> EngineServer:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
