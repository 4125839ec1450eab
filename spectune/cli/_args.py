"""What the commands share: their help texts, the error console, and the parsing of option values
that typer leaves as text (an engine argument, a list, a duration), and the study's best as one line."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from spectune.results import StudyView

__all__ = ["OUTAGE_HELP", "STORAGE_HELP"]

STORAGE_HELP = ("Storage URL: sqlite:///FILE, or postgresql+psycopg://USER@HOST/DB for workers on several "
                "machines. Default: $SPECTUNE_STORAGE, else sqlite:///storage/spectune.db in the current directory.")
OUTAGE_HELP = ("How long a worker waits for an unreachable storage (seconds, or 90s, 10m) before it stops its "
               "engines and exits (code 2); meanwhile it starts no engine and keeps a finished measurement. "
               "Default: the study's storage_outage_limit (10m).")


def _err_console() -> Console:
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def _parse_engine_arg(items: list[str]) -> dict[str, Any]:
    from spectune._util import parse_yaml
    from spectune.errors import ConfigError

    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--engine-arg {item!r}: expected KEY=VALUE, e.g. enable-prefix-caching=true")
        out[key] = parse_yaml(value, f"--engine-arg {item!r}") if value else True
    return out


def _parse_list(text: str, option: str, kind: type[int] | type[float], example: str) -> list[Any]:
    """A comma-separated option's values (ConfigError: one that is not a number)."""
    from spectune.errors import ConfigError

    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{option} {text!r}: expected numbers like {example}") from None
    if not values:
        raise ConfigError(f"{option} {text!r}: expected numbers like {example}")
    return values


def _outage_limit(text: str | None) -> float | None:
    """Seconds of ``--storage-outage-limit`` (ConfigError: not a positive duration)."""
    from spectune.errors import ConfigError
    from spectune.study import parse_duration

    if text is None:
        return None
    try:
        seconds = parse_duration(text)
    except ValueError as e:
        raise ConfigError(f"--storage-outage-limit: {e}") from None
    if seconds <= 0:
        raise ConfigError("--storage-outage-limit: give a duration longer than 0 (10m)")
    return seconds


def _print_best(view: StudyView) -> None:
    from spectune.errors import ConfigError

    try:
        choice = view.best()
    except ConfigError as e:
        _err_console().print(f"no best configuration yet: {e}")
        return
    typer.echo(f"best: {choice.row.label} (trial {choice.row.number}) - {choice.reason}")


def _print_json(record: Any) -> None:
    import json

    sys.stdout.write(json.dumps(record, indent=2, default=str) + "\n")


def _one_line(text: str) -> str:
    """``text`` as one printable line: a line break or another control character (from a path,
    a key, a value the message quotes) written as its escape, as is a lone surrogate (from
    command-line bytes that are no UTF-8), which no terminal could be sent."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape", "backslashreplace").decode("ascii")
                   for c in text)
