"""A landscape moved to other model folders: its checkpoints recorded beside the target move too."""

from __future__ import annotations

from pathlib import Path

from spectune.landscape import Landscape

REPO = Path(__file__).resolve().parents[2]


def test_checkpoints_beside_the_target_move_with_it() -> None:
    landscape = Landscape.load(REPO / "benchmarks" / "landscapes" / "tiny_one_start.json")
    recorded = {p.spec.get("model") for p in landscape.points} - {None}
    assert recorded == {landscape.draft} and Path(landscape.draft).parent == Path(landscape.target).parent
    moved = landscape.rebase("/elsewhere/models/target")  # no draft named: it moves as a sibling
    models = {p.spec.get("model") for p in moved.points} - {None}
    assert models == {"/elsewhere/models/draft"}
    assert {p.measurement.spec.model for p in moved.points if p.measurement and p.measurement.spec.model} == models
    assert {p.measurement.engine.model for p in moved.points if p.measurement} == {"/elsewhere/models/target"}
    named = landscape.rebase("/elsewhere/models/target", "org/hub-draft")  # a draft named: taken as given
    assert {p.spec.get("model") for p in named.points} - {None} == {"org/hub-draft"}
