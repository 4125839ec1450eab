"""Search spaces the tests write or build, and the one-line error a bad one gives."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from conftest import REPO

from spectune._util import validate
from spectune.errors import ConfigError
from spectune.space import SearchSpace, load_space

SHIPPED = sorted(p.stem for p in (REPO / "search_spaces").glob("*.yaml"))
"""The shipped spaces' names."""


def write_space(tmp_path: Path, text: str, name: str = "space.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path

def space_of(data: dict) -> SearchSpace:
    return validate(SearchSpace, data, "test")

def one_line_error(path_or_name: str | Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_space(path_or_name)
    message = str(info.value)
    assert "\n" not in message
    return message
