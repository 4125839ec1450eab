"""Workloads: prompts, sampling and load shape, from files or shipped sets; workload features."""

from spectune.config import SHIPPED_NAMES, ChatMessage, Prompt, Sampling, WorkloadSpec
from spectune.workloads._catalogue import ShippedSet, shipped_sets, shipped_sets_table
from spectune.workloads._features import (
    NGRAM_SIZES,
    LengthStats,
    NgramShares,
    WorkloadFeatures,
    compute_features,
)
from spectune.workloads._loaders import (
    FileFormat,
    detect_format,
    load_custom,
    load_file,
    load_jsonl,
    load_prompts,
    load_sharegpt,
    load_spec_bench,
    select,
)
from spectune.workloads._shipped import shipped_path

__all__ = [
    "NGRAM_SIZES",
    "SHIPPED_NAMES",
    "ChatMessage",
    "FileFormat",
    "LengthStats",
    "NgramShares",
    "Prompt",
    "Sampling",
    "ShippedSet",
    "WorkloadFeatures",
    "WorkloadSpec",
    "compute_features",
    "detect_format",
    "load_custom",
    "load_file",
    "load_jsonl",
    "load_prompts",
    "load_sharegpt",
    "load_spec_bench",
    "select",
    "shipped_path",
    "shipped_sets",
    "shipped_sets_table",
]
