"""A configuration whose answers changed is not picked: studies replayed on the recorded tiny landscape,
with answers edited where the baseline's margin says rounding or a change (the study loop, Optuna, the
storage, the decision and the export are real; the engine runs are answered from the file)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from spectune.answers import ROUNDING_MARGIN
from spectune.cli import app
from spectune.export import export_best
from spectune.landscape import Landscape
from spectune.measurement import AnswerMargins, PromptMargins
from spectune.records import TrialRecord
from spectune.notes import answers_line
from spectune.results import open_study
from spectune.worker import replay_on_clock, run_study

NEAR_TIE = ("HumanEval/66", 3)  # (prompt, output token) where the baseline's margin is a near-tie
CLEAR_CHOICE = ("HumanEval/98", 5)


def _edit(m, prompt: str, token: int):  # noqa: ANN001, ANN202
    requests = [r.model_copy(update={"token_ids": [*r.token_ids[:token], r.token_ids[token] + 1, *r.token_ids[token + 1:]]})
                if r.prompt_id == prompt else r for r in m.requests]
    return m.model_copy(update={"requests": requests})


@pytest.fixture(scope="module")
def edited(landscape: Landscape, tmp_path_factory: pytest.TempPathFactory) -> tuple[Landscape, Path]:
    """The landscape's suffix candidates, the baseline with margins (a near-tie at :data:`NEAR_TIE`, clear
    choices elsewhere), suffix k=16 (the fastest) changed at :data:`CLEAR_CHOICE` and k=8 at the near-tie."""
    points = []
    for p in landscape.points:
        m = p.measurement
        if p.label == "none":
            refs = {r.prompt_id: PromptMargins(token_ids=r.token_ids, margins=[
                ROUNDING_MARGIN["float32"] / 10 if (r.prompt_id, i) == NEAR_TIE else 4.0 for i in range(len(r.token_ids))])
                for r in m.requests}
            m = m.model_copy(update={"answer_margins": AnswerMargins(seconds=3.0, window_seconds=6.0, requests=refs)})
        elif p.label == "suffix k=16":
            m = _edit(m, *CLEAR_CHOICE)
        elif p.label == "suffix k=8":
            m = _edit(m, *NEAR_TIE)
        points.append(p.model_copy(update={"measurement": m}))
    space = yaml.safe_load(Path(landscape.config().space).read_text())
    space["methods"] = {"none": {}, "suffix": {**space["methods"]["suffix"], "num_speculative_tokens": [1, 8, 16]}}
    space_file = tmp_path_factory.mktemp("answers") / "space.yaml"
    space_file.write_text(yaml.safe_dump(space))
    return landscape.model_copy(update={"points": points}), space_file


def _study(edited: tuple[Landscape, Path], tmp_path: Path, answers: str, name: str):  # noqa: ANN202
    land, space = edited
    return land.config(storage=f"sqlite:///{tmp_path / 'a.db'}", study_name=name, space=str(space), sampler="grid",
                       trials=4, answers=answers, log_dir=str(tmp_path / "logs"))


def test_a_changed_answer_rules_the_fastest_out_and_a_near_tie_does_not(edited, tmp_path: Path) -> None:
    config = _study(edited, tmp_path, "rounding", "rounding")
    run_study(config, measure_fn=edited[0].measurer())
    view = open_study(config.storage, "rounding")
    rows = {r.label: r for r in view.complete()}
    k16, k8, k1 = rows["suffix k=16"], rows["suffix k=8"], rows["suffix k=1"]
    assert (k16.answers.changed, k16.answers.first.prompt_id, k16.answers.first.token) == (1, *CLEAR_CHOICE)
    assert not k16.feasible and k16.broken == ("answers",)
    assert k16.note == ("breaks answers (same 7/8, 1 changed; first changed: prompt HumanEval/98 at output token 5 "
                        f"(the baseline's margin there 4 > {ROUNDING_MARGIN['float32']:.3g}))")
    assert (k8.answers.rounding, k8.answers.changed, k8.feasible) == (1, 0, True)
    assert (k1.answers.identical, k1.answers.compared) == (8, 8) and rows["none"].answers is None
    choice = view.best()
    assert choice.row.label == "suffix k=8"  # the fastest whose answers keep to the rule
    record = view.record()
    assert record["answers"] == {"rule": "rounding", "not_checked": None}
    assert record["best"]["fidelity"]["rounding"] == 1
    by_label = {t["label"]: t for t in record["trials"]}
    assert by_label["suffix k=16"]["fidelity"]["first"] == {"prompt_id": "HumanEval/98", "token": 5, "kind": "changed",
                                                            "margin": 4.0}
    out = export_best(view, tmp_path / "best.yaml")
    header = [line for line in out.path.read_text().splitlines() if line.startswith("# answers:")]
    assert header == ["# answers: same 7/8 (1 rounding) as the baseline's (rule rounding; first rounding: prompt "
                      "HumanEval/66 at output token 3); 1 configuration ruled out for answers that changed beyond rounding"]
    provenance = json.loads(out.provenance_path.read_text())
    assert provenance["answers"]["rule"] == "rounding" and provenance["answers"]["fidelity"]["rounding"] == 1
    shown = CliRunner().invoke(app, ["show", "--storage", config.storage, "--study", "rounding"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0 and "same 7/8" in shown.output and "answers: same 7/8 (1 rounding)" in shown.output


def test_the_rule_decides_which_answers_count(edited, tmp_path: Path) -> None:
    picks = {}
    for rule in ("identical", "off"):
        config = _study(edited, tmp_path, rule, rule)
        run_study(config, measure_fn=edited[0].measurer())
        view = open_study(config.storage, rule)
        # the best speculative configuration the rule lets compete (whether it clears the band on one
        # engine start each is the band's matter, tests/test_results.py)
        _, competing, _ = view.contenders()
        picks[rule] = max((c for c in competing if not c.row.is_baseline), key=lambda c: c.value).row.label
        assert picks[rule] == view.best().row.label or picks[rule] in view.best().reason
        if rule == "off":
            assert all(r.fidelity is None and r.feasible for r in view.complete())
            assert answers_line(view, view.best()) == "answers: not checked (--answers off)"
    assert picks == {"identical": "suffix k=1", "off": "suffix k=16"}


def test_a_trial_that_ends_before_the_baseline_is_compared_where_the_study_is_read(edited, tmp_path: Path) -> None:
    land, _ = edited
    replay = land.measurer()

    def measure(engine, spec, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        m = replay(engine, spec, *args, **kwargs)  # suffix k=1, the quickest engine, changed as k=16 is
        return _edit(m, *CLEAR_CHOICE) if spec.label() == "suffix k=1" else m

    config = _study(edited, tmp_path, "rounding", "slots")
    order = [label for _, label in replay_on_clock(config, measure, land.engine_clock(), slots=2)]
    assert order.index("suffix k=1") < order.index("none")  # its slot finished first: nothing to compare with then
    view = open_study(config.storage, "slots")
    stored = {TrialRecord.of(t).config: TrialRecord.of(t) for t in view.study.trials}
    assert stored["suffix k=1"].fidelity is None and stored["suffix k=1"].feasible
    k1 = next(r for r in view.complete() if r.label == "suffix k=1")
    assert (k1.answers.changed, k1.feasible, k1.broken) == (1, False, ("answers",))
    assert view.best().row.label == "suffix k=8"


def test_at_temperature_above_zero_the_check_says_it_was_not_made(edited, tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    land, space = edited
    workload = {**land.study_config["workload"], "sampling": {**land.study_config["workload"]["sampling"], "temperature": 0.8}}
    config = _study(edited, tmp_path, "rounding", "warm").model_copy(
        update={"workload": land.config(workload=workload).workload})
    run_study(config, measure_fn=land.measurer())
    assert "answers are not checked against the baseline's: the workload samples at temperature 0.8" in caplog.text
    view = open_study(config.storage, "warm")
    assert view.record()["answers"]["not_checked"] == "answers not checked against the baseline's: the workload samples at temperature 0.8"
    shown = CliRunner().invoke(app, ["show", "--storage", config.storage, "--study", "warm"], env={"COLUMNS": "200"})
    assert "answers not checked against the baseline's: the workload samples at temperature 0.8" in shown.output
