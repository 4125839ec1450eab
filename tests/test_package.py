"""The package face: what a wheel built from the repository holds, and an installed spectune
that finds its shipped spaces from any directory."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from conftest import REPO


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    source = tmp_path_factory.mktemp("source")  # a copy: the build leaves its build/ folder there
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for name in ("spectune", "search_spaces"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(source)], check=True, capture_output=True, timeout=300)
    (built,) = out.glob("spectune-*.whl")
    return built


def test_the_wheel_holds_every_module_the_spaces_and_the_type_marker(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {str(p.relative_to(REPO)) for p in (REPO / "spectune").rglob("*.py")}
    assert modules <= names, f"modules left out of the wheel: {sorted(modules - names)}"
    spaces = {f"spectune/search_spaces/{p.name}" for p in (REPO / "search_spaces").glob("*.yaml")}
    assert spaces and spaces <= names
    assert "spectune/py.typed" in names
    assert not any(n.startswith(("tests/", "benchmarks/", "search_spaces/")) for n in names)


def test_an_installed_wheel_finds_its_spaces_from_any_directory(wheel: Path, tmp_path: Path) -> None:
    """A fresh virtual environment, spectune from the wheel (its dependencies from this one's
    site-packages, without this checkout's editable spectune): ``optimize --space default``
    creates its study from an unrelated directory."""
    env_dir = tmp_path / "fresh"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    deps = [p for p in sys.path if p.endswith("site-packages")]  # paths: their .pth files are not run
    (site / "deps.pth").write_text("".join(f"{p}\n" for p in deps))
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)],
                   check=True, capture_output=True, timeout=300)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = subprocess.run([str(python), "-c", "import spectune; print(spectune.__file__)"], cwd=elsewhere,
                           check=True, capture_output=True, text=True).stdout.strip()
    assert where.startswith(str(site)), where  # the wheel's spectune, not this checkout's
    prompts = elsewhere / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"def f{i}(x):"}) + "\n" for i in range(4)))
    done = subprocess.run([str(env_dir / "bin" / "spectune"), "optimize", "--space", "default", "--target", "stand-in",
                           "--workload", str(prompts), "--storage", f"sqlite:///{elsewhere / 's.db'}", "--study", "w",
                           "--create-only"], cwd=elsewhere, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "created study w" in done.stdout
    # the storage's default is said in --help, and $SPECTUNE_STORAGE overrides it
    helped = subprocess.run([str(env_dir / "bin" / "spectune"), "show", "--help"], cwd=elsewhere, capture_output=True,
                            text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "COLUMNS": "200"})
    assert "$SPECTUNE_STORAGE" in helped.stdout and "sqlite:///storage/spectune.db" in helped.stdout
    shown = subprocess.run([str(env_dir / "bin" / "spectune"), "show"], cwd=elsewhere, capture_output=True, text=True,
                           timeout=60, env={"PATH": "/usr/bin:/bin", "SPECTUNE_STORAGE": f"sqlite:///{elsewhere / 's.db'}"})
    assert "no completed baseline" in shown.stdout + shown.stderr  # study w, found through the variable


def test_the_package_face_names_the_public_api_and_imports_it_when_used() -> None:
    code = ("import sys, spectune; light = not any(m in sys.modules for m in ('optuna', 'sklearn', 'vllm', 'torch'));"
            "import spectune.worker, spectune.trial, spectune.results, spectune.export;"
            "assert spectune.optimize is spectune.worker.run_study and spectune.measure is spectune.trial.measure;"
            "assert spectune.open_study is spectune.results.open_study and spectune.export_best is spectune.export.export_best;"
            "missing = [n for n in spectune.__all__ if getattr(spectune, n, None) is None];"
            "print(light, missing)")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    assert out == ["True", "[]"]
