"""Does a draft or head fit its target? Checked on local files before any engine starts.

A draft model proposes token ids; the target verifies them as ids of its own vocabulary. A
draft trained with another tokenizer proposes nonsense (acceptance near zero), and with another
``vocab_size`` vLLM refuses to start. Both are cheaper to catch here, in one line, than in an
engine's start-up log:

- ``vocab_size`` from each ``config.json`` (top level, or ``text_config`` /
  ``transformer_layer_config`` as in multimodal models and speculators-format heads);
- when both folders carry tokenizer files: the tokenizers' vocabularies (token -> id, added
  tokens included), equal byte-for-byte ``tokenizer.json`` files being accepted without
  loading anything.

Hub names cannot be checked offline: a warning, and vLLM checks at start-up. Results are
cached per (target, proposer, method) for the life of the process.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from spectune.config import Method
from spectune.errors import ConfigError

__all__ = ["check_pairing"]

logger = logging.getLogger(__name__)

# Methods whose proposer is a checkpoint over the target's vocabulary, and what to call it.
_ROLE = {
    Method.DRAFT_MODEL: "draft",
    Method.EAGLE: "head",
    Method.EAGLE3: "head",
    Method.MLP_SPECULATOR: "head",
}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model")


def check_pairing(target: str, proposer: str | None, method: Method | str) -> None:
    """Refuse a draft or head whose vocabulary differs from the target's.

    Only ``draft_model``, ``eagle``, ``eagle3`` and ``mlp_speculator`` are checked; other methods
    (and a missing ``proposer``) pass. Local folders are compared; a name that is no existing
    folder and looks like a hub id (``org/name``) is logged as uncheckable and passes. Safe to
    call from several threads.

    Raises:
        ConfigError: a local path that does not exist or is not a folder, an unreadable
            ``config.json``, or different vocabularies (one line, with the sizes or one token
            that differs).
    """
    method = Method(method)
    if method not in _ROLE or not proposer:
        return
    _check(target, proposer, method)


@functools.lru_cache(maxsize=256)
def _check(target: str, proposer: str, method: Method) -> None:
    role = _ROLE[method]
    target_dir = _local_dir(target, "target")
    proposer_dir = _local_dir(proposer, role)
    if target_dir is None or proposer_dir is None:
        hub = target if target_dir is None else proposer
        logger.warning(
            "cannot check offline that %s %s shares the vocabulary of target %s (%s is a hub name); "
            "vLLM checks when the engine starts",
            role, proposer, target, hub,
        )
        return
    if target_dir == proposer_dir:
        return
    prefix = f"{role} {proposer} does not share the target's vocabulary"
    target_size, proposer_size = _vocab_size(target_dir), _vocab_size(proposer_dir)
    if target_size is not None and proposer_size is not None and target_size != proposer_size:
        raise ConfigError(f"{prefix}: target vocab_size {target_size}, {role} {proposer_size}")
    if not (_has_tokenizer(target_dir) and _has_tokenizer(proposer_dir)):
        logger.debug("pairing: %s or %s has no tokenizer files; compared vocab_size only", target_dir, proposer_dir)
        return
    if _same_bytes(target_dir / "tokenizer.json", proposer_dir / "tokenizer.json"):
        return
    target_vocab, proposer_vocab = _vocab(str(target_dir)), _vocab(str(proposer_dir))
    if target_vocab is None or proposer_vocab is None or target_vocab == proposer_vocab:
        return
    raise ConfigError(f"{prefix}: {_difference(target_vocab, proposer_vocab, role)}")


def _looks_like_path(name: str) -> bool:
    """A hub id is ``name`` or ``org/name``; anything else with a path shape is a path."""
    return name.startswith(("/", ".", "~")) or "\\" in name or name.count("/") > 1 or name.endswith("/")


def _local_dir(name: str, role: str) -> Path | None:
    """The folder ``name`` names, or None for a hub name."""
    path = Path(name).expanduser()
    if path.is_dir():
        return path.resolve()
    if path.exists():
        raise ConfigError(f"{role} {name}: not a folder (a checkpoint is a folder with config.json)")
    if _looks_like_path(name):
        raise ConfigError(f"{role} {name}: no such folder")
    return None


def _vocab_size(folder: Path) -> int | None:
    path = folder / "config.json"
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read: {e}") from e
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: invalid JSON: {e.msg} at line {e.lineno}") from e
    if not isinstance(config, dict):
        return None
    for section in (config, config.get("text_config"), config.get("transformer_layer_config")):
        if isinstance(section, dict) and isinstance(section.get("vocab_size"), int):
            return section["vocab_size"]
    return None


def _has_tokenizer(folder: Path) -> bool:
    return any((folder / name).is_file() for name in _TOKENIZER_FILES)


def _same_bytes(a: Path, b: Path) -> bool:
    if not (a.is_file() and b.is_file()):
        return False
    if a.stat().st_size != b.stat().st_size:
        return False
    return _digest(a) == _digest(b)


def _digest(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@functools.lru_cache(maxsize=8)
def _vocab(folder: str) -> dict[str, int] | None:
    """Token -> id of the folder's tokenizer (added tokens included); None if it cannot load.

    A ``tokenizer.json`` is read with the ``tokenizers`` library (milliseconds); other formats
    (SentencePiece ``tokenizer.model``, ``vocab.json``) through ``transformers.AutoTokenizer``,
    whose import alone takes seconds.
    """
    try:
        if (Path(folder) / "tokenizer.json").is_file():
            from tokenizers import Tokenizer

            return Tokenizer.from_file(str(Path(folder) / "tokenizer.json")).get_vocab(with_added_tokens=True)
        from transformers import AutoTokenizer

        tokenizer: Any = AutoTokenizer.from_pretrained(folder)
        return dict(tokenizer.get_vocab())
    except Exception as e:  # noqa: BLE001 - any failure means "cannot compare", not "differs"
        logger.warning("pairing: cannot load the tokenizer in %s (%s); compared vocab_size only", folder, e)
        return None


def _difference(target: dict[str, int], proposer: dict[str, int], role: str) -> str:
    """One example of how two vocabularies differ."""
    sizes = f"target {len(target)} tokens, {role} {len(proposer)}"
    for token, tid in sorted(target.items(), key=lambda item: item[1]):
        pid = proposer.get(token)
        if pid is None:
            return f"{sizes}; token {token!r} (target id {tid}) is missing from the {role}"
        if pid != tid:
            return f"{sizes}; token {token!r} is id {tid} in the target, {pid} in the {role}"
    extra = sorted(set(proposer) - set(target), key=proposer.__getitem__)
    return f"{sizes}; the {role} has {len(extra)} tokens the target lacks, e.g. {extra[0]!r} (id {proposer[extra[0]]})"
