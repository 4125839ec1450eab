"""Small shared helpers: pydantic base, YAML loading with one-line errors, atomic writes, the
points where a worker may be stopped."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from spectune.errors import ConfigError

M = TypeVar("M", bound=BaseModel)

ProgressHook = Callable[[str, int, int], None]
"""Progress of a long job, injected by the caller (None: silent): called with ``(phase, done,
total)`` whenever the job enters a phase or counts one more item in it. ``total`` > 0 makes the
phase countable (requests sent, training steps); 0 leaves it open-ended (an engine starting).
A phase is named for a person ("training the draft for {total} steps": the renderer puts the
count in), or by a short key that its renderer names (a trial's "start", "warmup", "measure")."""


def silent(phase: str, done: int, total: int) -> None:
    """The :data:`ProgressHook` of a job nobody watches."""


@contextlib.contextmanager
def every(seconds: float, call: Callable[[], None], name: str) -> Iterator[None]:
    """Call ``call`` now and then every ``seconds``, in a daemon thread named ``name``, while the
    block runs; the thread has ended when the block is left. ``call`` handles its own errors."""
    stop = threading.Event()

    def loop() -> None:
        while True:
            call()
            if stop.wait(seconds):
                return

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


class Stopped(KeyboardInterrupt):
    """A polite stop of a worker (SIGTERM, Ctrl-C), raised only where it waits (:data:`STOPS`).

    A KeyboardInterrupt, so that every path that stops an engine and marks its trial
    interrupted on Ctrl-C does the same for it."""


class StopPoints:
    """Where a polite stop may land in a worker's threads: only where they wait (an engine
    measuring, a sleep before asking the study again), never while they create, record or tell
    a trial, so that a stop leaves nothing half-written. A stop asked of a thread elsewhere is
    raised at its next waiting point.

    Thread-safe. :meth:`stop_here` may be called from a signal handler in the thread it stops
    (it takes no lock); :meth:`stop_thread` from any other thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[int, int] = {}
        self._asked: set[int] = set()

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """A block where a stop may land: raised at once if one was asked before it."""
        tid = threading.get_ident()
        with self._lock:
            self._waiting[tid] = self._waiting.get(tid, 0) + 1
        try:
            self.check()
            yield
        finally:
            with self._lock:
                self._waiting[tid] -= 1

    def check(self) -> None:
        """Raise :class:`Stopped` if a stop was asked of this thread."""
        tid = threading.get_ident()
        if tid in self._asked:
            self._asked.discard(tid)
            raise Stopped

    def stop_here(self) -> None:
        """Stop this thread: now where it waits, else at its next waiting point."""
        tid = threading.get_ident()
        if self._waiting.get(tid):
            raise Stopped
        self._asked.add(tid)

    def stop_thread(self, tid: int) -> None:
        """Stop thread ``tid`` (another one): now where it waits, else at its next waiting point."""
        import ctypes

        with self._lock:
            if self._waiting.get(tid):
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid), ctypes.py_object(Stopped))
            else:
                self._asked.add(tid)

    def forget(self) -> None:
        """Drop the stops asked of threads that never reached a waiting point again."""
        self._asked.clear()


STOPS = StopPoints()
"""The process's stop points: signals reach a process, not a worker."""


def is_loopback(host: str) -> bool:
    """Whether an address to listen on is reachable from this machine only (``127.0.0.1``,
    ``::1``, ``localhost``); a name or a wildcard (``0.0.0.0``) is not."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def lone_surrogate(value: Any) -> str | None:
    """Where a text in ``value`` (a string, or a list, tuple or dict of them) is no valid
    Unicode, in words (``"[2]: a lone surrogate '\\udcff' at character 4"``); None when all are.
    A lone surrogate comes from a JSON or YAML escape (``"\\ud800"``) or from command-line
    bytes that are no UTF-8; it can be neither stored nor sent to an engine."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            return f": a lone surrogate {value[e.start]!r} at character {e.start}"
        return None
    if isinstance(value, dict):
        items: Any = [(f".{k}", k) for k in value] + [(f".{k}", v) for k, v in value.items()]
    elif isinstance(value, list | tuple):
        items = [(f"[{i}]", v) for i, v in enumerate(value)]
    else:
        return None
    for where, item in items:
        if (why := lone_surrogate(item)) is not None:
            return f"{where if isinstance(where, str) and where.isprintable() else ''}{why}"
    return None


class StrictModel(BaseModel):
    """Base of every configuration model: unknown keys are errors, values are validated, and
    every text is valid Unicode (:func:`lone_surrogate`)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)

    @model_validator(mode="after")
    def _valid_unicode(self) -> Any:
        for name, value in [*self.__dict__.items(), *(self.__pydantic_extra__ or {}).items()]:
            if (why := lone_surrogate(value)) is not None:
                raise ValueError(f"{name}{why}: not valid Unicode text")
        return self


def describe_validation_error(err: ValidationError, source: str | None = None) -> str:
    """One line naming the first offending key (dotted path) and why; ``source`` prefixes it."""
    first = err.errors()[0]
    loc = ".".join(str(p) if str(p).isprintable() else repr(str(p)) for p in first.get("loc", ()) if p != "__root__")
    msg = first.get("msg", "invalid value")
    if first.get("type") == "extra_forbidden":
        msg = "unknown key"
    msg = msg.removeprefix("Value error, ")
    where = f"{source}: " if source else ""
    more = f" (and {len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    return f"{where}{loc + ': ' if loc else ''}{msg}{more}"


def key_error(model: str, key: str, message: str, value: Any) -> ValidationError:
    """A validation error of ``model``'s key ``key``, for a model validator to raise: unlike a
    ``ValueError`` it keeps the key in the error's location (``methods.ngram.k: unknown key``)."""
    from pydantic_core import InitErrorDetails, PydanticCustomError

    kind = PydanticCustomError("spectune_key", "{message}", {"message": message})
    return ValidationError.from_exception_data(model, [InitErrorDetails(type=kind, loc=(key,), input=value)])


def validate(model: type[M], data: Any, source: str | None = None) -> M:
    """Validate ``data`` into ``model``; a failure becomes a one-line :class:`ConfigError`."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(describe_validation_error(e, source)) from e


YAML_MAX_VALUES = 100_000
"""The most values (scalars, lists and mappings, aliases counted as often as they are used) a
YAML document spectune reads may hold: a configuration is far smaller, and an alias bomb far
larger (nine levels of nine aliases are 387 million values)."""


@functools.cache
def _yaml_loader() -> type:
    """PyYAML's safe loader (libyaml's where PyYAML has it: ten times faster, and it refuses
    more than 1000 levels of nesting) that refuses a key given twice in one mapping (YAML forbids
    it; the safe loader keeps the last silently)."""
    import yaml

    class Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            if isinstance(node, yaml.MappingNode):
                seen: set[Any] = set()
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                        continue
                    key = self.construct_object(key_node)
                    if key in seen:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"key {key!r} given twice in one mapping", key_node.start_mark)
                    seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return Loader


_JSON_TYPES = (str, int, float, bool, type(None))


def _check_plain(data: Any, source: str) -> None:
    """Refuse a document that is not plain data: a value YAML reads as a date, binary or set
    (whose text spectune would not see), one that contains itself, or one larger than
    :data:`YAML_MAX_VALUES` once its aliases are expanded. Iterative: the depth is unbounded."""
    count = 0
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(data, False)]
    while stack:
        value, leaving = stack.pop()
        if leaving:
            on_path.discard(id(value))
            continue
        count += 1
        if count > YAML_MAX_VALUES:
            raise ConfigError(f"{source}: invalid YAML: more than {YAML_MAX_VALUES} values once its aliases "
                              "are expanded")
        if isinstance(value, _JSON_TYPES):
            continue
        if not isinstance(value, dict | list):
            shown = repr(value) if len(repr(value)) < 40 else repr(value)[:37] + "..."
            raise ConfigError(f"{source}: invalid YAML: {shown} is a {type(value).__name__}, not text, a number, "
                              "a list or a mapping (quote it)")
        if id(value) in on_path:
            raise ConfigError(f"{source}: invalid YAML: an alias refers to a value that contains it")
        on_path.add(id(value))
        stack.append((value, True))
        if isinstance(value, dict):
            stack.extend((k, False) for k in value if not isinstance(k, _JSON_TYPES))
            stack.extend((v, False) for v in value.values())
        else:
            stack.extend((v, False) for v in value)


def parse_yaml(text: str, source: str) -> Any:
    """Parse YAML ``text``; anything that is not a plain document becomes a one-line
    ConfigError naming ``source``: a syntax error (with its line), a key given twice, a value
    YAML cannot build (``!!int abc``, the date 2001-02-30), a document nested too deeply, or one
    that is not plain data (see :func:`_check_plain`)."""
    import yaml

    try:
        data = yaml.load(text, Loader=_yaml_loader())  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(" ".join(f"{source}:{where} invalid YAML: {problem}".split())) from e
    except RecursionError as e:
        raise ConfigError(f"{source}: invalid YAML: nested too deeply") from e
    except (ValueError, TypeError, OverflowError) as e:  # a constructor's own error: !!int abc, 2001-02-30
        raise ConfigError(" ".join(f"{source}: invalid YAML: {e}".split())) from e
    _check_plain(data, source)
    return data


def load_yaml_file(path: Path) -> Any:
    """Parse a YAML file (:func:`parse_yaml`); a missing or unreadable file, one that is not
    UTF-8 text, or one that is not a plain YAML document becomes a one-line ConfigError."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text: {e.reason} at byte {e.start}") from e
    except ValueError as e:  # a NUL in the path
        raise ConfigError(f"{path!r}: cannot read: {e}") from e
    return parse_yaml(text, str(path))


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename.

    Either the whole new content is there afterwards, or the earlier file is left intact.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; a written file gets the usual mode
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def package_file(module: str, relpath: str) -> Path | None:
    """The file ``relpath`` inside installed package ``module``, or None when either is missing.

    Found through the import system without running the package's code: data-only installs
    (``pip install --no-deps``) whose ``__init__`` would fail to import still work.
    """
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / relpath
        if candidate.is_file():
            return candidate
    return None
