"""A stand-in engine for what a real one cannot show on demand: a real process that speaks
vLLM's HTTP protocol (``/health``, ``/metrics``, ``/v1/completions``, streamed with ``usage``).

    python tests/fake_engine.py --model M --host H --port P [--behaviour hang|serve] [...vllm flags]

Behaviours:
- ``hang`` accepts completion requests and never answers.
- ``fail`` exits at once with an error line, as an engine that cannot load its model.
- ``serve`` answers every request with ``max_tokens`` tokens, one chunk each, ``FAKE_ENGINE_TOKEN_MS``
  (default 5) milliseconds apart, and counts them in ``vllm:generation_tokens_total``. Before it
  answers its health check it writes its command line, environment and start time as JSON to
  ``$FAKE_ENGINE_RECORD/<pid>.json`` when that folder is set (what GPU placement tests read),
  and notes its stop time there when it is stopped (SIGTERM).

With ``FAKE_ENGINE_BUSY_STARTS=N`` (and the record folder set), the first N starts exit at once
with vLLM's refusal to start on a device whose memory is not yet free.

As vLLM's server does, it answers ``/v1`` requests only with ``Authorization: Bearer KEY`` when
``VLLM_API_KEY`` is set (HTTP 401 otherwise); ``/health`` and ``/metrics`` are open.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

from aiohttp import web


def _record(update: dict[str, object]) -> None:
    folder = os.environ.get("FAKE_ENGINE_RECORD")
    if not folder:
        return
    path = Path(folder) / f"{os.getpid()}.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update(update)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--behaviour", default=os.environ.get("FAKE_ENGINE_BEHAVIOUR", "hang"))
    args, _ = parser.parse_known_args()
    token_seconds = float(os.environ.get("FAKE_ENGINE_TOKEN_MS", "5")) / 1000.0
    if args.behaviour == "fail":
        print(f"OSError: {args.model} does not appear to have a file named config.json", flush=True)
        raise SystemExit(1)
    busy = int(os.environ.get("FAKE_ENGINE_BUSY_STARTS", "0"))
    if busy and (folder := os.environ.get("FAKE_ENGINE_RECORD")):
        count = Path(folder) / "busy-starts"
        refused = int(count.read_text()) if count.exists() else 0
        if refused < busy:
            count.write_text(str(refused + 1))
            print("ValueError: Free memory on device (3.1/79.2 GiB) on startup is less than desired GPU memory "
                  "utilization (0.9, 71.28 GiB). Decrease GPU memory utilization or reduce GPU memory used by "
                  "other processes.", flush=True)
            raise SystemExit(1)
    generated = 0

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="")

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=f'vllm:generation_tokens_total{{model_name="{args.model}",engine="0"}} {generated}\n',
                            content_type="text/plain")

    async def hang(_: web.Request) -> web.Response:
        await asyncio.sleep(10**6)
        return web.Response(status=500)

    async def serve(request: web.Request) -> web.StreamResponse:
        nonlocal generated
        body = await request.json()
        n = int(body.get("max_tokens") or 16)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(n):
            await asyncio.sleep(token_seconds)
            generated += 1
            chunk = {"choices": [{"index": 0, "text": f" t{i}", "token_ids": [i + 1],
                                  "finish_reason": "length" if i == n - 1 else None}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        usage = {"choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n}}
        await resp.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        return resp

    answer = serve if args.behaviour == "serve" else hang
    key = os.environ.get("VLLM_API_KEY")

    @web.middleware
    async def authenticate(request: web.Request, handler):  # noqa: ANN001, ANN202 - vLLM's AuthenticationMiddleware
        if key and request.path.startswith("/v1") and request.headers.get("Authorization") != f"Bearer {key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    app = web.Application(middlewares=[authenticate])
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", answer)
    app.router.add_post("/v1/chat/completions", answer)
    _record({"pid": os.getpid(), "argv": sys.argv[1:], "env": dict(os.environ), "started": time.time()})

    def stopped(*_: object) -> None:
        _record({"stopped": time.time()})
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stopped)
    print(f"fake engine for {args.model} on {args.host}:{args.port}, behaviour {args.behaviour}", flush=True)
    web.run_app(app, host=args.host, port=args.port, print=None, handle_signals=False)


if __name__ == "__main__":
    main()
