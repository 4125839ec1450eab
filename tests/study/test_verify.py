"""spectune verify on real engines: the grid study's export holds where it was measured; a file that is not
what the study measured fails before any engine starts; bad input is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from spectune.cli import main
from spectune.export import export_best
from spectune.results import open_study
from spectune.verify import verify

pytestmark = pytest.mark.engine


@pytest.fixture
def exported(grid_study, tmp_path: Path) -> Path:
    """The grid study's fastest speculative configuration, exported as a team that deploys it would."""
    view = open_study(grid_study.config.storage, "grid")
    fastest = max((r for r in view.complete() if not r.is_baseline and r.feasible), key=lambda r: r.values[0])
    out = export_best(view, tmp_path / "best.yaml", trial=fastest.number)
    assert out.choice.reason.startswith(f"trial {fastest.number} as asked (")
    return out.path


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    out, err = capsys.readouterr()
    return exit_.value.code, out, err


@pytest.mark.quiet  # the speed measured now against the study's
def test_the_export_holds_where_it_was_measured(exported: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    provenance = json.loads(exported.with_name("best.provenance.json").read_text())
    code, out, err = _run(["verify", str(exported), "--json", "--log-dir", str(tmp_path / "logs")], capsys)
    verdict = json.loads(out)
    assert code == 0 and verdict["holds"], verdict["reason"]
    assert verdict["config"] == provenance["config"] and verdict["claimed"] == pytest.approx(provenance["speedup"])
    low, high = verdict["band"]
    assert low < verdict["claimed"] < high and verdict["speedup"] >= low
    assert verdict["reason"].startswith(f"holds: {provenance['config']} serves ")
    assert verdict["fidelity"]["compared"] == verdict["fidelity"]["identical"] == 4  # float32: the same answers
    assert verdict["differences"] == []  # measured here, with this spectune
    assert len(list((tmp_path / "logs").iterdir())) == 2  # the file's engine and its baseline


def test_a_file_that_is_not_what_the_study_measured_fails_before_any_engine(
        exported: Path, tiny_models, capsys: pytest.CaptureFixture[str]) -> None:
    config = yaml.safe_load(exported.read_text())
    measured = config["model"]
    exported.write_text(yaml.safe_dump({**config, "model": str(tiny_models.draft)}, sort_keys=False))

    def no_engine(*args: object, **kwargs: object) -> None:
        raise AssertionError("an engine was started")

    verdict = verify(exported, measure_fn=no_engine)
    assert not verdict.holds
    assert verdict.reason == (f"best.yaml is not what the study measured: model: the file says {str(tiny_models.draft)!r}, "
                              f"the study measured {measured!r}")
    code, out, err = _run(["verify", str(exported)], capsys)
    assert code == 1 and out.splitlines()[0] == verdict.reason


def test_bad_input_is_refused_in_one_line(exported: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = []
    lone = tmp_path / "lone.yaml"
    lone.write_text(exported.read_text())
    cases.append((lone, "lone.provenance.json: no provenance beside lone.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed")
    cases.append((bad, "invalid YAML"))
    port = tmp_path / "port.yaml"
    port.write_text(yaml.safe_dump({**yaml.safe_load(exported.read_text()), "port": 8000}))
    port.with_name("port.provenance.json").write_text(exported.with_name("best.provenance.json").read_text())
    cases.append((port, "port is set by spectune itself"))
    for path, why in cases:
        code, out, err = _run(["verify", str(path)], capsys)
        assert code == 2 and why in err and len(err.strip().splitlines()) == 1, err
    code, _, err = _run(["verify", str(exported), "--max-memory", "lots"], capsys)
    assert code == 2 and "--max-memory" in err
