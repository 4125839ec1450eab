"""Where an engine listens: a free port chosen for it, and a word when its address reaches
beyond this machine."""

from __future__ import annotations

import logging
import socket

from spectune._util import is_loopback

__all__ = ["PORT_RETRIES", "free_port", "warn_if_exposed"]

_logger = logging.getLogger(__name__)


PORT_RETRIES = 2
"""Times an engine is started again on a new port when the one found free was taken before the
engine bound it (another process, or another engine started at the same moment)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (an IPv4 or IPv6 address, or a name)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
    with socket.socket(family, kind, proto) as s:
        s.bind(address)
        return int(s.getsockname()[1])


_warned_hosts: set[str] = set()


def warn_if_exposed(host: str) -> None:
    """Say once per address that an engine listens beyond this machine (``host`` set by the user)."""
    if not is_loopback(host) and host not in _warned_hosts:
        _warned_hosts.add(host)
        _logger.warning("engines listen on %s (the engine's host), reachable from other machines: their /metrics "
                        "and /health are open there; their API takes only each engine's own key", host)
