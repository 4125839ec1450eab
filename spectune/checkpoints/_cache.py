"""The cache folder of built checkpoints, and what every build shares: a lock, an atomic swap into
place, marker files, the versions that built it."""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import platform
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from spectune.errors import ConfigError

__all__ = ["checkpoint_identity", "default_cache_dir", "import_checkpoint_deps", "lock", "read_json", "remove_stale", "swap_in",
           "versions", "write_json"]

logger = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    """spectune's cache folder: ``$SPECTUNE_CACHE``, else ``~/.cache/spectune``."""
    env = os.environ.get("SPECTUNE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "spectune"


# --------------------------------------------------------------------------------------------
# Shared helpers: imports, lock, atomic swap, markers


def import_checkpoint_deps() -> None:
    """Fail with one line when the packages for building checkpoints are missing."""
    missing = []
    for mod in ("torch", "transformers", "tokenizers"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        raise ConfigError(
            f"building checkpoints needs {', '.join(missing)}: pip install 'spectune[checkpoints]'"
        )


@contextlib.contextmanager
def lock(folder: Path, name: str) -> Iterator[None]:
    """Exclusive advisory lock on ``folder/name`` (POSIX ``flock``; no lock where unavailable)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / name, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def remove_stale(parent: Path, prefix: str) -> None:
    """Remove temporary build folders left by an interrupted earlier build (call under lock)."""
    for p in parent.glob(prefix + "*"):
        if p.is_dir():
            logger.debug("removing leftover build folder %s", p)
            shutil.rmtree(p, ignore_errors=True)


def swap_in(new: Path, dest: Path, trash: Path) -> None:
    """Rename ``new`` to ``dest``; an existing ``dest`` is first moved to ``trash``."""
    if dest.exists() or dest.is_symlink():
        os.replace(dest, trash)
    os.replace(new, dest)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def checkpoint_identity(folder: Path) -> dict[str, Any]:
    """A checkpoint folder as a build request names it: its path and its weights' sizes and times
    (a build on it is redone when they change)."""
    weights = sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin"))
    return {"path": str(folder.resolve()),
            "weights": [{"file": w.name, "size": w.stat().st_size, "mtime_ns": w.stat().st_mtime_ns} for w in weights]}


def versions(*dists: str) -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for d in dists:
        try:
            out[d] = importlib.metadata.version(d)
        except importlib.metadata.PackageNotFoundError:
            out[d] = None
    return out


# --------------------------------------------------------------------------------------------
# Tiny models
