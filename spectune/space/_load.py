"""Finding and loading spaces: a file, or a name among the shipped spaces and ``$SPECTUNE_SPACES``."""

from __future__ import annotations

import importlib.resources
import importlib.util
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from spectune._util import load_yaml_file, validate
from spectune.errors import ConfigError
from spectune.space._space import SearchSpace

if TYPE_CHECKING:
    pass


__all__ = ["SHIPPED_SPACES", "SPACES_ENV", "list_spaces", "load_space", "spaces_dirs"]

logger = logging.getLogger(__name__)

SHIPPED_SPACES = "spectune.search_spaces"
"""The data package of the shipped spaces: the repository's ``search_spaces/``, mapped into the
wheel (read through :mod:`importlib.resources`, so an installed spectune finds them from any
directory)."""
SPACES_ENV = "SPECTUNE_SPACES"


# ---------------------------------------------------------------------------------------------
# Loading


def spaces_dirs() -> list[Path]:
    """Folders searched for named spaces: ``$SPECTUNE_SPACES`` (os.pathsep list), then shipped."""
    dirs = [Path(p).expanduser() for p in os.environ.get(SPACES_ENV, "").split(os.pathsep) if p]
    return [*dirs, *_shipped_dirs()]


def _shipped_dirs() -> list[Path]:
    """The folder of the shipped spaces: inside the installed package (the repository's
    ``search_spaces/`` for an editable install)."""
    try:
        return [Path(str(importlib.resources.files(SHIPPED_SPACES)))]
    except ModuleNotFoundError:  # pragma: no cover - an install without its data package
        return []


def list_spaces() -> dict[str, Path]:
    """Named spaces -> their files; an earlier folder of :func:`spaces_dirs` wins a name."""
    found: dict[str, Path] = {}
    for folder in spaces_dirs():
        if not folder.is_dir():
            continue
        for path in sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")]):
            found.setdefault(path.stem, path)
    return found


def _find(path_or_name: str | Path) -> Path:
    if isinstance(path_or_name, Path):
        return path_or_name
    text = str(path_or_name)
    looks_like_path = "/" in text or os.sep in text or text.endswith((".yaml", ".yml"))
    if looks_like_path or Path(text).is_file():
        return Path(text).expanduser()
    known = list_spaces()
    if text in known:
        return known[text]
    where = ", ".join(str(d) for d in spaces_dirs())
    names = ", ".join(known) or "none"
    raise ConfigError(f"no search space named {text!r} (looked in {where}; known: {names})")


def load_space(path_or_name: str | Path) -> SearchSpace:
    """Load a space from a YAML file, or by name (``default``, ``ngram``) from :func:`spaces_dirs`.

    The space still holds its placeholders: call :meth:`SearchSpace.resolve` next.

    Raises:
        ConfigError: no such file or name, invalid YAML, or an invalid space (one line naming
            the file and the dotted key).
    """
    path = _find(path_or_name)
    data = load_yaml_file(path)
    if data is None:
        raise ConfigError(f"{path}: empty search space (expected a mapping with 'methods')")
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected a mapping with 'methods', got {type(data).__name__}")
    space = validate(SearchSpace, data, source=str(path))
    space._source = str(path)
    return space
