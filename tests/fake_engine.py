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
  and notes its stop time there when it is stopped (SIGTERM); with ``FAKE_ENGINE_RECORD_CLIENTS=1``
the processes that sent it requests too (``clients``, by their sockets' owners).

With ``FAKE_ENGINE_BUSY_STARTS=N`` (and the record folder set), the first N starts exit at once
with vLLM's refusal to start on a device whose memory is not yet free.

As a GPU engine: ``FAKE_ENGINE_WEIGHTS_GIB`` (and ``FAKE_ENGINE_DRAFT_GIB`` for a speculative
configuration with a model) prints vLLM's "Model loading took X GiB memory" once per
tensor-parallel worker; ``FAKE_ENGINE_GPU_MIB`` holds that much memory on each device of its
``CUDA_VISIBLE_DEVICES`` while it runs, as tests/fake_nvidia_smi.py reads it
(``$FAKE_SMI_STATE/<device>.used``).

With ``FAKE_ENGINE_FAULT=NAME`` (a key of :data:`FAULTS`) it exits at once with the log lines a
CUDA build of vLLM prints for that failure, message for message; only where its
``CUDA_VISIBLE_DEVICES`` is ``FAKE_ENGINE_FAULT_GPUS`` and its ``--speculative-config`` holds
``FAKE_ENGINE_FAULT_SPEC`` (``none``: an engine without speculation), when those are set.

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

_CORE = "(EngineCore_DP0 pid=4242) ERROR 12-07 10:00:01 [core.py:866] "
_CUDA_HINT = [
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
]
_WRAPPED = "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"

FAULTS: dict[str, list[str]] = {
    # CUDA_VISIBLE_DEVICES names a GPU the machine (or the container) does not have
    "invalid device": [_CORE + "EngineCore failed to start.", _CORE + "Traceback (most recent call last):",
                       _CORE + '  File ".../vllm/v1/worker/gpu_worker.py", line 213, in init_device',
                       _CORE + "    torch.cuda.set_device(self.device)",
                       _CORE + "torch.AcceleratorError: CUDA error: invalid device ordinal",
                       *(_CORE + h for h in _CUDA_HINT), _WRAPPED],
    "no gpus": [_CORE + "Traceback (most recent call last):", _CORE + "RuntimeError: No CUDA GPUs are available", _WRAPPED],
    # another job holds a GPU in exclusive-process mode
    "busy": [_CORE + "Traceback (most recent call last):",
             _CORE + "torch.AcceleratorError: CUDA error: CUDA-capable device(s) is/are busy or unavailable",
             *(_CORE + h for h in _CUDA_HINT), _WRAPPED],
    # a broken peer link between the group's GPUs, seen by NCCL at the first all-reduce
    "nccl": ["(Worker_TP1 pid=4251) ERROR 12-07 10:00:01 [multiproc_executor.py:702] WorkerProc failed to start.",
             "(Worker_TP1 pid=4251) ERROR 12-07 10:00:01 [multiproc_executor.py:702] torch.distributed.DistBackendError: "
             "NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, unhandled system error "
             "(run with NCCL_DEBUG=INFO for details), NCCL version 2.27.3",
             "(Worker_TP1 pid=4251) ERROR 12-07 10:00:01 [multiproc_executor.py:702] ncclSystemError: System call "
             "(e.g. socket, malloc) or external library call failed or device error. ",
             "(Worker_TP1 pid=4251) ERROR 12-07 10:00:01 [multiproc_executor.py:702] Last error:",
             "(Worker_TP1 pid=4251) ERROR 12-07 10:00:01 [multiproc_executor.py:702] Cuda failure 'peer access is not "
             "supported between these two devices'", _WRAPPED],
    "port": ["(APIServer pid=4200) Traceback (most recent call last):",
             '(APIServer pid=4200)   File ".../vllm/entrypoints/openai/api_server.py", line 1620, in create_server_socket',
             "(APIServer pid=4200)     sock.bind(addr)", "(APIServer pid=4200) OSError: [Errno 98] Address already in use"],
    # the target is gated and no token is set (transformers' wrapping of the hub's GatedRepoError)
    "gated": ["(APIServer pid=4200) Traceback (most recent call last):",
              "(APIServer pid=4200) huggingface_hub.errors.GatedRepoError: 401 Client Error. (Request ID: Root=1-6754)",
              "(APIServer pid=4200) Cannot access gated repo for url "
              "https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct/resolve/main/config.json.",
              "(APIServer pid=4200) Access to model meta-llama/Llama-3.1-8B-Instruct is restricted. You must have access "
              "to it and be authenticated to access it. Please log in.",
              "(APIServer pid=4200) OSError: You are trying to access a gated repo.",
              "(APIServer pid=4200) Make sure to have access to it at https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct."],
    # the configuration's own: a draft that does not fit beside the target
    "oom": [_CORE + "Traceback (most recent call last):",
            _CORE + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB. GPU 0 has a total capacity "
                    "of 79.19 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 78.16 GiB "
                    "memory in use.", _WRAPPED],
}
"""What a CUDA build of vLLM 0.32 prints when it cannot start, by failure: the last lines of its log."""


def _faulty(argv: list[str]) -> list[str] | None:
    """The lines of ``FAKE_ENGINE_FAULT`` where it applies to this engine (see the module docstring)."""
    fault = os.environ.get("FAKE_ENGINE_FAULT")
    if not fault:
        return None
    gpus = os.environ.get("FAKE_ENGINE_FAULT_GPUS")
    if gpus is not None and os.environ.get("CUDA_VISIBLE_DEVICES") != gpus:
        return None
    if (spec := os.environ.get("FAKE_ENGINE_FAULT_SPEC")) is not None:
        given = argv[argv.index("--speculative-config") + 1] if "--speculative-config" in argv else "none"
        if spec not in given:
            return None
    return FAULTS[fault]


def _load_weights(argv: list[str]) -> None:
    """As a GPU engine loads its model: the device memory it holds, and the log line per worker."""
    devices = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    if (mib := os.environ.get("FAKE_ENGINE_GPU_MIB")) and (state := os.environ.get("FAKE_SMI_STATE")):
        for device in devices:
            Path(state, f"{device}.used").write_text(mib)
    if (gib := os.environ.get("FAKE_ENGINE_WEIGHTS_GIB")) is None:
        return
    spec = argv[argv.index("--speculative-config") + 1] if "--speculative-config" in argv else "{}"
    total = float(gib) + (float(os.environ.get("FAKE_ENGINE_DRAFT_GIB", "0")) if '"model"' in spec else 0.0)
    tp = int(argv[argv.index("--tensor-parallel-size") + 1]) if "--tensor-parallel-size" in argv else 1
    for rank in range(tp):
        print(f"(Worker_TP{rank} pid={4300 + rank}) INFO 12-07 10:00:03 [gpu_model_runner.py:5150] Model loading "
              f"took {total / tp:.4f} GiB memory and 3.141593 seconds", flush=True)


def _release_devices() -> None:
    if os.environ.get("FAKE_ENGINE_GPU_MIB") and (state := os.environ.get("FAKE_SMI_STATE")):
        for device in filter(None, os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")):
            Path(state, f"{device}.used").unlink(missing_ok=True)


def _note_client(request: web.Request, clients: set[int]) -> None:
    import psutil

    peer = request.transport.get_extra_info("peername") if request.transport else None
    if peer is None:
        return
    for conn in psutil.net_connections(kind="tcp"):
        if conn.laddr and conn.laddr.port == peer[1] and conn.pid is not None and conn.pid != os.getpid():
            if conn.pid not in clients:
                clients.add(conn.pid)
                _record({"clients": sorted(clients)})
            return


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
    if (lines := _faulty(sys.argv)) is not None:
        _record({"pid": os.getpid(), "argv": sys.argv[1:], "env": dict(os.environ), "fault": os.environ["FAKE_ENGINE_FAULT"]})
        print("\n".join(lines), flush=True)
        raise SystemExit(1)
    _load_weights(sys.argv)
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

    clients: set[int] = set()

    async def serve(request: web.Request) -> web.StreamResponse:
        nonlocal generated
        if os.environ.get("FAKE_ENGINE_RECORD_CLIENTS") == "1":  # which process sends: by its socket
            _note_client(request, clients)
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
        _release_devices()
        _record({"stopped": time.time()})
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stopped)
    print(f"fake engine for {args.model} on {args.host}:{args.port}, behaviour {args.behaviour}", flush=True)
    web.run_app(app, host=args.host, port=args.port, print=None, handle_signals=False)


if __name__ == "__main__":
    main()
