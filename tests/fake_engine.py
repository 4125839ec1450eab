"""A stand-in engine for faults a real one cannot show on demand: a real process that speaks
vLLM's HTTP protocol (``/health``, ``/metrics``, ``/v1/completions``) and then misbehaves.

    python tests/fake_engine.py --model M --host H --port P [--behaviour hang]

Behaviours: ``hang`` accepts completion requests and never answers.
"""

from __future__ import annotations

import argparse
import asyncio

from aiohttp import web


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--behaviour", default="hang")
    args, _ = parser.parse_known_args()

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="")

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text="# no counters\n", content_type="text/plain")

    async def hang(_: web.Request) -> web.Response:
        await asyncio.sleep(10**6)
        return web.Response(status=500)

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", hang)
    app.router.add_post("/v1/chat/completions", hang)
    print(f"fake engine for {args.model} on {args.host}:{args.port}, behaviour {args.behaviour}", flush=True)
    web.run_app(app, host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
