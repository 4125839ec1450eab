"""GPU memory an engine takes, in terms that differ between configurations.

vLLM takes ``gpu_memory_utilization`` of each device whatever the configuration needs, so the
memory its processes hold says nothing about a candidate; and in a container or on MIG the
PIDs ``nvidia-smi`` names are not the engine's. The figures here are the engine's own account
of its weights (target and draft: "Model loading took X GiB memory", one line per worker) and,
where it gives none, the memory its devices hold beyond what they held before it started, read
by device rather than by process.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence

__all__ = ["device_memory_used", "weights_from_log"]

_LOADED = re.compile(r"^(?:\((?P<proc>[^)]*?)(?: pid=\d+)?\) )?.*Model loading took (?P<gib>[\d.]+) GiB memory")
"""vLLM's ``gpu_model_runner.load_model``: each worker (one per tensor-parallel rank) loads its
share of the target's and the draft's weights and says how much device memory that took."""


def weights_from_log(lines: Sequence[str]) -> int | None:
    """Bytes of the weights the engine loaded, summed over its workers (the last figure of each,
    a restarted worker counting once); None where the log does not say."""
    by_worker: dict[str, float] = {}
    for line in lines:
        if (m := _LOADED.search(line.strip())) is not None:
            by_worker[m.group("proc") or ""] = float(m.group("gib"))
    return round(sum(by_worker.values()) * 2**30) if by_worker else None


def device_memory_used(smi: str, visible: str | None) -> int | None:
    """Bytes of memory in use on the GPUs ``visible`` names (``CUDA_VISIBLE_DEVICES``: indices or
    UUIDs; None: every GPU), summed, as the driver counts it per device; None where
    ``nvidia-smi`` does not answer."""
    only = ["--id=" + visible.strip()] if visible and visible.strip() else []
    try:
        out = subprocess.run([smi, "--query-gpu=memory.used", "--format=csv,noheader,nounits", *only],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    try:
        return sum(int(float(line)) for line in out.splitlines() if line.strip()) * 2**20
    except ValueError:  # "[N/A]" (a MIG instance on an older driver)
        return None
