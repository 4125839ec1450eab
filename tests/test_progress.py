"""What ``spectune optimize`` shows while a study runs: StudyProgress fed with StudyEvents (no engine)."""

from __future__ import annotations

import re

from rich.console import Console

from spectune._progress import StudyProgress
from spectune.study import StudyEvent

NGRAM = "ngram k=2 lookup=1..3"
DRAFT = "draft_model k=3 ([tiny]-draft)"  # brackets: a model folder's name is no rich markup
BEST = f"best so far: {NGRAM} (1.37x)"


def _console(*, terminal: bool) -> Console:
    return Console(record=True, width=140, force_terminal=terminal, color_system=None)


def _bar(progress: StudyProgress) -> list[str]:
    """The lines the live display shows now (the study's bar, then the trial's)."""
    probe = Console(record=True, width=140, color_system=None)
    probe.print(progress.progress.get_renderable())
    return [line.rstrip() for line in probe.export_text().splitlines()]


def _first_two_trials(on_event, total: int) -> None:  # noqa: ANN001
    """Baseline measured, then n-gram k=2 at 1.37x, as run_study reports them."""
    on_event(StudyEvent("trial_start", 1, total, "none"))
    on_event(StudyEvent("trial_end", 1, total, "none", state="COMPLETE", values=[100.0],
                        best_label="none", best_speedup=1.0))
    on_event(StudyEvent("trial_start", 2, total, NGRAM))
    on_event(StudyEvent("trial_end", 2, total, NGRAM, state="COMPLETE", values=[137.0],
                        best_label=NGRAM, best_speedup=1.37))


def test_terminal_shows_trial_n_of_total_the_candidate_measured_and_best_so_far() -> None:
    console = _console(terminal=True)
    with StudyProgress(console, 5) as progress:
        _first_two_trials(progress.on_event, 5)
        progress.on_event(StudyEvent("trial_start", 3, 5, DRAFT, best_label=NGRAM, best_speedup=1.37))
        hook = progress.trial_hook(DRAFT)
        assert hook is not None
        hook("start", 0, 0)
        assert _bar(progress)[1].startswith(f"  {DRAFT}: starting engine")
        hook("measure", 3, 8)
        study_bar, trial_bar = _bar(progress)
        assert study_bar.startswith(f"trial 3 of 5  {BEST}") and " 2/5 " in study_bar
        assert trial_bar.startswith(f"  {DRAFT}: measuring") and " 3/8 " in trial_bar
    # finished trials are printed above the bars, each with the best so far (the recording
    # also holds the frames of the live display, their cursor moves left out)
    screen = console.export_text()
    assert "trial 1 of 5 COMPLETE none 100  best so far: none (1.00x)\n" in screen
    assert f"trial 2 of 5 COMPLETE {NGRAM} 137  {BEST}\n" in screen


def test_terminal_bar_keeps_best_so_far_when_the_next_trial_starts() -> None:
    with StudyProgress(_console(terminal=True), 5) as progress:
        _first_two_trials(progress.on_event, 5)
        progress.on_event(StudyEvent("trial_start", 3, 5, DRAFT))  # as run_study sends it
        assert _bar(progress)[0].startswith(f"trial 3 of 5  {BEST}")


def test_without_a_terminal_each_trial_is_a_line() -> None:
    console = _console(terminal=False)
    with StudyProgress(console, 4) as progress:
        assert progress.trial_hook(DRAFT) is None  # no bars to move
        _first_two_trials(progress.on_event, 4)
        progress.on_event(StudyEvent("trial_start", 3, 4, DRAFT))
        progress.on_event(StudyEvent("trial_end", 3, 4, DRAFT, state="FAIL", reason="engine exited with code 1",
                                     best_label=NGRAM, best_speedup=1.37))
        progress.on_event(StudyEvent("trial_start", 4, 4, NGRAM))
        progress.on_event(StudyEvent("trial_end", 4, 4, NGRAM, state="REUSED", values=[137.0],
                                     best_label=NGRAM, best_speedup=1.37))
        progress.on_event(StudyEvent("guide_stop", 0, 4, "", done=6))
    lines = [line.rstrip() for line in console.export_text().splitlines()]
    assert lines[:3] == ["trial 1 of 4: none ...",
                         "trial 1 of 4 COMPLETE none 100  best so far: none (1.00x)",
                         f"trial 2 of 4: {NGRAM} ..."]
    assert lines[3] == f"trial 2 of 4 COMPLETE {NGRAM} 137  {BEST}"
    assert lines[4] == f"trial 3 of 4: {DRAFT} ..."
    assert re.fullmatch(rf"trial 3 of 4 FAIL {re.escape(DRAFT)}: engine exited with code 1  {re.escape(BEST)}",
                        lines[5]), lines[5]
    assert lines[7] == f"trial 4 of 4 REUSED {NGRAM} 137  {BEST}"
    assert lines[8].startswith("guided search stops: the 6 candidates left are predicted clearly worse")
    assert len(lines) == 9
