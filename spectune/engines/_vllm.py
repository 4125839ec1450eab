"""vLLM's OpenAI-compatible server as a managed process."""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import httpx

from spectune.config import API_KEY_ENV, EngineArgs, SpecConfig
from spectune.engines._address import PORT_RETRIES, free_port, warn_if_exposed
from spectune.engines._base import EngineServer
from spectune.engines._faults import MEMORY_BUSY, slot_fault, summarize_failure
from spectune.engines._gpu_memory import device_memory_used, weights_from_log
from spectune.engines._guard import GUARD
from spectune.engines._platform import (
    CLIENT_PIN,
    Platform,
    cpu_binding,
    detect_platform,
)
from spectune.errors import EngineSlotError, EngineStartError, EngineTimeoutError

_logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
STOP_TIMEOUT = 7.0
"""Seconds a stopped engine is given to exit after SIGTERM before its group is killed: an evicted
worker (Kubernetes' SIGTERM) must have stopped its engine within 10 s; an engine holds nothing
that a clean exit would save."""

DEFAULT_STARTUP_TIMEOUT = 1800.0
"""Seconds an engine may take to become healthy: loading a 70B checkpoint from network storage,
then compiling and capturing CUDA graphs, takes many minutes."""


def resolve_engine_args(args: EngineArgs, platform: Platform | None = None) -> EngineArgs:
    """``args`` with the platform's defaults filled in where the user set nothing."""
    platform = platform or detect_platform()
    fill = {k: v for k, v in platform.engine_defaults.items() if getattr(args, k) is None}
    env = {**platform.env, **args.env}
    return args.model_copy(update={**fill, "env": env})


def applied_defaults(args: EngineArgs, platform: Platform | None = None) -> dict[str, str]:
    """The platform's defaults that :func:`resolve_engine_args` fills into ``args``, each with
    its value and why it was chosen (recorded with every measurement)."""
    platform = platform or detect_platform()
    return {k: platform.default_reasons.get(k, f"{v}: the {platform.name} build's default")
            for k, v in platform.engine_defaults.items() if getattr(args, k) is None}


def _cli_flags(options: dict[str, Any]) -> list[str]:
    """``{"enforce-eager": True, "dtype": "float32"}`` -> ``["--enforce-eager", "--dtype", "float32"]``."""
    out: list[str] = []
    for name, value in options.items():
        flag = f"--{name}"
        if value is True:
            out.append(flag)
        elif value is False:
            out.append(f"--no-{name}")
        elif isinstance(value, dict):
            out += [flag, json.dumps(value)]
        elif isinstance(value, list | tuple):
            out += [flag, *map(str, value)]
        else:
            out += [flag, str(value)]
    return out


def build_command(
    args: EngineArgs, spec: SpecConfig, port: int, platform: Platform | None = None
) -> list[str]:
    """The full command line that serves ``args.model`` with ``spec`` on ``port``."""
    platform = platform or detect_platform()
    cmd = [*platform.serve_command, args.model]
    cmd += _cli_flags(args.to_vllm_options())
    if (spec_json := spec.to_vllm()) is not None:
        cmd += ["--speculative-config", json.dumps(spec_json)]
    cmd += ["--host", args.host, "--port", str(port)]
    if platform.own_python:  # the routes vLLM's key check leaves open want the key too
        cmd += ["--middleware", GUARD]
    return cmd


def _load_prctl() -> Any:  # noqa: ANN401 - a ctypes function
    """libc's ``prctl``, loaded here in the parent: between fork and exec a child of a
    multi-threaded process may not load a library (the loader's lock may be held by a thread
    that does not exist in the child)."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return None


_PRCTL = _load_prctl()


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Ask the kernel to SIGTERM the engine when spectune dies (Linux), so no engine is orphaned."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)




NOT_INHERITED = frozenset({"VLLM_PORT"})
"""Variables of spectune's environment an engine does not get (the engine's own ``env`` may set
them): ``VLLM_PORT`` is the first of vLLM's internal ports, so engines started side by side with
one value collide; a Kubernetes Service named ``vllm`` sets it to a URL, which vLLM refuses."""


class VLLMServer(EngineServer):
    """``vllm serve`` (or its module entry point) for one target model and one candidate.

    The server runs in its own process session, bound to ``args.host`` (loopback unless the
    user sets another, which is logged once) on a free port, with its own temporary folder; its
    output goes to ``log_path``. Every route but ``/health`` and ``/metrics`` wants :attr:`api_key`
    (vLLM's own check on ``/v1``; :mod:`~spectune.engines._guard` on the others where the engine
    runs in spectune's environment), fresh for each server and given to it in its environment
    (``VLLM_API_KEY``), so that the key is in no command line, log or record, and another user of
    the host can neither send it requests nor disturb a measurement.
    It is stopped by signalling its whole process group, SIGTERM then, after ``stop_timeout``,
    SIGKILL. If the process that started it dies, even by SIGKILL, a watchdog process
    (``_watchdog``) stops the group; the kernel also sends the server SIGTERM then (Linux
    ``PR_SET_PDEATHSIG``).
    """

    def __init__(
        self,
        args: EngineArgs,
        spec: SpecConfig,
        *,
        log_path: Path,
        startup_timeout: float = DEFAULT_STARTUP_TIMEOUT,
        stop_timeout: float = STOP_TIMEOUT,
        port: int | None = None,
        platform: Platform | None = None,
        memory_waits: tuple[float, ...] = (10.0, 30.0, 60.0),
    ) -> None:
        self.platform = platform or detect_platform()
        self.args = resolve_engine_args(args, self.platform)
        self.defaults = applied_defaults(args, self.platform)
        """The platform's defaults filled into ``args``, each with why (:func:`applied_defaults`)."""
        for key, why in self.defaults.items():
            if key in self.platform.default_reasons:
                _logger.info("engine %s %s", key, why)
        self.spec = spec
        self.log_path = Path(log_path)
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.memory_waits = memory_waits
        """Seconds to wait before each new start while the devices' memory is not yet free
        (:data:`MEMORY_BUSY`); the last refusal is the slot's fault (:class:`EngineSlotError`)."""
        warn_if_exposed(self.args.host)
        self._own_port = port is None
        self.port = port if port is not None else free_port(self.args.host)
        self.command = build_command(self.args, spec, self.port, self.platform)
        self._api_key = secrets.token_urlsafe(32)
        self.startup_seconds: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._tmpdir: str | None = None
        self._peak_rss = 0
        self._peak_gpu = 0
        self._on_gpu = self.platform.name == "gpu"
        self._weights: int | None = None
        """Bytes of the weights the engine's workers loaded, as they said (read once it is healthy)."""
        self._gpu_before: int | None = None
        """Memory the engine's devices held before it started (other processes'), read at its launch."""
        self._sampler: threading.Thread | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._sampling = threading.Event()
        self.binding = cpu_binding(self.platform, self.args.tensor_parallel_size, self.args.env)
        """Where the engine's compute threads, its other processes and this client run (None: not pinned)."""
        self._client_pinned = False

    # -- contract -------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        host = self.args.host if self.args.host not in {"0.0.0.0", "::"} else "127.0.0.1"
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"  # IPv6 in brackets

    @property
    def served_model_name(self) -> str:
        return self.args.served_model_name or self.args.model

    @property
    def api_key(self) -> str:
        return self._api_key

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            with self.log_path.open("r", encoding="utf-8", errors="replace") as f:
                return "".join(deque(f, maxlen=lines))
        except OSError:
            return ""

    def failure_reason(self) -> str:
        reason = summarize_failure(self.log_tail(200).splitlines())
        if self._proc is not None and (rc := self._proc.poll()) is not None and rc < 0:
            with contextlib.suppress(ValueError):
                reason = f"killed by {signal.Signals(-rc).name}; last log line: {reason}"
        return reason

    def peak_memory_bytes(self) -> int | None:
        kind = self.memory_kind
        if kind == "gpu_weights":
            return self._weights
        return (self._peak_gpu or None) if kind == "gpu_device" else (self._peak_rss or None)

    @property
    def memory_kind(self) -> str:
        """``gpu_weights`` (the engine's account of its weights, target and draft), ``gpu_device``
        (its devices' memory beyond what they held before it started), or ``host_rss``."""
        if self._weights is not None:
            return "gpu_weights"
        return "gpu_device" if self._peak_gpu else "host_rss"

    def start(self) -> None:
        """Start the engine and wait until it is healthy; an engine refused because its devices'
        memory is not yet free (:data:`MEMORY_BUSY`) is started again after each of
        :attr:`memory_waits`, its log kept. A port this server chose, taken by another process
        between the choice and the engine's bind, is chosen again (up to :data:`PORT_RETRIES` times)."""
        if self._proc is not None:
            raise RuntimeError("this server was already started")
        waits, rebinds = list(self.memory_waits), PORT_RETRIES if self._own_port else 0
        while True:
            try:
                self._launch()
                return
            except EngineStartError as e:
                taken = isinstance(e, EngineSlotError) and e.cause == "port"
                if not (taken and rebinds) and not (waits and MEMORY_BUSY.search(str(e))):
                    raise
                self.stop()
                self._proc = None
                self._sampling = threading.Event()
                if taken:
                    rebinds -= 1
                    before, self.port = self.port, free_port(self.args.host)
                    self.command = build_command(self.args, self.spec, self.port, self.platform)
                    _logger.warning("engine could not bind port %d, taken since it was found free; starting it "
                                    "again on port %d", before, self.port)
                    continue
                wait = waits.pop(0)
                _logger.warning("engine refused to start, its devices' memory is not yet free; starting it again "
                                "in %.0f s: %s", wait, e)
                time.sleep(wait)

    def _launch(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self._on_gpu and (smi := shutil.which("nvidia-smi")) is not None:
            self._gpu_before = device_memory_used(smi, self.args.env.get("CUDA_VISIBLE_DEVICES",
                                                                         os.environ.get("CUDA_VISIBLE_DEVICES")))
        self._tmpdir = tempfile.mkdtemp(prefix="spectune-engine-")
        inherited = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
        env = {**inherited, **(self.binding.env if self.binding else {}), **self.args.env,
               "TMPDIR": self._tmpdir, "PYTHONUNBUFFERED": "1", API_KEY_ENV: self._api_key}
        _logger.info("starting engine: %s", " ".join(self.command))
        t0 = time.monotonic()
        with self.log_path.open("ab") as log:
            log.write(f"# spectune: {json.dumps(self.command)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(  # noqa: S603 - a command we built, no shell
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=self._in_child,  # noqa: PLW1509 - prctl and sched_setaffinity only
            )
        if self.binding is not None:  # the client too: off the engine's compute CPUs while it lives
            CLIENT_PIN.acquire(set(self.binding.frontend))
            self._client_pinned = True
        self._start_watchdog()
        self._start_sampler()
        self._wait_healthy(t0)
        self.startup_seconds = time.monotonic() - t0
        if self._on_gpu:  # the workers said what their weights took while they loaded: read once
            self._weights = weights_from_log(self.log_tail(2000).splitlines())
        _logger.info("engine healthy on %s after %.1f s", self.base_url, self.startup_seconds)

    def _in_child(self) -> None:  # pragma: no cover - runs in the child between fork and exec
        _die_with_parent()
        if self.binding is not None:  # vLLM's worker binds its compute threads itself (the env's list)
            os.sched_setaffinity(0, self.binding.frontend)

    def stop(self) -> None:
        proc = self._proc
        self._sampling.set()
        if self._client_pinned:
            CLIENT_PIN.release()
            self._client_pinned = False
        if proc is not None:
            self._stop_group(proc)
        if self._watchdog is not None:
            with contextlib.suppress(OSError, ValueError):
                assert self._watchdog.stdin is not None
                self._watchdog.stdin.write(b"stop\n")
                self._watchdog.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._watchdog.wait(timeout=5)
            self._watchdog = None
        if self._sampler is not None:
            self._sampler.join(timeout=5)
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    # -- internals ------------------------------------------------------------------------
    def _wait_healthy(self, t0: float) -> None:
        assert self._proc is not None
        deadline = t0 + self.startup_timeout
        with httpx.Client(timeout=2.0) as client:
            while True:
                if self._proc.poll() is not None:
                    reason = f"engine exited with code {self._proc.returncode} before it was healthy: " \
                             f"{self.failure_reason()}"
                    tail = self.log_tail(200)
                    if cause := slot_fault(tail.splitlines(), self.spec.model):
                        raise EngineSlotError(reason, cause=cause, log_tail=tail, log_path=str(self.log_path))
                    raise EngineStartError(reason, log_tail=self.log_tail(), log_path=str(self.log_path))
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.base_url}/health").status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise EngineTimeoutError(
                        f"engine not healthy after {self.startup_timeout:.0f} s; "
                        f"last log line: {summarize_failure(self.log_tail(5).splitlines())}",
                        log_tail=self.log_tail(),
                        log_path=str(self.log_path),
                    )
                time.sleep(0.5)

    def _start_watchdog(self) -> None:
        """A small process that stops the engine's group if this process dies (see _watchdog)."""
        import sys

        assert self._proc is not None
        self._watchdog = subprocess.Popen(  # noqa: S603
            [sys.executable, "-m", "spectune.engines._watchdog", str(self._proc.pid), str(self.stop_timeout)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True,
        )

    def _start_sampler(self) -> None:
        import psutil

        assert self._proc is not None
        root_pid = self._proc.pid

        smi = shutil.which("nvidia-smi") if self._on_gpu else None
        visible = self.args.env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
        before = self._gpu_before

        def sample() -> None:
            try:
                root = psutil.Process(root_pid)
            except psutil.Error:
                return
            beat = 0
            while not self._sampling.is_set():
                total, pids = 0, set()
                with contextlib.suppress(psutil.Error):
                    for p in [root, *root.children(recursive=True)]:
                        with contextlib.suppress(psutil.Error):
                            total += p.memory_info().rss
                            pids.add(p.pid)
                self._peak_rss = max(self._peak_rss, total)
                if smi is not None and beat % 4 == 0 and (used := device_memory_used(smi, visible)) is not None:
                    self._peak_gpu = max(self._peak_gpu, used - (before or 0))  # every 2 s: nvidia-smi costs a process
                beat += 1
                self._sampling.wait(0.5)

        self._sampler = threading.Thread(target=sample, name="spectune-rss", daemon=True)
        self._sampler.start()

    def _stop_group(self, proc: subprocess.Popen[bytes]) -> None:
        import psutil

        pgid = proc.pid  # start_new_session: the server leads its own group
        descendants: list[psutil.Process] = []
        with contextlib.suppress(psutil.Error):
            descendants = psutil.Process(proc.pid).children(recursive=True)
        for sig, grace in ((signal.SIGTERM, self.stop_timeout), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pgid, sig)
                os.killpg(pgid, signal.SIGCONT)  # a stopped (SIGSTOP) engine must run to exit
            except ProcessLookupError:
                break
            for p in descendants:  # any that left the group
                with contextlib.suppress(psutil.Error):
                    if p.is_running() and os.getpgid(p.pid) != pgid:
                        p.send_signal(sig)
            if _wait_group_gone(proc, pgid, grace):
                break
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        psutil.wait_procs(descendants, timeout=5)


def _wait_group_gone(proc: subprocess.Popen[bytes], pgid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc.poll()  # reap the leader so it does not linger as a zombie in the group
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False
