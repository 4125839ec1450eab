"""What an engine's log says about why it failed: one line for a person, and whose fault it was.

An engine that does not start for a reason of its slot or environment (devices missing or busy,
CUDA or NCCL failing to initialise, a port taken, a target model it may not read, memory the
previous engine has not given back) says nothing about its speculative configuration: the
worker hands such a trial back instead of recording it as the candidate's result. Everything
else (out of memory with this configuration, a draft that does not fit, a crash in the proposer)
is the candidate's. The patterns are the messages of CUDA builds of torch, NCCL, vLLM and the
Hugging Face hub, as their logs print them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["MEMORY_BUSY", "slot_fault", "summarize_failure"]

_ERROR_LINE = re.compile(r"\b([A-Za-z_.]*(?:Error|Exception|Exit)): (.+)$")

MEMORY_BUSY = re.compile(r"(?:Free|Available) memory on (?:device|node)\b.*\bis less than "
                         r"(?:desired (?:GPU|CPU) memory utilization|the engine's budget)")
"""vLLM's refusal to start when its device holds less free memory than ``gpu_memory_utilization``
asks for: "Free memory on device (x/y GiB) on startup is less than desired GPU memory utilization"
(``v1/worker/gpu_worker.py``, 0.9.1 to 0.13), "Free memory on device cuda:0 (...)" with the device
named (``v1/worker/utils.py::request_memory``, 0.14 on), "... less than the engine's budget after
excluding external process's weights" (0.32 on), and the CPU build's "Available memory on node 0
... is less than desired CPU memory utilization". Checked before the model loads, so it says
nothing about the configuration: most often the previous engine on these devices has not given
its memory back yet."""

_CANDIDATE = re.compile(r"OutOfMemoryError|CUDA out of memory|No available memory for the cache blocks"
                        r"|larger than the maximum number of tokens that can be stored in KV cache")
"""What the configuration itself causes, checked first: an engine out of memory with a draft loaded
may also print NCCL errors from its peers, which are not the slot's fault then."""

_SLOT: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("devices", re.compile(
        r"No CUDA GPUs are available|CUDA error: (?:invalid device ordinal|no CUDA-capable device is detected"
        r"|CUDA-capable device\(s\) is/are busy or unavailable|system not yet initialized"
        r"|uncorrectable ECC error encountered|peer access is not supported between these two devices"
        r"|CUDA driver version is insufficient for CUDA runtime version|unknown error)"
        r"|CUDA driver initialization failed|Unexpected error from cudaGetDeviceCount\(\)"
        r"|Failed to initialize NVML|Failed to infer device type")),
    ("NCCL", re.compile(r"\bncclSystemError\b|\bncclUnhandledCudaError\b|\bncclInternalError\b|\bncclRemoteError\b"
                        r"|\bDistBackendError\b|NCCL error in: ")),
    ("port", re.compile(r"\[Errno 98\].*[Aa]ddress already in use")),
    ("memory held by another process", MEMORY_BUSY),
    ("model access", re.compile(
        r"GatedRepoError|Cannot access gated repo|You are trying to access a gated repo|RepositoryNotFoundError|Repository Not Found for url"
        r"|LocalEntryNotFoundError|OfflineModeIsEnabled|couldn't connect to 'https://huggingface\.co'"
        r"|Invalid repository ID or local directory specified|Repo id must be in the form")),
)
"""The slot's faults by cause, each tried in turn on the log's last lines."""


def slot_fault(log_lines: Sequence[str], draft: str | None = None) -> str | None:
    """The cause (``"devices"``, ``"NCCL"``, ``"port"``, ``"memory held by another process"``,
    ``"model access"``) when the engine that wrote ``log_lines`` failed for a reason of its slot
    or environment; None when the candidate caused it or the log does not say. A model the
    engine may not read is the slot's fault when it is the target; the candidate's when the
    lines name its ``draft`` (a hub name or path)."""
    text = "\n".join(log_lines)
    if _CANDIDATE.search(text):
        return None
    for cause, pattern in _SLOT:
        if (m := pattern.search(text)) is None:
            continue
        if cause == "model access" and draft and _names(text, m.start(), draft):
            return None
        return cause
    return None


def _names(text: str, at: int, model: str) -> bool:
    """Whether the lines around position ``at`` (the error and its traceback's message) name ``model``."""
    start = text.rfind("\n", 0, max(0, at - 2000)) + 1
    return model in text[start:at + 2000]


# Errors that only wrap the real cause ("see root cause above"): skipped when a cause is there.
_WRAPPERS = ("root cause above", "initialization failed", "died unexpectedly", "EngineDeadError")


def summarize_failure(log_lines: list[str]) -> str:
    """One line out of an engine log: the last ``SomethingError: message`` that is a root cause
    (not a wrapper such as "Engine core initialization failed"), else the last line."""
    errors = [f"{m.group(1)}: {m.group(2)}" for line in log_lines if (m := _ERROR_LINE.search(line.strip()))]
    causes = [e for e in errors if not any(w in e for w in _WRAPPERS)]
    if causes or errors:
        return (causes or errors)[-1][:400]
    for line in reversed(log_lines):
        if line.strip():
            return line.strip()[:400]
    return "the engine exited without a message"
