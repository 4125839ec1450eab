"""A guided study whose pick sits on the edge of its space, replayed on the recorded tiny landscape: its
space holds n-gram k 1..3 of the landscape's 1..6, where k=3 leads k=1 and k=2 and the landscape's best
lies past the edge. The study widens the range and measures there, or with ``extend: false`` keeps to
its space and reports what it predicts beyond; ``show``, the log, the report and the export say which."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from landscape_runs import landscape_values, replay_workers
from rich.console import Console

from spectune._tables import render_study
from spectune.export import export_best
from spectune.landscape import Landscape
from spectune.records import StudyRecord
from spectune.report import render_html, render_markdown
from spectune.results import open_study
from spectune.worker import run_study

K = "ngram.num_speculative_tokens"
NARROW = """\
methods:
  none: {}
  ngram:
    num_speculative_tokens: {low: 1, high: 3, bounds: [1, 6]}
    prompt_lookup_max: 3
    prompt_lookup_min: 1
"""


def k_of(label: str) -> int | None:
    return int(label.split("k=")[1].split()[0]) if label.startswith("ngram k=") else None


def config(landscape: Landscape, tmp_path: Path, name: str, **overrides: object):  # noqa: ANN201
    space = tmp_path / "narrow.yaml"
    space.write_text(NARROW)
    settings = {"sampler": "guided", "trials": 20, **overrides}
    return landscape.config(storage=f"sqlite:///{tmp_path / f'{name}.db'}", study_name=name, space=str(space),
                            log_dir=str(tmp_path / "logs"), **settings)


def shown(view) -> str:  # noqa: ANN001
    console = Console(width=400, record=True)
    render_study(view, console)
    return console.export_text()


def test_a_pick_on_the_edge_widens_the_range_and_the_study_measures_past_it(
        landscape: Landscape, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    values = landscape_values(landscape)
    inside = {k: values[f"ngram k={k} lookup=1..3"] for k in (1, 2, 3)}
    assert max(inside, key=inside.__getitem__) == 3  # the narrow space's best sits on its edge
    assert max(values[f"ngram k={k} lookup=1..3"] for k in (4, 5, 6)) > inside[3]  # and the landscape's lies past it
    spent: list[tuple[str, float]] = []
    cfg = config(landscape, tmp_path, "wide")
    with caplog.at_level(logging.INFO, logger="spectune.search"):
        run_study(cfg, measure_fn=landscape.measurer(spent))
    measured = [k for label, _ in spent if (k := k_of(label)) is not None]
    assert max(measured) > 3 and max(measured) <= 6  # past the edge, within the range's bounds
    view = open_study(cfg.storage, "wide")
    record = StudyRecord.of(view.study)
    assert [(e["param"], e["was"]["high"], e["range"]["high"]) for e in record.extensions or []] == [(K, 3, 6)]
    assert "sits on its edge" in record.extensions[0]["because"]  # type: ignore[index]
    assert any("sits on the edge of ngram.num_speculative_tokens (1..3): guided search widens it to 1..6"
               in r.getMessage() for r in caplog.records)
    # the stopping rule counted the candidates past the edge: each was measured or skipped as worse
    skipped = {s["config"] for s in (record.guide or {})["skipped"]}
    labels = {r.label for r in view.rows}
    assert {f"ngram k={k} lookup=1..3" for k in (4, 5, 6)} <= labels | skipped
    best = view.best()
    top = max((c for c in view.engines() if c.feasible), key=lambda c: c.value)
    assert best.row.label == top.row.label and (k_of(best.row.label) or 0) > 3
    # Optuna holds the trial past the edge under the widened range: the dashboard shows it in range
    past = next(t for t in view.study.trials if t.params.get(K, 0) > 3)
    assert past.distributions[K].high == 6
    note = "Guided search widened ngram.num_speculative_tokens from 1..3 to 1..6"
    assert note in shown(view)
    assert note in render_markdown(view) and note in render_html(view)
    out = tmp_path / "best.yaml"
    export_best(view, out)
    provenance = json.loads(out.with_name("best.provenance.json").read_text())
    assert any(note in line for line in provenance["space_edges"])


def test_a_study_kept_to_its_space_predicts_past_the_edge_and_measures_nothing_there(
        landscape: Landscape, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spent: list[tuple[str, float]] = []
    cfg = config(landscape, tmp_path, "kept", extend=False)
    with caplog.at_level(logging.INFO, logger="spectune.search"):
        run_study(cfg, measure_fn=landscape.measurer(spent))
    assert all((k_of(label) or 0) <= 3 for label, _ in spent)
    view = open_study(cfg.storage, "kept")
    record = StudyRecord.of(view.study)
    assert not record.extensions
    beyond = (record.guide or {})["beyond_edge"]
    assert beyond["candidates"] == 3 and 3 < (k_of(beyond["best"]) or 0) <= 6 and 0.0 <= beyond["chance"] <= 1.0
    assert any("the study keeps to its space (extend: false)" in r.getMessage() for r in caplog.records)
    text = shown(view)
    assert f"past it, 3 candidates are predicted, the best {beyond['best']}" in text
    assert "though ngram k=3 lookup=1..3 (trial 1) sits on the edge of ngram.num_speculative_tokens" in text
    assert "past it, 3 candidates are predicted" in render_markdown(view)


def test_two_slots_measure_past_the_edge_widened_once(landscape: Landscape, tmp_path: Path) -> None:
    ended = replay_workers(config(landscape, tmp_path, "fleet"), landscape, 2)
    assert max(k_of(label) or 0 for _, label in ended) > 3
    view = open_study(f"sqlite:///{tmp_path / 'fleet.db'}", "fleet")
    assert len(StudyRecord.of(view.study).extensions or []) == 1  # widened once, seen by both slots
    assert all(t.state.name == "COMPLETE" for t in view.study.trials)


def test_no_extend_on_the_command_line_is_kept_with_the_study(tmp_path: Path) -> None:
    from spectune.cli import main

    storage = f"sqlite:///{tmp_path / 's.db'}"
    for study, flags in (("kept", ["--no-extend"]), ("free", [])):
        with pytest.raises(SystemExit) as exit_:
            main(["optimize", "--target", str(tmp_path), "--workload", "humaneval", "--storage", storage,
                  "--study", study, "--create-only", *flags])
        assert exit_.value.code == 0
    stored = {name: StudyRecord.of(open_study(storage, name).study).spectune_config for name in ("kept", "free")}
    assert stored["kept"]["extend"] is False and stored["free"]["extend"] is True  # type: ignore[index]


def test_a_space_measured_through_still_grows_past_its_edge_on_resume(landscape: Landscape, tmp_path: Path) -> None:
    """The grid measures every candidate of the narrow space; guided search resumed on it (a fresh
    strategy, as a new process) widens the range its pick sits on, and a later resume reads the widening."""
    spent: list[tuple[str, float]] = []
    grid = config(landscape, tmp_path, "through", sampler="grid", trials=4)
    run_study(grid, measure_fn=landscape.measurer(spent))
    assert sorted(k_of(label) or 0 for label, _ in spent) == [0, 1, 2, 3]
    run_study(grid.model_copy(update={"sampler": "guided", "trials": 12}), measure_fn=landscape.measurer(spent))
    assert max(k_of(label) or 0 for label, _ in spent) > 3
    view = open_study(grid.storage, "through")
    assert [e["range"]["high"] for e in StudyRecord.of(view.study).extensions or []] == [6]
    before = len(spent)
    run_study(grid.model_copy(update={"sampler": "guided", "trials": 14}), measure_fn=landscape.measurer(spent))
    assert all((k_of(label) or 0) <= 6 for label, _ in spent[before:])  # within the widened range's bounds
    assert [e["range"]["high"] for e in StudyRecord.of(open_study(grid.storage, "through").study).extensions or []] == [6]


def test_a_range_is_not_widened_past_the_candidates_guided_search_predicts(
        landscape: Landscape, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import spectune.search._study as study_module

    monkeypatch.setattr(study_module, "WIDEN_MAX_CANDIDATES", 5)  # the narrow space holds 4, widened 7
    spent: list[tuple[str, float]] = []
    with caplog.at_level(logging.INFO, logger="spectune.search"):
        run_study(config(landscape, tmp_path, "capped"), measure_fn=landscape.measurer(spent))
    assert all((k_of(label) or 0) <= 3 for label, _ in spent)
    assert not StudyRecord.of(open_study(f"sqlite:///{tmp_path / 'capped.db'}", "capped").study).extensions
    assert any("which is not widened: the space would hold 7 candidates, more than 5" in r.getMessage()
               for r in caplog.records)
