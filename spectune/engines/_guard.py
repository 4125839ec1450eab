"""The engine's door: an ASGI middleware that vLLM's server loads (``--middleware``) so that every
request but ``/health`` and ``/metrics`` needs the engine's API key (``VLLM_API_KEY``).

vLLM's own check of that key guards ``/v1``, ``/v2``, ``/inference`` and ``/cohere`` only; other
routes of its server (SageMaker's ``/invocations``, which generates text, ``/tokenize``, ``/pause``
in development mode) answer anyone who reaches the port, another user of the host included. It
runs in the engine's process: the standard library only, and nothing per request beyond one hash.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = ("/health", "/metrics")
"""What spectune reads without a key: the health check and the Prometheus counters."""

GUARD = f"{__name__}.RequireKey"
"""The import path given to ``vllm serve --middleware``."""


class RequireKey:
    """Refuse (HTTP 401, as vLLM's own check) every request outside :data:`OPEN_PATHS` whose
    ``Authorization`` is not ``Bearer`` the key in ``VLLM_API_KEY``; with no key set, let all in."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        key = os.environ.get("VLLM_API_KEY", "")
        self.digest = hashlib.sha256(key.encode()).digest() if key else None

    def _open(self, scope: Scope) -> bool:
        if self.digest is None or scope["type"] not in ("http", "websocket") or scope.get("method") == "OPTIONS":
            return True
        path = str(scope["path"]).removeprefix(str(scope.get("root_path", "")))
        if any(path == p or path.startswith(p + "/") for p in OPEN_PATHS):
            return True
        headers = dict(scope.get("headers") or [])
        scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(hashlib.sha256(token.encode()).digest(), self.digest)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._open(scope):
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
        else:
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": b'{"error":"Unauthorized"}'})
