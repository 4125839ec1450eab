"""The CLI's tables in a terminal of 80 columns and in a wide one (synthetic trials, no engine)."""

from __future__ import annotations

import re

import optuna
import pytest
from rich.console import Console

from spectune._tables import Column, fitted_table, render_study
from spectune.records import RECHECK_SURPRISE
from spectune.results import StudyView
from spectune.storage import MeasurementStore

DRAFT = "draft_model k=4 (SmolLM2-135M-Instruct-draft)"
FAILED = "engine exited with code 1: RuntimeError: out of memory while allocating the KV cache"


def _view() -> StudyView:
    """A demo-like study: baseline, suffix, n-gram, a draft re-measured, a failed engine."""
    study = optuna.create_study(direction="maximize", study_name="demo-smollm2-humaneval")
    study.set_user_attr("objectives", ["output_throughput"])
    trials = [("none", {"method": "none"}, 7.57, None, {}),
              ("suffix k=16", {"method": "suffix", "num_speculative_tokens": 16}, 10.41, 9.8, {}),
              ("ngram k=6 lookup=2..4", {"method": "ngram", "num_speculative_tokens": 6}, 10.01, 10.6, {}),
              (DRAFT, {"method": "draft_model", "num_speculative_tokens": 4, "model": "d"}, 4.52, 8.1, {}),
              (DRAFT, {"method": "draft_model", "num_speculative_tokens": 4, "model": "d"}, 4.61, 8.1,
               {"confirms": 3, "recheck": RECHECK_SURPRISE})]
    for label, spec, value, predicted, extra in trials:
        attrs = {"config": label, "spec": spec, "speedup": value / 7.57, "noise": 0.02, "feasible": True,
                 "acceptance_rate": None if label == "none" else 0.412, "mean_acceptance_length":
                 None if label == "none" else 2.31, **extra}
        if predicted is not None:
            attrs["predicted_output_throughput"] = predicted
        study.add_trial(optuna.trial.create_trial(value=value, params={}, distributions={}, user_attrs=attrs))
    study.add_trial(optuna.trial.create_trial(
        state=optuna.trial.TrialState.FAIL, params={}, distributions={},
        user_attrs={"config": "ngram k=6 lookup=3..4", "spec": {"method": "ngram", "num_speculative_tokens": 6},
                    "fail_reason": FAILED}))
    return StudyView(study, MeasurementStore("sqlite:///:memory:"), "sqlite:///:memory:")


def _shown(view: StudyView, width: int) -> list[str]:
    console = Console(record=True, width=width, color_system=None)
    render_study(view, console)
    return [line.rstrip() for line in console.export_text().splitlines()]


def test_show_fits_80_columns_without_breaking_a_cell() -> None:
    lines = _shown(_view(), 80)
    assert max(map(len, lines)) <= 80
    table = [line for line in lines if re.match(r"\s*\d+\s", line)]
    assert len(table) == 6  # one line per trial: no cell wraps onto a second line
    for label in ("none", "suffix k=16", "ngram k=6 2..4", "draft k=4 (SmolLM2-135M-Instruct-draft)",
                  "ngram k=6 3..4"):  # short labels, each whole on one line
        assert any(label in line for line in table), label
    assert not any("…" in line for line in lines)  # nothing cut short either
    header = next(line for line in lines if "config" in line)
    # the long label leaves room for the acceptance rate, not for the prediction and the length
    assert header.split() == ["#", "state", "config", "tok/s", "speedup", "accept"]
    first = next(line for line in table if "suffix" in line)
    assert first.split() == ["1", "done", "suffix", "k=16", "10.41", "1.375x", "0.412"]
    # the notes that no longer fit beside the figures follow the table, as text
    text = " ".join(lines)
    assert f"#4: again on a fresh engine, as #3, {RECHECK_SURPRISE}" in text
    assert f"#5: {FAILED}" in text


def test_show_keeps_every_column_where_the_terminal_is_wide() -> None:
    lines = _shown(_view(), 260)
    header = next(line for line in lines if "config" in line)
    assert header.split() == ["#", "state", "config", "output_throughput", "predicted", "speedup",
                              "acceptance", "accept", "len", "note"]
    assert any("COMPLETE" in line and "again on a fresh engine, as #3" in line for line in lines)
    assert not any(line.startswith("#4:") for line in lines)


@pytest.mark.parametrize("width", [40, 60, 100])
def test_a_fitted_table_drops_optional_columns_least_useful_first(width: int) -> None:
    columns = [Column("name"), Column("a long header", "a", drop=1), Column("b", drop=2), Column("c", drop=3)]
    rows = [["x" * 20, "1" * 12, "2" * 12, "3" * 12]]
    console = Console(width=width, color_system=None)
    _, kept = fitted_table(console, "t", columns, rows)
    names = [c.header for c in kept]
    expected = {40: ["name", "a long header"], 60: ["name", "a long header", "b"],
                100: ["name", "a long header", "b", "c"]}[width]
    assert names == expected


def test_predict_fits_80_columns_with_the_throughput_interval_kept() -> None:
    from spectune.config import SpecConfig
    from spectune.predict import Estimate, Prediction

    from spectune._tables import predictions_table

    def pred(label: str, spec: SpecConfig, tput: float) -> Prediction:
        est = Estimate(tput, tput * 0.9, tput * 1.1)
        return Prediction(label=label, spec=spec, source="replay", acceptance_rate=0.45, mean_acceptance_length=2.07,
                          tokens_per_step=Estimate(2.07, 1.9, 2.2), tpot_ms=Estimate(95.3, 88.1, 104.2),
                          output_throughput=est, objective="output_throughput", value=est, cost_source="fit-method",
                          note="k above the measured 4: extrapolated")

    predictions = [pred("ngram k=4 lookup=2..4", SpecConfig(method="ngram", num_speculative_tokens=4,
                                                             prompt_lookup_max=4, prompt_lookup_min=2), 10.52),
                   pred("suffix k=16", SpecConfig(method="suffix", num_speculative_tokens=16), 9.873)]
    console = Console(record=True, width=80, color_system=None)
    console.print(predictions_table(console, predictions, title="study demo: 2 candidates not measured"))
    lines = [line.rstrip() for line in console.export_text().splitlines()]
    assert max(map(len, lines)) <= 80 and not any("…" in line for line in lines)
    row = next(line for line in lines if "ngram" in line)
    assert "ngram k=4 2..4" in row and "10.52 [9.468, 11.57]" in row and "0.450" in row
    wide = Console(record=True, width=250, color_system=None)
    wide.print(predictions_table(wide, predictions))
    assert "k above the measured 4: extrapolated" in wide.export_text()  # the note, where there is room
