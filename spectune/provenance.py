"""What produced a result: versions and hardware, read without importing heavy packages."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass

from spectune.engines import cpu_features, detect_platform, vllm_version
from spectune.measurement import CPU_FEATURES, Hardware, Versions

__all__ = ["GpuDevice", "Hardware", "Versions", "gpu_devices", "hardware", "versions"]


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def versions() -> Versions:
    return Versions(
        spectune=_version("spectune") or "unknown",
        vllm=vllm_version(),
        torch=_version("torch"),
        python=platform.python_version(),
    )


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@dataclass(frozen=True)
class GpuDevice:
    """One GPU as ``nvidia-smi`` names it."""

    index: str
    uuid: str
    name: str
    memory: str

    def __str__(self) -> str:
        return f"{self.index}, {self.uuid}, {self.name}, {self.memory}"


def gpu_devices(visible: str | None) -> list[GpuDevice]:
    """The GPUs ``visible`` names (``CUDA_VISIBLE_DEVICES``: host indices or UUIDs; None or
    empty: every GPU), by index, UUID, model and memory; none without ``nvidia-smi``."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    only = ["--id=" + visible.strip()] if visible and visible.strip() else []
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index,uuid,name,memory.total", "--format=csv,noheader", *only],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    devices = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4:
            devices.append(GpuDevice(*parts))
    return devices


@functools.cache
def hardware(visible_gpus: str | None = None) -> Hardware:
    """This machine, with the GPUs ``visible_gpus`` names (``CUDA_VISIBLE_DEVICES``: indices or
    UUIDs; default: this process's own ``CUDA_VISIBLE_DEVICES``, else every GPU)."""
    visible_gpus = visible_gpus if visible_gpus is not None else os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        mem = None
    return Hardware(
        platform=detect_platform().name,
        cpu=_cpu_model(),
        cpu_count=os.cpu_count() or 1,
        memory_bytes=mem,
        gpus=[str(d) for d in gpu_devices(visible_gpus)],
        cpu_features=[x for x in CPU_FEATURES if x in cpu_features()],
    )
