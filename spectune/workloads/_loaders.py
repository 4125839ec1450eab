"""Prompt loaders, one per file format; every error names the file and line (or record).

Formats:

- ``jsonl``: one object a line with ``prompt`` (text) or ``messages`` (chat).
- ``custom``: vLLM bench's custom dataset, one object a line with ``prompt`` and, optionally,
  ``output_tokens`` (this request's output length).
- ``spec_bench``: Spec-Bench's and MT-Bench's ``question.jsonl``, one object a line with
  ``question_id``, ``category`` and ``turns``; the first turn is the prompt (later turns need
  the model's answers to the earlier ones, which a fixed workload does not have).
- ``sharegpt``: a JSON list of ``{"id": ..., "conversations": [{"from": ..., "value": ...}]}``.
  ``first_turn`` mode sends the first user turn as text; ``history`` mode sends the conversation
  up to its last user turn as chat messages. Conversations without a usable user turn (real
  ShareGPT dumps hold empty ones) are skipped and counted in the log; malformed ones are errors.

Files ending in ``.gz`` are read through gzip, every file as UTF-8 (a byte-order mark is
skipped). Every error is one line naming the file; text that could not be sent (a lone
surrogate written as a JSON escape) is an error too. Ids are stable: ``id``, ``task_id`` or
``question_id`` when the record has one, else the line number (JSONL) or the 0-based record
index (JSON).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import random
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Literal

from pydantic import ValidationError

from spectune._util import describe_validation_error
from spectune.config import SHIPPED_NAMES, ChatMessage, Prompt, WorkloadSpec
from spectune.errors import ConfigError
from spectune.workloads._shipped import shipped_format, shipped_path

__all__ = [
    "FileFormat",
    "detect_format",
    "load_custom",
    "load_file",
    "load_jsonl",
    "load_prompts",
    "load_sharegpt",
    "load_spec_bench",
    "select",
]

logger = logging.getLogger(__name__)

FileFormat = Literal["jsonl", "sharegpt", "custom", "spec_bench"]
SharegptMode = Literal["first_turn", "history"]

_SHAREGPT_ROLES: dict[str, Literal["system", "user", "assistant"]] = {
    "human": "user", "user": "user",
    "gpt": "assistant", "chatgpt": "assistant", "assistant": "assistant", "bard": "assistant",
    "system": "system",
}
_ID_KEYS = ("id", "task_id", "question_id")


# -- reading ---------------------------------------------------------------------------------


@contextlib.contextmanager
def _open_text(path: Path) -> Iterator[IO[str]]:
    """``path`` opened as UTF-8 text (through gzip for ``.gz``; a byte-order mark skipped);
    errors become ConfigError."""
    try:
        if path.name.endswith(".gz"):
            f: IO[str] = gzip.open(path, "rt", encoding="utf-8-sig")
        else:
            f = open(path, encoding="utf-8-sig")  # noqa: SIM115 - closed below
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from e
    try:
        with f:
            yield f
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text: {e.reason}") from e
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError; a corrupt stream a zlib.error
        raise ConfigError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from e


def _json_problem(e: ValueError | RecursionError) -> str:
    """Why JSON text could not be read, in a few words."""
    if isinstance(e, json.JSONDecodeError):
        return e.msg
    if isinstance(e, RecursionError):
        return "nested too deeply"
    return str(e).split(":")[0]  # int("1" * 5000): "Exceeds the limit (4300 digits) for integer string conversion"


def _iter_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object) for every non-blank line of ``path``."""
    with _open_text(path) as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (ValueError, RecursionError) as e:  # not UnicodeDecodeError: reading the line raises that
                raise ConfigError(f"{path}:{n}: invalid JSON: {_json_problem(e)}") from e
            yield n, record


def _record_id(record: dict[str, Any], fallback: int) -> str:
    for key in _ID_KEYS:
        value = record.get(key)
        if value is not None and value != "":
            return str(value)
    return str(fallback)


def _require_object(record: Any, where: str) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(record).__name__}")
    return record


def _nonempty_str(value: Any, key: str, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}: {key!r} must be a non-empty string")
    return value


def _prompt(where: str, **fields: Any) -> Prompt:
    """A Prompt of ``fields``; one that is invalid (a text that is no valid Unicode: a lone
    surrogate from a JSON escape such as ``"\\ud800"``) is a ConfigError naming ``where``."""
    try:
        return Prompt(**fields)
    except ValidationError as e:
        raise ConfigError(describe_validation_error(e, where)) from e


def _no_prompts(path: Path, prompts: list[Prompt]) -> list[Prompt]:
    if not prompts:
        raise ConfigError(f"{path}: no prompts (empty file?)")
    return prompts


# -- formats ---------------------------------------------------------------------------------


def _prompt_from_record(record: Any, ident: str, where: str) -> Prompt:
    record = _require_object(record, where)
    try:
        if "messages" in record:
            if not isinstance(record["messages"], list) or not record["messages"]:
                raise ConfigError(f"{where}: 'messages' must be a non-empty list")
            return Prompt(id=ident, messages=[ChatMessage.model_validate(m) for m in record["messages"]])
        if "prompt" in record:
            return Prompt(id=ident, text=_nonempty_str(record["prompt"], "prompt", where))
    except ValidationError as e:
        raise ConfigError(describe_validation_error(e, where)) from e
    raise ConfigError(f"{where}: a record needs 'prompt' or 'messages'")


def load_jsonl(path: Path) -> list[Prompt]:
    """JSONL, one object a line with ``prompt`` (text) or ``messages`` (chat).

    Raises:
        ConfigError: unreadable file, invalid JSON or a record without either key (naming
            ``file:line``), or no records at all.
    """
    path = Path(path)
    prompts = [
        _prompt_from_record(rec, _record_id(rec, n) if isinstance(rec, dict) else str(n), f"{path}:{n}")
        for n, rec in _iter_jsonl(path)
    ]
    return _no_prompts(path, prompts)


def load_custom(path: Path) -> list[Prompt]:
    """vLLM bench's ``custom`` JSONL: ``prompt`` and optional ``output_tokens`` per line.

    ``output_tokens`` becomes :attr:`Prompt.max_tokens`. Other keys are ignored, as vLLM does.

    Raises:
        ConfigError: as :func:`load_jsonl`; also a non-positive or non-integer ``output_tokens``.
    """
    path = Path(path)
    prompts: list[Prompt] = []
    for n, rec in _iter_jsonl(path):
        where = f"{path}:{n}"
        rec = _require_object(rec, where)
        if "prompt" not in rec:
            raise ConfigError(f"{where}: a record needs 'prompt'")
        text = _nonempty_str(rec["prompt"], "prompt", where)
        out = rec.get("output_tokens")
        if out is not None and (isinstance(out, bool) or not isinstance(out, int) or out < 1):
            raise ConfigError(f"{where}: 'output_tokens' must be a positive integer, got {out!r}")
        prompts.append(_prompt(where, id=_record_id(rec, n), text=text, max_tokens=out))
    return _no_prompts(path, prompts)


def load_spec_bench(path: Path) -> list[Prompt]:
    """Spec-Bench / MT-Bench ``question.jsonl``: the first of each record's ``turns``.

    Raises:
        ConfigError: as :func:`load_jsonl`; also missing or empty ``turns``.
    """
    path = Path(path)
    prompts: list[Prompt] = []
    for n, rec in _iter_jsonl(path):
        where = f"{path}:{n}"
        rec = _require_object(rec, where)
        turns = rec.get("turns")
        if not isinstance(turns, list) or not turns:
            raise ConfigError(f"{where}: a record needs 'turns', a non-empty list of strings")
        text = _nonempty_str(turns[0], "turns[0]", where)
        category = rec.get("category")
        prompts.append(_prompt(where, id=_record_id(rec, n), text=text,
                               category=str(category) if category is not None else None))
    return _no_prompts(path, prompts)


def _sharegpt_prompt(messages: list[ChatMessage], mode: SharegptMode, ident: str) -> Prompt | None:
    users = [i for i, m in enumerate(messages) if m.role == "user"]
    if not users:
        return None
    if mode == "first_turn":
        text = messages[users[0]].content
        return Prompt(id=ident, text=text) if text.strip() else None
    history = messages[: users[-1] + 1]
    if not history[-1].content.strip():
        return None
    return Prompt(id=ident, messages=history)


def load_sharegpt(path: Path, mode: SharegptMode = "first_turn") -> list[Prompt]:
    """ShareGPT JSON: a list of ``{"conversations": [{"from": ..., "value": ...}, ...]}``.

    ``first_turn``: the first user turn as text. ``history``: the turns up to and including the
    last user turn as chat messages (trailing answers dropped). Speakers human/user map to
    user, gpt/chatgpt/assistant/bard to assistant, system to system. Conversations with no
    non-empty user turn to send are skipped.

    Raises:
        ConfigError: invalid JSON (naming ``file:line:column``), a malformed record or turn
            (naming the 0-based record index), an unknown speaker, or nothing left to send.
    """
    path = Path(path)
    with _open_text(path) as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from e
        except UnicodeDecodeError:
            raise  # reading the file: _open_text says so
        except (ValueError, RecursionError) as e:
            raise ConfigError(f"{path}: invalid JSON: {_json_problem(e)}") from e
    if not isinstance(data, list):
        raise ConfigError(f"{path}: expected a JSON list of conversations, got {type(data).__name__}")
    prompts: list[Prompt] = []
    skipped = 0
    for i, rec in enumerate(data):
        where = f"{path}: record {i}"
        rec = _require_object(rec, where)
        conv = rec.get("conversations")
        if not isinstance(conv, list):
            raise ConfigError(f"{where}: a record needs 'conversations', a list of turns")
        messages: list[ChatMessage] = []
        for j, turn in enumerate(conv):
            if not isinstance(turn, dict) or "from" not in turn or "value" not in turn:
                raise ConfigError(f"{where}: turn {j}: a turn needs 'from' and 'value'")
            role = _SHAREGPT_ROLES.get(str(turn["from"]).lower())
            if role is None:
                known = ", ".join(sorted(_SHAREGPT_ROLES))
                raise ConfigError(f"{where}: turn {j}: unknown speaker {turn['from']!r}; known: {known}")
            if not isinstance(turn["value"], str):
                raise ConfigError(f"{where}: turn {j}: 'value' must be a string")
            try:
                messages.append(ChatMessage(role=role, content=turn["value"]))
            except ValidationError as e:
                raise ConfigError(describe_validation_error(e, f"{where}: turn {j}")) from e
        try:
            prompt = _sharegpt_prompt(messages, mode, _record_id(rec, i))
        except ValidationError as e:
            raise ConfigError(describe_validation_error(e, where)) from e
        if prompt is None:
            skipped += 1
        else:
            prompts.append(prompt)
    if skipped:
        logger.info("%s: skipped %d of %d conversations without a user turn to send", path, skipped, len(data))
    if not prompts:
        raise ConfigError(f"{path}: no conversation with a user turn to send" if data else f"{path}: no prompts (empty list)")
    return prompts


# -- dispatch --------------------------------------------------------------------------------


def _first_record(path: Path) -> tuple[int, Any] | None:
    for n, rec in _iter_jsonl(path):
        return n, rec
    return None


def _format_of_record(path: Path) -> FileFormat:
    first = _first_record(path)
    if first is None:
        raise ConfigError(f"{path}: no prompts (empty file?)")
    n, rec = first
    rec = _require_object(rec, f"{path}:{n}")
    if "turns" in rec:
        return "spec_bench"
    if "output_tokens" in rec and "prompt" in rec:
        return "custom"
    if "prompt" in rec or "messages" in rec:
        return "jsonl"
    keys = ", ".join(k if k.isprintable() else repr(k) for k in sorted(map(str, rec)))[:200] or "none"
    raise ConfigError(
        f"{path}:{n}: cannot tell the format from the first record (keys: {keys}); "
        "expected 'prompt', 'messages' or 'turns', or set format"
    )


def detect_format(path: Path) -> FileFormat:
    """The format ``format: auto`` picks for ``path``.

    ``.json`` is ShareGPT; ``.jsonl`` is told by its first record: ``turns`` -> spec_bench,
    ``prompt`` with ``output_tokens`` -> custom, ``prompt`` or ``messages`` -> jsonl. Other
    names are told by their first character (``[`` -> ShareGPT, ``{`` -> as ``.jsonl``).
    A ``.gz`` suffix is looked through.

    Raises:
        ConfigError: the file is empty, unreadable, or its format cannot be told.
    """
    path = Path(path)
    name = path.name.lower().removesuffix(".gz")
    if name.endswith(".json"):
        return "sharegpt"
    if name.endswith(".jsonl"):
        return _format_of_record(path)
    with _open_text(path) as f:
        head = f.read(4096).lstrip()
    if head.startswith("["):
        return "sharegpt"
    if head.startswith("{"):
        return _format_of_record(path)
    if not head:
        raise ConfigError(f"{path}: no prompts (empty file?)")
    raise ConfigError(f"{path}: cannot tell the format (neither a JSON list nor JSON lines); set format")


def load_file(
    path: Path, format: FileFormat | Literal["auto"] = "auto", *, sharegpt_mode: SharegptMode = "first_turn"
) -> list[Prompt]:
    """Every prompt of the file ``path`` in ``format`` (``auto``: :func:`detect_format`).

    Raises:
        ConfigError: the file cannot be read, is malformed, or holds no prompts.
    """
    path = Path(path)
    fmt = detect_format(path) if format == "auto" else format
    if fmt == "sharegpt":
        return load_sharegpt(path, sharegpt_mode)
    if fmt == "custom":
        return load_custom(path)
    if fmt == "spec_bench":
        return load_spec_bench(path)
    return load_jsonl(path)


def select(prompts: list[Prompt], num_prompts: int | None, seed: int, source: str) -> list[Prompt]:
    """``num_prompts`` of ``prompts`` chosen with ``seed``, in file order (all when None).

    The same seed always selects the same prompts from the same list.

    Raises:
        ConfigError: ``prompts`` is empty.
    """
    if not prompts:
        raise ConfigError(f"{source}: no prompts")
    if num_prompts is None or num_prompts >= len(prompts):
        if num_prompts is not None and num_prompts > len(prompts):
            logger.warning("%s: %d prompts asked for, %d available; using all", source, num_prompts, len(prompts))
        return list(prompts)
    rng = random.Random(seed)
    idx = sorted(rng.sample(range(len(prompts)), num_prompts))
    return [prompts[i] for i in idx]


def load_prompts(spec: WorkloadSpec) -> list[Prompt]:
    """The prompts ``spec`` selects, from a shipped set or a file.

    Raises:
        ConfigError: a missing file or package (the message says what to install), a malformed
            file (naming file and line or record), a format that does not fit a shipped set,
            or an empty selection.
    """
    if spec.is_shipped:
        fmt = shipped_format(spec.source)
        if spec.format not in ("auto", fmt):
            raise ConfigError(f"{spec.source}: a shipped set in format {fmt}; leave format at auto")
        prompts = load_file(shipped_path(spec.source), fmt, sharegpt_mode=spec.sharegpt_mode)
    else:
        path = Path(spec.source)
        if not path.exists():
            shipped = ", ".join(SHIPPED_NAMES)
            raise ConfigError(f"{spec.source}: no such file (nor a shipped set: {shipped})")
        if path.is_dir():
            raise ConfigError(f"{spec.source}: is a folder, expected a prompt file")
        prompts = load_file(path, spec.format, sharegpt_mode=spec.sharegpt_mode)
    return select(prompts, spec.num_prompts, spec.seed, spec.source)
