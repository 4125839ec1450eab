"""Inference engines: the only code that starts or talks to an engine process."""

from spectune.engines._base import EngineServer
from spectune.engines._faults import MEMORY_BUSY, slot_fault, summarize_failure
from spectune.engines._platform import (
    ARCTIC_ENV,
    PIN_ENV,
    CpuBinding,
    Platform,
    check_runnable,
    cpu_binding,
    cpu_dtype,
    cpu_features,
    detect_platform,
    method_refusal,
    vllm_cli,
    vllm_version,
)
from spectune.engines._vllm import (
    DEFAULT_STARTUP_TIMEOUT,
    STOP_TIMEOUT,
    VLLMServer,
    applied_defaults,
    build_command,
    free_port,
    resolve_engine_args,
)

__all__ = [
    "ARCTIC_ENV",
    "DEFAULT_STARTUP_TIMEOUT",
    "MEMORY_BUSY",
    "PIN_ENV",
    "STOP_TIMEOUT",
    "CpuBinding",
    "EngineServer",
    "Platform",
    "VLLMServer",
    "applied_defaults",
    "build_command",
    "check_runnable",
    "cpu_binding",
    "cpu_dtype",
    "cpu_features",
    "detect_platform",
    "free_port",
    "method_refusal",
    "resolve_engine_args",
    "slot_fault",
    "summarize_failure",
    "vllm_cli",
    "vllm_version",
]
