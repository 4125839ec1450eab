"""The house rules: spectune's layers (pyproject's import-linter contracts) and no import cycle."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import REPO


def _cycles() -> list[list[str]]:
    """Strongly connected groups of spectune's modules (type-only imports included)."""
    import grimp

    graph = grimp.build_graph("spectune", cache_dir=None)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return groups


def test_no_module_imports_one_that_imports_it_back() -> None:
    assert _cycles() == []


def test_each_layer_imports_only_from_the_layers_below_it() -> None:
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    done = subprocess.run([sys.executable, "-c", code, "--no-cache", "--config", str(REPO / "pyproject.toml")], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "2 kept, 0 broken" in done.stdout


MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80


def _oversized(root: Path) -> list[str]:
    """Modules over :data:`MAX_MODULE_LINES` lines and functions over :data:`MAX_FUNCTION_LINES`
    (their docstring aside) under ``root``."""
    import ast

    found = []
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        if (n := len(source.splitlines())) > MAX_MODULE_LINES:
            found.append(f"{path.relative_to(root.parent)}: {n} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = node.body[0]
                doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str)
                start = first.end_lineno + 1 if doc and len(node.body) > 1 else node.lineno
                if (n := node.end_lineno - start + 1) > MAX_FUNCTION_LINES:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name}: {n} lines")
    return found


def test_no_module_or_function_outgrows_its_room(tmp_path: Path) -> None:
    assert _oversized(REPO / "spectune") == []
    # the rule sees what it is meant to: a long module and a long function in it
    long = tmp_path / "pkg"
    long.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES + 1))
    (long / "m.py").write_text(f'def f():\n    """Doc."""\n{body}\n' + "\n" * MAX_MODULE_LINES)
    assert _oversized(long) == ["pkg/m.py: " + f"{MAX_FUNCTION_LINES + 3 + MAX_MODULE_LINES} lines",
                                f"pkg/m.py:1 f: {MAX_FUNCTION_LINES + 1} lines"]
