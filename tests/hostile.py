"""Hostile inputs for every reader spectune has, and a harness that runs each one through the
real command line. The tests (``tests/*/test_hostile_*.py``) and ``benchmarks/hostile_inputs.py``
share both.

A :class:`Case` is a few files and the arguments of one ``spectune`` command that reads them
without starting an engine (``optimize --create-only``, ``import``, ``show``, ``export``,
``report``, ``workloads list``). It ends well when the command exits 0, or exits 2 with one line
on stderr (``error: ...``) and nothing written: every file under the harness's folder (the
case's own files, the shared storage, the fixtures) as it was, but for a claim taken again on a
storage (``<database>.workers.lock``, rewritten by every worker that starts on it, holds no data;
creating one counts as a write). A command without a subcommand prints its help and exits 2, as
click's groups do: that counts as exit 2 too. Anything else is a problem
(:attr:`Outcome.problem`): an exception that left ``spectune.cli.main``, a traceback on stderr,
another exit code, more than one line, a file written on exit 2.

Placeholders in a case's arguments and files: ``@CASE@`` (the case's folder, also the working
directory), ``@FIX@`` (the fixtures: a valid workload), ``@STORAGE@`` (the harness's SQLite
URL), ``@STUDY@`` (a study name of the case's own). The storage holds the study ``warm``
(created by :meth:`Harness.__init__`) for ``import`` to import into.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

KINDS = ("workload", "space", "study", "import", "cli")
"""What a case feeds spectune: a prompt file, a search space, a study YAML, ``vllm bench``
result files for ``spectune import``, or command-line values."""

TARGET = "org/model"
"""The target of every study here: a hub name, never downloaded (nothing starts an engine)."""
WARM = "warm"
FIXTURE_PROMPTS = ["def add(a, b):", "Write a haiku about the sea.", "Sort a list in Python.",
                   "What is speculative decoding?"]
GOOD_SPEC = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
"""A candidate of the shipped ``ngram`` space, the warm study's."""


def hostile_settings(max_examples: int) -> settings:
    """Hypothesis settings of the hostile-input tests: deterministic, no deadline, no database."""
    return settings(max_examples=max_examples, derandomize=True, database=None, deadline=None,
                    suppress_health_check=list(HealthCheck), print_blob=False)


# =============================================================================================
# Cases and outcomes


@dataclass(frozen=True)
class Case:
    """One ``spectune`` command and the files it reads (paths relative to the case's folder)."""

    kind: str
    argv: tuple[str, ...]
    files: tuple[tuple[str, bytes], ...] = ()

    def __repr__(self) -> str:  # what hypothesis prints for a failing case
        shown = ", ".join(f"{name}: {content[:300]!r}{'...' if len(content) > 300 else ''}" for name, content in self.files)
        return f"Case({self.kind}, argv={list(self.argv)!r}, files={{{shown}}})"


_LOG_LINE = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: ")
_PY_WARNING = re.compile(r"^\S.*:\d+: \w*Warning: ", re.M)
"""A line Python's warnings module prints (seen where a case runs as a process)."""


@dataclass
class Outcome:
    """How one case ended."""

    code: int | None
    stdout: str
    stderr: str
    written: list[str] = field(default_factory=list)
    """Files created, changed or removed (paths relative to the harness's folder)."""
    escaped: str | None = None
    """The exception that left ``spectune.cli.main`` (in process), as its last line."""

    @property
    def problem(self) -> str | None:
        """Why this is not a good end (None: exit 0, or exit 2 with one line and nothing written)."""
        if self.escaped is not None:
            return f"exception left main: {self.escaped}"
        if "Traceback (most recent call last)" in self.stderr:
            return "traceback on stderr"
        if _PY_WARNING.search(self.stderr):
            return "a Python warning on stderr"
        if self.code == 0:
            return None
        if self.code != 2:
            return f"exit {self.code}"
        if not self.stderr.strip() and self.stdout.lstrip().startswith("Usage:"):
            return None if not self.written else f"help and written: {', '.join(self.written[:5])}"  # no command: help
        lines = [line for line in re.split(r"\r\n|\r|\n", self.stderr.rstrip("\n")) if not _LOG_LINE.match(line)]
        if len(lines) != 1 or not lines[0].startswith("error: ") or not lines[0][len("error: "):].strip():
            return f"exit 2 with {len(lines)} lines other than log records, not one 'error: ...' line"
        if self.written:
            return f"exit 2 and written: {', '.join(self.written[:5])}"
        return None

    @property
    def verdict(self) -> str:
        """``exit 0``, ``exit 2`` or ``other`` (a problem)."""
        if self.problem is not None:
            return "other"
        return f"exit {self.code}"


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` with its size and modification time (ns), and every folder (a
    folder's own time changes with a temporary file made and removed in it: not a write)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        out.update({str((Path(dirpath) / name).relative_to(root)): (-1, 0) for name in dirnames})
        for name in filenames:
            path = Path(dirpath) / name
            try:
                st_ = path.lstat()
            except OSError:
                continue
            out[str(path.relative_to(root))] = (st_.st_size, st_.st_mtime_ns)
    return out


def _changes(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> list[str]:
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


@contextlib.contextmanager
def _clean_env() -> Iterator[None]:
    """No storage or space folders from the environment reach a case."""
    saved = {k: os.environ.pop(k) for k in ("SPECTUNE_STORAGE", "SPECTUNE_SPACES") if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


_ORIGINAL_GET_COMMAND: Any = None
_COMMANDS: dict[int, Any] = {}


def _get_command_once(app: Any) -> Any:
    """typer builds click's command from the signatures on every call (30 ms); once is enough here."""
    if id(app) not in _COMMANDS:
        _COMMANDS[id(app)] = _ORIGINAL_GET_COMMAND(app)
    return _COMMANDS[id(app)]


_HEADS: list[str] = []


@contextlib.contextmanager
def _alembic_head_once() -> Iterator[None]:
    """Optuna's RDB storage reads its schema's head revision from its alembic scripts each time
    it opens (30 ms, the same answer in one process); read it once here, where it is available."""
    manager = getattr(getattr(__import__("optuna.storages._rdb.storage").storages._rdb, "storage", None),
                      "_VersionManager", None)
    original = getattr(manager, "get_head_version", None)
    if original is None:
        yield
        return
    def head_once(self: Any) -> str:
        if not _HEADS:
            _HEADS.append(original(self))
        return _HEADS[0]

    with mock.patch.object(manager, "get_head_version", head_once):
        yield


def _no_workers(*args: Any, **kwargs: Any) -> None:
    """What the harness puts in place of the CLI's workers: a case that reaches them would start
    engines (``optimize`` without ``--create-only``)."""
    raise RuntimeError("the case reached spectune's workers: it would start engines")


def _fresh_engines() -> None:
    """Drop the SQLAlchemy engines spectune keeps per storage URL, as a new process starts
    without them: a relative SQLite URL (the default, ``sqlite:///storage/spectune.db``) names
    another file in each case's folder, and the engine of an earlier case would reach that
    case's file, removed since (SQLite then calls the database read-only)."""
    from spectune import storage

    engine = getattr(storage, "_engine", None)
    if engine is not None and hasattr(engine, "cache_clear"):
        engine.cache_clear()


def _in_process(argv: list[str]) -> tuple[int | None, str, str, str | None]:
    """Run ``spectune.cli.main(argv)`` here: (exit code, stdout, stderr, the exception that left it)."""
    global _ORIGINAL_GET_COMMAND
    import typer.main

    from spectune.cli import main

    if _ORIGINAL_GET_COMMAND is None:
        _ORIGINAL_GET_COMMAND = typer.main.get_command
    _fresh_engines()
    out, err = io.StringIO(), io.StringIO()
    code: int | None = None
    escaped = None
    with mock.patch.object(typer.main, "get_command", _get_command_once), _alembic_head_once(), \
            mock.patch("spectune.cli._work", _no_workers), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        except Exception as e:  # noqa: BLE001 - what the case is looking for
            escaped = traceback.format_exception_only(e)[-1].strip()[:500]
    return code, out.getvalue(), err.getvalue(), escaped


def _spectune_command() -> list[str]:
    script = Path(sys.executable).with_name("spectune")
    return [str(script)] if script.exists() else [sys.executable, "-m", "spectune.cli"]


class Harness:
    """Runs cases under ``root``: each in a fresh folder of its own (``root/case<n>``, removed
when the next case starts: a SQLite file at the same path as an earlier case's would meet that
one's connections still open in this process), all on one storage.

    ``root`` should be a folder of its own (on tmpfs where there is one: SQLite's commits are
    most of the time of a case that creates a study). Creates the fixtures and the study
    ``warm`` in the storage; not safe to share between threads (cases change the working
    directory).
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.fixtures = self.root / "fixtures"
        (self.root / "storage").mkdir(parents=True, exist_ok=True)
        self.url = f"sqlite:///{self.root / 'storage' / 'spectune.db'}"
        self.fixtures.mkdir(parents=True, exist_ok=True)
        (self.fixtures / "w.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in FIXTURE_PROMPTS))
        self.count = 0
        self.case_dir = self.root / "case0"
        warm = self.run(Case("setup", ("optimize", "--create-only", "--target", TARGET, "--workload", "@FIX@/w.jsonl",
                                       "--space", "ngram", "--storage", "@STORAGE@", "--study", WARM)))
        if warm.code != 0:
            raise RuntimeError(f"the warm study was not created: {warm.stderr or warm.escaped}")

    def _fill(self, text: str) -> str:
        return (text.replace("@CASE@", str(self.case_dir)).replace("@FIX@", str(self.fixtures))
                .replace("@STORAGE@", self.url).replace("@STUDY@", f"case{self.count}"))

    def _fill_bytes(self, data: bytes) -> bytes:
        for key, value in ((b"@CASE@", str(self.case_dir)), (b"@FIX@", str(self.fixtures)), (b"@STORAGE@", self.url),
                           (b"@STUDY@", f"case{self.count}")):
            data = data.replace(key, value.encode())
        return data

    def run(self, case: Case, *, in_subprocess: bool = False, timeout: float = 120) -> Outcome:
        """Write the case's files, run its command, and say how it ended."""
        if self.case_dir.exists():
            shutil.rmtree(self.case_dir)
        self.count += 1
        self.case_dir = self.root / f"case{self.count}"
        self.case_dir.mkdir()
        for name, content in case.files:
            path = self.case_dir / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(self._fill_bytes(content))
        argv = [self._fill(a) for a in case.argv]
        before = _snapshot(self.root)
        if in_subprocess and case.argv[:1] == ("optimize",) and case.argv[1:2] != ("--create-only",):
            raise ValueError(f"{case!r}: optimize runs as a process only with --create-only first (no engine starts)")
        with _clean_env(), contextlib.chdir(self.case_dir):
            if in_subprocess:
                env = {k: v for k, v in os.environ.items() if k not in ("SPECTUNE_STORAGE", "SPECTUNE_SPACES")}
                done = subprocess.run([*_spectune_command(), *argv], capture_output=True, text=True, errors="replace",
                                      timeout=timeout, env=env, check=False)
                code, stdout, stderr, escaped = done.returncode, done.stdout, done.stderr, None
            else:
                code, stdout, stderr, escaped = _in_process(argv)
        after = _snapshot(self.root)
        written = [re.sub(rf"^{self.case_dir.name}\b", "case", k) for k in _changes(before, after)
                   if not (k.endswith(".workers.lock") and k in before and k in after)] if code != 0 else []
        return Outcome(code, stdout, stderr, written, escaped)


@contextlib.contextmanager
def harness_folder() -> Iterator[Path]:
    """A temporary folder for a harness, on tmpfs (``/dev/shm``) where there is one; removed after."""
    shm = Path("/dev/shm")
    base = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
    folder = Path(tempfile.mkdtemp(prefix="spectune-hostile-", dir=base))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# =============================================================================================
# Values


ODD_STRINGS = [
    "", " ", "\n", "\t", "\x00", "a\x00b", "\u2028", "\ufeff", "\u202e", "\ud800", "é", "💥", "ｎｇｒａｍ", "x" * 5000,
    "${draft}", "${target}", "${env:SPECTUNE_UNSET_VAR}", "${", "null", "~", "NaN", "-1", "1e999", "0x10", "[", "{",
    "'", '"', "\\", "../", "/", ".", "-", "--", "C:\\", "true", "yes", "0", "inf", "-inf", "10m", "1.5h", "h",
]
"""Strings that have broken parsers: empty, blank, control and format characters, a lone
surrogate, a long one, placeholders, YAML's special words, numbers in odd forms, paths."""
odd_text = st.one_of(st.sampled_from(ODD_STRINGS), st.text(max_size=12))
ODD_INTS = [0, -1, 1, 2, 64, 65, 2**31, 2**32, 2**53 + 1, 2**63, -(2**63), 10**30, 10**400, -(10**400)]
ints = st.one_of(st.integers(-3, 40), st.sampled_from(ODD_INTS))
numbers = st.one_of(ints, st.floats(), st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e308, 5e-324, -0.0]))
scalars = st.one_of(st.none(), st.booleans(), ints, st.floats(), odd_text)


def json_values(keys: st.SearchStrategy[str] = odd_text) -> st.SearchStrategy[Any]:
    """Any JSON (and YAML) value: scalars, lists and objects, a few levels deep."""
    return st.recursive(scalars, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(keys, kids, max_size=3),
                        max_leaves=6)


def rarely(draw: st.DrawFn, one_in: int) -> bool:
    """True about once in ``one_in`` draws (hypothesis leans to the first of a list: False)."""
    return draw(st.sampled_from([False] * (one_in - 1) + [True]))


def usually(draw: st.DrawFn, one_in: int) -> bool:
    """False about once in ``one_in`` draws."""
    return not rarely(draw, one_in)


def either(valid: st.SearchStrategy[Any], hostile: st.SearchStrategy[Any] | None = None, *,
           odds: int = 3) -> st.SearchStrategy[Any]:
    """``valid`` about ``odds`` times as often as ``hostile`` (default: any JSON value). Not
    ``one_of``, which draws each distinct strategy alike, repeated ones once."""
    bad = hostile if hostile is not None else json_values()
    return st.sampled_from([True] * odds + [False]).flatmap(lambda ok: valid if ok else bad)


prompt_text = st.one_of(st.sampled_from(FIXTURE_PROMPTS), st.sampled_from(FIXTURE_PROMPTS), st.text(min_size=1, max_size=30),
                        odd_text)

RAW_JSON = [
    "", "\n\n", " ", "\ufeff", "[" * 20_000, "{\"prompt\": " * 20_000, "1" * 5000, "-" + "9" * 5000, "NaN", "Infinity",
    "[]", "{}", "null", "\"\"", "[null]", "{\"prompt\": \"x\", \"prompt\": 3}", "{\"prompt\": \"\\ud800\"}",
    "{\"prompt\": \"a\\u0000b\"}", "{\"prompt\": \"x\"}\x00", "{\"prompt\": 1e999}", "{\"prompt\": \"x\"",
    "[{\"conversations\": [{\"from\": \"human\", \"value\": \"\\udfff\"}]}]", "\x1b[31m", "{\"\\n\": 1}",
    "{\"turns\": [" + "[" * 5000 + "]" * 5000 + "]}",
]
"""Whole files that have broken JSON readers: empty, deep, huge numbers, NaN, duplicate keys,
lone surrogates, NUL, truncated."""


def dump_json(value: Any, ascii_only: bool = True) -> str:
    return json.dumps(value, ensure_ascii=ascii_only, allow_nan=True)


@st.composite
def mangled(draw: st.DrawFn, text: str, raw: list[str]) -> bytes:
    """``text`` as bytes, often as is, else with a BOM, CRLF, a cut, a garbage line, another
    encoding, gzip, or replaced by a whole hostile file."""
    how = draw(st.sampled_from(["as is"] * 12 + ["bom", "crlf", "cut", "garbage line", "raw", "raw", "binary", "utf-16",
                                                   "latin-1", "gzip", "gzip", "gzip cut"]))
    if how == "bom":
        text = "\ufeff" + text
    elif how == "crlf":
        text = text.replace("\n", "\r\n")
    elif how == "cut" and text:
        text = text[: draw(st.integers(0, len(text) - 1))]
    elif how == "garbage line":
        text = text + "\n" + draw(odd_text) + "\n"
    elif how == "raw":
        text = draw(st.sampled_from(raw))
    if how == "binary":
        return draw(st.binary(max_size=64))
    if how == "utf-16":
        return text.encode("utf-16", "surrogatepass")
    if how == "latin-1":
        return text.encode("latin-1", "replace")
    data = text.encode("utf-8", "surrogatepass")
    if how in ("gzip", "gzip cut"):
        data = gzip.compress(data, mtime=0)
        if how == "gzip cut":
            data = data[: draw(st.integers(0, max(0, len(data) - 1)))]
    return data


# =============================================================================================
# Workload files


message = st.fixed_dictionaries({"role": either(st.sampled_from(["user", "assistant", "system"]), odds=8),
                                 "content": either(prompt_text, odds=8)})
ids = either(st.one_of(st.integers(0, 9), st.text(max_size=4)), st.one_of(st.none(), odd_text, json_values()))
jsonl_record = st.one_of(
    st.fixed_dictionaries({"prompt": either(prompt_text, odds=6)}, optional={"id": ids, "task_id": ids}),
    st.fixed_dictionaries({"messages": either(st.lists(message, min_size=1, max_size=3), odds=6)}, optional={"id": ids}),
    st.fixed_dictionaries({}, optional={"prompt": prompt_text, "messages": json_values(), "id": ids, "bogus": scalars}),
)
custom_record = st.fixed_dictionaries({"prompt": either(prompt_text, odds=6)}, optional={
    "output_tokens": either(st.integers(1, 64), st.one_of(ints, numbers, odd_text)), "id": ids,
})
spec_bench_record = st.fixed_dictionaries({"turns": either(st.lists(either(prompt_text, odds=6), min_size=1, max_size=2),
                                                           odds=6)}, optional={
    "question_id": ids, "category": either(st.sampled_from(["writing", "coding"]), scalars),
})
turn = st.fixed_dictionaries({"from": either(st.sampled_from(["human", "gpt", "user", "system", "bard", "HUMAN"]), odd_text,
                                             odds=8),
                              "value": either(prompt_text, odds=8)})
conversation = st.fixed_dictionaries({"conversations": either(st.lists(turn, max_size=3), odds=6)}, optional={"id": ids})
RECORDS = {"jsonl": jsonl_record, "custom": custom_record, "spec_bench": spec_bench_record}
FORMATS = ("jsonl", "custom", "spec_bench", "sharegpt")


@st.composite
def workload_files(draw: st.DrawFn) -> tuple[str, bytes, str]:
    """(file name, content, the format it was written in) of a prompt file, often broken."""
    fmt = draw(st.sampled_from(FORMATS))
    ascii_only = draw(st.booleans())
    if fmt == "sharegpt":
        data = draw(either(st.lists(either(conversation, odds=6), min_size=1, max_size=4), st.one_of(st.just([]), json_values()),
                           odds=6))
        text = dump_json(data, ascii_only)
    else:
        records = draw(either(st.lists(either(RECORDS[fmt], odds=8), min_size=1, max_size=4), st.just([]), odds=8))
        text = "".join(dump_json(r, ascii_only) + draw(st.sampled_from(["\n", "\n", "\n\n", " \n"])) for r in records)
    content = draw(mangled(text, RAW_JSON))
    suffix = draw(st.sampled_from([".json" if fmt == "sharegpt" else ".jsonl"] * 3 + ["", ".txt", ".jsonl", ".json"]))
    if content[:2] == b"\x1f\x8b" and draw(st.booleans()):
        suffix += ".gz"
    return f"prompts{suffix}", content, fmt


@st.composite
def workload_cases(draw: st.DrawFn) -> Case:
    """``optimize --create-only`` on a prompt file: format told by the file (``--workload``) or
    given in a study YAML (``format``, ``sharegpt_mode``)."""
    name, content, fmt = draw(workload_files())
    argv = ["optimize", "--create-only", "--target", TARGET, "--space", "ngram", "--storage", "@STORAGE@",
            "--study", "@STUDY@"]
    files = [(name, content)]
    if draw(st.booleans()):
        argv += ["--workload", f"@CASE@/{name}"]
    else:
        workload = {"source": f"@CASE@/{name}", "format": draw(st.sampled_from([fmt, fmt, "auto", *FORMATS])),
                    "sharegpt_mode": draw(st.sampled_from(["first_turn", "history"]))}
        files.append(("study.yaml", yaml.safe_dump({"workload": workload}).encode()))
        argv += ["--config", "@CASE@/study.yaml"]
    return Case("workload", tuple(argv), tuple(files))


# =============================================================================================
# YAML: search spaces and study configurations


RAW_YAML = [
    "", "---\n", "\ufeff", "~", "[]", "- a\n- b\n", "a: b: c\n", "methods:\n\t none: {}\n", "methods: {none: {}}\n---\nx: 1\n",
    "[" * 20_000, "{a: " * 5000, "methods: &a [*a]\n", "methods: {none: {}, ngram: &a {x: *a}}\n",
    "methods: !!python/object/apply:os.system [echo]\n", "methods: {none: {}}\nmethods: {ngram: {}}\n",
    "x: !!binary AAAA\n", "x: *missing\n", "\x00\x01\x02", "methods: {none: {}\n",
    "a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
    "d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\ne: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\n"
    "f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]\ng: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]\n",
]
"""Whole YAML files that have broken readers: empty, tabs, several documents, deep, recursive and
exponential aliases, Python tags, duplicate keys, an unknown alias, binary."""

BOMB = ("&b0 [x, x, x, x, x, x, x, x, x, x]", "&b1 [*b0, *b0, *b0, *b0, *b0, *b0, *b0, *b0, *b0, *b0]",
        "&b2 [*b1, *b1, *b1, *b1, *b1, *b1, *b1, *b1, *b1, *b1]", "&b3 [*b2, *b2, *b2, *b2, *b2, *b2, *b2, *b2, *b2, *b2]",
        "&b4 [*b3, *b3, *b3, *b3, *b3, *b3, *b3, *b3, *b3, *b3]", "&b5 [*b4, *b4, *b4, *b4, *b4, *b4, *b4, *b4, *b4, *b4]",
        "&b6 [*b5, *b5, *b5, *b5, *b5, *b5, *b5, *b5, *b5, *b5]", "&b7 [*b6, *b6, *b6, *b6, *b6, *b6, *b6, *b6, *b6, *b6]")
"""An exponential alias (10^8 elements once expanded) to hang under a key that takes anything."""


def dump_yaml(data: Any, unicode: bool) -> str:
    try:
        return yaml.safe_dump(data, allow_unicode=unicode, sort_keys=False)
    except yaml.YAMLError:  # what the emitter cannot write (a lone surrogate): as JSON, which YAML reads
        return dump_json(data)


@st.composite
def yaml_file(draw: st.DrawFn, data: Any) -> bytes:
    """``data`` as YAML, often as is, else mangled (see :func:`mangled`), or with an alias bomb
    or a self-referring alias spliced in where a mapping's value was."""
    text = dump_yaml(data, draw(st.booleans()))
    if isinstance(data, dict) and data and rarely(draw, 12):
        bomb = "\n".join(f"b{i}: {line}" for i, line in enumerate(BOMB))
        key = draw(st.sampled_from(["engine", "extra_args", "env", "description", "methods", "workload", "slo"]))
        text = f"{bomb}\n{text}\n" + (f"engine: {{extra_args: {{x: *b7}}}}\n" if key in ("engine", "extra_args")
                                      else f"{key}: &self {{x: *self}}\n")
    return draw(mangled(text, RAW_YAML))


METHOD_KEYS = ["none", "ngram", "suffix", "draft_model", "eagle", "eagle3", "mtp", "medusa", "mlp_speculator",
               "ngram_gpu", "dflash", "arctic", "bogus", "NGRAM", "", " ", "none "]
FIELD_KEYS = ["num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "models", "requires", "method",
              "suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests", "suffix_decoding_max_spec_factor",
              "suffix_decoding_min_token_prob", "draft_tensor_parallel_size", "parallel_drafting", "model", "bogus"]
ENGINE_KEYS = ["dtype", "max_model_len", "max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching", "block_size",
               "kv_cache_memory_bytes", "gpu_memory_utilization", "enforce_eager", "tensor_parallel_size", "seed", "host",
               "extra_args", "env", "model", "quantization", "tokenizer", "served_model_name", "bogus"]
ranges = st.fixed_dictionaries({}, optional={"low": numbers, "high": numbers, "step": numbers, "log": scalars,
                                             "choices": st.lists(numbers, max_size=3), "bogus": scalars})
domains = st.one_of(st.integers(1, 8), st.lists(st.integers(1, 8), min_size=1, max_size=3, unique=True),
                    st.builds(lambda lo, n: {"low": lo, "high": lo + n}, st.integers(1, 4), st.integers(0, 4)))
hostile_domains = st.one_of(numbers, st.lists(numbers, max_size=3), ranges, json_values())
model_names = st.sampled_from(["${draft}", "${target}", "${env:HOME}", "${env:SPECTUNE_UNSET_VAR}", "${x}", "org/draft",
                               "./nope", "/nonexistent/x", "@CASE@", "", " "])
method_body = st.dictionaries(either(st.sampled_from(FIELD_KEYS), odd_text),
                              st.one_of(either(domains, hostile_domains), st.lists(model_names, max_size=2), model_names,
                                        st.lists(st.sampled_from(["arctic_inference", "os", "no-such", "", "a.b"]), max_size=2)),
                              max_size=4)
NGRAM_BODY = {"num_speculative_tokens": {"low": 1, "high": 4}, "prompt_lookup_max": [2, 3], "prompt_lookup_min": 1}
engine_values = st.one_of(scalars, st.lists(scalars, max_size=3), ranges, json_values())
GOOD_ENGINE = [{"max_num_seqs": [4, 8]}, {"dtype": "float32"}, {"enable_prefix_caching": [True, False]},
               {"max_num_batched_tokens": {"low": 512, "high": 2048, "step": 512}}, {"env": {"A": "1"}},
               {"extra_args": {"disable-log-stats": True}}, {"gpu_memory_utilization": {"low": 0.5, "high": 0.9}}]


@st.composite
def spaces(draw: st.DrawFn) -> Any:
    """A search space's data: often close to a valid one (the baseline and n-gram), with odd
    methods, parameters, domains and engine sections."""
    methods: dict[Any, Any] = {}
    if usually(draw, 10):
        methods["none"] = draw(either(st.just({}), st.one_of(st.none(), method_body), odds=4))
    if usually(draw, 6):
        methods["ngram"] = draw(either(st.just(NGRAM_BODY), method_body, odds=1))
    if rarely(draw, 3):
        key = draw(either(st.sampled_from(METHOD_KEYS), odd_text))
        methods[key] = draw(st.one_of(method_body, json_values()))
    space: dict[str, Any] = {"methods": draw(either(st.just(methods), odds=8))}
    if draw(st.booleans()):
        space["engine"] = draw(either(st.sampled_from(GOOD_ENGINE),
                                      st.dictionaries(st.sampled_from(ENGINE_KEYS), engine_values, max_size=3), odds=1))
    if rarely(draw, 6):
        space[draw(st.sampled_from(["description", "engine_knobs", "bogus", ""]))] = draw(json_values())
    return draw(either(st.just(space), odds=8))


@st.composite
def space_cases(draw: st.DrawFn) -> Case:
    """``optimize --create-only`` with a search space file (with or without ``--draft``)."""
    name = draw(st.sampled_from(["space.yaml", "space.yaml", "space.yml", "space.txt"]))
    argv = ["optimize", "--create-only", "--target", TARGET, "--workload", "@FIX@/w.jsonl", "--space", f"@CASE@/{name}",
            "--storage", "@STORAGE@", "--study", "@STUDY@"]
    if draw(st.booleans()):
        argv += ["--draft", draw(st.sampled_from(["org/draft", "./nope", "@CASE@", "/nonexistent/draft", "", "${draft}"]))]
    return Case("space", tuple(argv), ((name, draw(yaml_file(draw(spaces())))),))


SHIPPED_SPACES = ["ngram", "default", "serving", "suffix", "draft", "eagle", "mtp", "demo", "mlp_speculator"]
STORAGES = ["@STORAGE@", "@STORAGE@", "sqlite:///@CASE@/other.db", "sqlite:///@CASE@/sub/dir/x.db", "sqlite:///",
            "sqlite://", "sqlite:///:memory:", "bogus://x", "postgresql+psycopg://nobody@127.0.0.1:1/db",
            "mysql://nobody@127.0.0.1:1/db", "", "@CASE@/plain.db", "sqlite:///@CASE@", "sqlite:////dev/null/x.db",
            "sqlite:///@FIX@/w.jsonl", "://", "sqlite:///\x00"]
"""Storage URLs: the harness's, others in the case's folder, odd and unreachable ones (all local:
a case never reaches the network)."""
OBJECTIVES = ["output_throughput", "tpot_median_ms", "tpot_p99_ms", "ttft_p99_ms", "e2el_median_ms", "e2el_p99_ms"]
DURATIONS = st.sampled_from(["10m", "90s", "1.5h", "600", "0", "-5m", "1e999", "nan", "inf", "10 m", "m", "10d", "", " "])


def _w(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return either(valid, odds=5)


SOURCES = st.sampled_from(["@FIX@/w.jsonl"] * 6 + ["humaneval", "mtbench"])  # a shipped set: 80-164 prompts, slower
workload_section = st.fixed_dictionaries({"source": either(SOURCES, odds=8)}, optional={
    "format": _w(st.sampled_from(["auto", *FORMATS])), "sharegpt_mode": _w(st.sampled_from(["first_turn", "history"])),
    "num_prompts": _w(st.integers(1, 8)), "seed": _w(ints), "api": _w(st.sampled_from(["completions", "chat"])),
    "sampling": _w(st.fixed_dictionaries({}, optional={
        "temperature": _w(st.floats(0, 2)), "top_p": _w(st.floats(0.01, 1)), "max_tokens": _w(st.integers(1, 64)),
        "seed": _w(ints), "ignore_eos": _w(st.booleans()), "stop": _w(st.lists(st.text(max_size=3), max_size=2))})),
    "concurrency": _w(st.integers(1, 4)), "concurrency_levels": _w(st.lists(st.integers(1, 4), min_size=1, max_size=3)),
    "request_rate": _w(st.floats(0.1, 10)), "warmup_requests": _w(st.integers(0, 2)),
    "request_timeout": _w(st.floats(1, 100)),
})
study_fields = {
    "draft": either(st.sampled_from(["org/draft", "./nope"]), st.one_of(st.lists(odd_text, max_size=2), scalars)),
    "engine": either(st.dictionaries(st.sampled_from(ENGINE_KEYS), engine_values, max_size=3)),
    "space": either(st.sampled_from(SHIPPED_SPACES), st.one_of(odd_text, st.just("@FIX@/w.jsonl"))),
    "objectives": either(st.lists(st.sampled_from(OBJECTIVES), min_size=1, max_size=2), st.one_of(odd_text, json_values())),
    "slo": either(st.fixed_dictionaries({}, optional={"max_memory": either(st.sampled_from(["70GiB", "1GB", "12"])),
                                                      "min_kv_cache_tokens": either(st.integers(1, 10**6)),
                                                      "tpot_p99_ms": numbers})),
    "trials": either(st.integers(1, 20)), "storage": st.sampled_from(STORAGES), "study_name": either(st.just("@STUDY@")),
    "seed": either(st.integers(0, 100)), "sampler": either(st.sampled_from(["guided", "tpe", "random", "grid"])),
    "repeats": either(st.integers(1, 3)), "confirm": either(st.integers(0, 2)), "tolerance": either(st.floats(0, 0.5)),
    "time_budget": either(DURATIONS), "startup_timeout": either(st.floats(1, 100)), "window_timeout": numbers,
    "log_dir": either(st.just("@CASE@/logs")), "heartbeat_interval": either(st.integers(1, 60)),
    "grace_period": either(st.integers(2, 200)), "storage_outage_limit": either(DURATIONS), "bogus": scalars,
}


@st.composite
def studies(draw: st.DrawFn) -> Any:
    """A study configuration's data: the target, a workload and some of the other fields, any of
    them odd."""
    data: dict[str, Any] = {}
    if usually(draw, 12):
        data["target"] = draw(either(st.just(TARGET), st.one_of(odd_text, json_values()), odds=6))
    if usually(draw, 12):
        data["workload"] = draw(either(workload_section, st.one_of(odd_text, json_values()), odds=6))
    data["storage"] = "@STORAGE@"
    data["study_name"] = "@STUDY@"
    for key in draw(st.lists(st.sampled_from(sorted(study_fields)), min_size=1, max_size=3, unique=True)):
        data[key] = draw(study_fields[key])
    return draw(either(st.just(data), odds=8))


@st.composite
def study_cases(draw: st.DrawFn) -> Case:
    """``optimize --create-only --config STUDY.yaml``."""
    return Case("study", ("optimize", "--create-only", "--config", "@CASE@/study.yaml"),
                (("study.yaml", draw(yaml_file(draw(studies())))),))


# =============================================================================================
# vllm bench result files for `spectune import`


def bench_result(**change: Any) -> dict[str, Any]:
    """A ``vllm bench serve --save-result`` file that fits the warm study (its target, 4 prompts,
    one at a time), for the candidate :data:`GOOD_SPEC`."""
    n = len(FIXTURE_PROMPTS)
    out: dict[str, Any] = {
        "date": "20261201-120000", "backend": "openai", "model_id": TARGET, "tokenizer_id": TARGET, "num_prompts": n,
        "request_rate": "inf", "burstiness": 1.0, "max_concurrency": 1, "duration": 4.0, "completed": n, "failed": 0,
        "total_input_tokens": 40, "total_output_tokens": 256, "request_throughput": 1.0, "output_throughput": 64.0,
        "total_token_throughput": 74.0, "mean_ttft_ms": 20.0, "median_ttft_ms": 20.0, "p99_ttft_ms": 30.0,
        "mean_tpot_ms": 15.0, "median_tpot_ms": 15.0, "p99_tpot_ms": 18.0, "mean_itl_ms": 15.0, "median_itl_ms": 15.0,
        "p99_itl_ms": 18.0, "mean_e2el_ms": 1000.0, "median_e2el_ms": 1000.0, "p99_e2el_ms": 1100.0,
        "spec_decode_acceptance_rate": 50.0, "spec_decode_acceptance_length": 2.0, "spec_decode_num_drafts": 100,
        "spec_decode_draft_tokens": 200, "spec_decode_accepted_tokens": 100,
        "spec_decode_per_position_acceptance_rates": [0.6, 0.4], "speculative_config": json.dumps(GOOD_SPEC),
    }
    return {**out, **change}


RESULT_KEYS = sorted(bench_result()) + ["speculative-config", "workload", "dataset", "version", "hardware",
                                        "max_num_seqs", "max-num-seqs"]
spec_values = st.one_of(st.just(json.dumps(GOOD_SPEC)), st.just(GOOD_SPEC), st.just(""), st.just("none"),
                        st.builds(lambda k: json.dumps({**GOOD_SPEC, "num_speculative_tokens": k}), ints),
                        st.sampled_from(["{", "[1]", "{\"method\": \"bogus\"}", "a: [", "*x", "!!python/name:os.system",
                                         "{\"model\": \"org/d\"}", "1e999", "null"]))


@st.composite
def results(draw: st.DrawFn) -> Any:
    """A result file's data: the fitting one with some fields odd, removed or added."""
    data = bench_result()
    for key in draw(st.lists(st.sampled_from(RESULT_KEYS), max_size=3, unique=True)):
        how = draw(st.sampled_from(["odd", "odd", "drop", "spec"]))
        if how == "drop":
            data.pop(key, None)
        elif how == "spec" or key in ("speculative_config", "speculative-config"):
            data[key] = draw(spec_values)
        else:
            data[key] = draw(st.one_of(numbers, odd_text, json_values()))
    return draw(either(st.just(data)))


@st.composite
def import_cases(draw: st.DrawFn) -> Case:
    """``import`` of one to three result files (or a ``vllm bench sweep`` folder of them) into
    the warm study, with or without ``--spec`` and ``--engine-arg``."""
    files = []
    sweep = rarely(draw, 5)
    for i in range(draw(st.integers(1, 3))):
        name = f"sweep/a/run={i}.json" if sweep else f"result{i}.json"
        files.append((name, draw(mangled(dump_json(draw(results()), draw(st.booleans())), RAW_JSON))))
    paths = ["@CASE@/sweep"] if sweep else [f"@CASE@/{name}" for name, _ in files]
    argv = ["import", *paths, "--study", draw(either(st.just(WARM), st.sampled_from(["", "nope", "@STUDY@"]))),
            "--storage", draw(either(st.just("@STORAGE@"), st.sampled_from(STORAGES)))]
    if rarely(draw, 4):
        argv += ["--spec", draw(spec_values.map(lambda v: v if isinstance(v, str) else json.dumps(v)))]
    if rarely(draw, 4):
        argv += ["--engine-arg", draw(st.one_of(st.sampled_from(["max_num_seqs=8", "max_num_seqs=[", "bogus=1", "=1",
                                                                 "max_num_seqs", "max_num_seqs=*a", "dtype=!!binary x"]),
                                                odd_text))]
    return Case("import", tuple(argv), tuple(files))


# =============================================================================================
# Command-line values


OPTIONS: dict[str, dict[str, st.SearchStrategy[str]]] = {}


def _opt_values() -> None:
    """The options of each command that reads input, with odd values (no option that starts an
    engine, a dashboard or a build: ``optimize`` always gets ``--create-only``)."""
    text = st.one_of(odd_text, st.sampled_from(["1", "0", "-1", "2", "99999999999999999999", "1e3", "nan", "inf",
                                               "1,8,32", "0-1,2-3", "0-0", "3-1", "0,0", "a", "none", "@STUDY@", WARM]))
    storage = st.sampled_from(STORAGES)
    study = either(st.just(WARM), text)
    out_path = st.sampled_from(["@CASE@/sub/out.md", "report.md", "@CASE@/out.yaml", "@CASE@", "out.html", "",
                                "@CASE@/x.txt"])  # an HTML report takes ten times a Markdown one
    OPTIONS.update({
        "optimize": {
            "--target": either(st.just(TARGET), text), "--workload": either(SOURCES, text),
            "--space": either(st.sampled_from(SHIPPED_SPACES), text), "--draft": text,
            "--objective": either(st.sampled_from(OBJECTIVES), text), "--trials": text, "--storage": storage,
            "--study": either(st.just("@STUDY@"), text), "--seed": text,
            "--sampler": either(st.sampled_from(["guided", "tpe", "random", "grid"]), text), "--confirm": text,
            "--time-budget": either(DURATIONS, text), "--tolerance": text, "--max-memory": text,
            "--min-kv-cache-tokens": text, "--gpus": text, "--storage-outage-limit": either(DURATIONS, text),
            "--config": st.sampled_from(["@FIX@/w.jsonl", "@CASE@", "nope.yaml", ""]), "--no-extend": st.just(""),
        },
        "import": {"--study": study, "--storage": storage, "--engine-arg": text,
                   "--spec": either(spec_values.filter(lambda v: isinstance(v, str)), text)},
        "show": {"--study": study, "--storage": storage, "--json": st.just("")},
        "export": {"--study": study, "--storage": storage, "-o": out_path, "--schedule": st.just(""), "--max-batch": text},
        "report": {"--study": study, "--storage": storage, "-o": out_path,
                   "--format": either(st.sampled_from(["html", "md"]), text)},
    })


_opt_values()
FLAGS = {"--json", "--schedule", "--no-extend"}
STRAYS = ["--bogus", "-x", "--", "--help", "extra", "--storage", "--study=", "--trials=0", "-v"]


@st.composite
def cli_cases(draw: st.DrawFn) -> Case:
    """One command (``optimize --create-only``, ``import``, ``show``, ``export``, ``report``,
    ``workloads list``, or none) with some of its options, odd values, unknown options and stray
    arguments; the options given first (the harness's storage, the warm study) are often
    overridden by later ones."""
    command = draw(st.sampled_from([*OPTIONS, "optimize", "optimize", "workloads", "nonsense", ""]))
    if command == "workloads":
        argv = ["workloads", draw(st.sampled_from(["list", "list", "nope", ""]))]
    else:
        argv = [command] if command else []
    options = OPTIONS.get(command, {})
    if command == "optimize":
        argv += ["--create-only", "--storage", "@STORAGE@", "--study", "@STUDY@", "--target", TARGET,
                 "--workload", "@FIX@/w.jsonl"]
    if command == "import":
        argv += [draw(st.sampled_from(["@CASE@/r.json", "@FIX@/w.jsonl", "@CASE@", "nope.json", "", "-"])), "--study", WARM]
    if command in ("import", "show", "export", "report") and usually(draw, 3):
        argv += ["--storage", "@STORAGE@"]
    if command == "report":
        argv += ["-o", "@CASE@/report.md"]
    for name in draw(st.lists(st.sampled_from(sorted(options)), max_size=4)) if options else []:
        argv += [name] if name in FLAGS else [name, draw(options[name])]
    if rarely(draw, 5):  # never before optimize's --create-only: "--storage --create-only" would run the study
        first = 2 if command == "optimize" else 0
        argv.insert(draw(st.integers(first, len(argv))), draw(st.sampled_from(STRAYS)))
    files = (("r.json", dump_json(bench_result()).encode()),)
    return Case("cli", tuple(argv), files)


STRATEGIES: dict[str, st.SearchStrategy[Case]] = {
    "workload": workload_cases(), "space": space_cases(), "study": study_cases(), "import": import_cases(), "cli": cli_cases(),
}


def run_property(harness: Harness, strategy: st.SearchStrategy[Case], examples: int) -> Counter[str]:
    """Run ``examples`` cases drawn from ``strategy`` (deterministically) through ``harness``;
    fail on the first case that ends badly (hypothesis then shrinks it). Returns how many ended
    each way (``exit 0``, ``exit 2``)."""
    seen: Counter[str] = Counter()

    @hostile_settings(examples)
    @given(case=strategy)
    def one(case: Case) -> None:
        outcome = harness.run(case)
        seen[outcome.verdict] += 1
        assert outcome.problem is None, (f"{outcome.problem}\nexit {outcome.code}\nstderr: {outcome.stderr[-3000:]}\n"
                                         f"stdout: {outcome.stdout[-1000:]}")

    one()
    return seen
