"""What ``spectune optimize`` shows while a study runs: StudyProgress fed with StudyEvents (no engine)."""

from __future__ import annotations

import re
import time

from rich.console import Console

from spectune._progress import TRIAL_PHASES, PhaseProgress, StudyProgress
from spectune.study import StudyEvent

NGRAM = "ngram k=2 lookup=1..3"
DRAFT = "draft_model k=3 ([tiny]-draft)"  # brackets: a model folder's name is no rich markup
BEST = f"best so far: {NGRAM} (1.37x)"


def _console(*, terminal: bool) -> Console:
    return Console(record=True, width=140, force_terminal=terminal, color_system=None)


def _bar(progress: StudyProgress | PhaseProgress) -> list[str]:
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


def test_without_a_terminal_each_trial_and_each_of_its_phases_is_a_line() -> None:
    console = _console(terminal=False)
    with StudyProgress(console, 4, startup_timeout=1800) as progress:
        _first_two_trials(progress.on_event, 4)
        progress.on_event(StudyEvent("trial_start", 3, 4, DRAFT))
        hook = progress.trial_hook(DRAFT)
        hook("start", 0, 0)
        hook("warmup", 0, 1)
        for done in range(9):  # counting requests prints nothing more
            hook("measure", done, 8)
        progress.on_event(StudyEvent("trial_end", 3, 4, DRAFT, state="FAIL", reason="engine exited with code 1",
                                     best_label=NGRAM, best_speedup=1.37))
        progress.on_event(StudyEvent("trial_start", 4, 4, NGRAM, trial=3))
        progress.on_event(StudyEvent("trial_end", 4, 4, NGRAM, state="REUSED", values=[137.0],
                                     best_label=NGRAM, best_speedup=1.37, trial=3))
        progress.on_event(StudyEvent("guide_stop", 0, 4, "", reason="no candidate left has more than a 5% chance "
                                     "of beating ngram (trial 1) by more than 2.0% (the highest: 1.2%; 6 unmeasured)"))
    lines = [line.rstrip() for line in console.export_text().splitlines()]
    assert lines[:3] == ["trial 1 of 4: none ...",
                         "trial 1 of 4 COMPLETE none 100  best so far: none (1.00x)",
                         f"trial 2 of 4: {NGRAM} ..."]
    assert lines[3] == f"trial 2 of 4 COMPLETE {NGRAM} 137  {BEST}"
    assert lines[4] == f"trial 3 of 4: {DRAFT} ..."
    assert [re.sub(r" \[0:0\d\]$", "", line) for line in lines[5:8]] == [
        f"  {DRAFT}: starting engine (limit 30:00)", f"  {DRAFT}: warming up", f"  {DRAFT}: measuring 8 requests"]
    assert re.fullmatch(rf"trial 3 of 4 FAIL {re.escape(DRAFT)}: engine exited with code 1  {re.escape(BEST)}",
                        lines[8]), lines[8]
    # numbered as show and the export number it (Optuna's trial 3), then its place in the count
    assert lines[9] == f"trial 3 (4 of 4): {NGRAM} ..."
    assert lines[10] == f"trial 3 (4 of 4) REUSED {NGRAM} 137  {BEST}"
    assert lines[11].startswith("guided search stops: no candidate left has more than a 5% chance of beating "
                                "ngram (trial 1) by more than 2.0% (the highest: 1.2%")
    assert len(lines) == 12


def test_a_job_outside_a_terminal_prints_each_phase_once_with_the_time_since_it_began(monkeypatch) -> None:
    from spectune import _progress

    now = [100.0]
    monkeypatch.setattr(_progress.time, "monotonic", lambda: now[0])
    console = _console(terminal=False)
    with PhaseProgress(console, "prepare smollm2") as job:
        job.hook("importing torch and transformers", 0, 0)
        now[0] += 12
        for step in range(3):
            job.hook("training the draft for {total} steps", step, 3)
            now[0] += 30
        job.hook("saving the draft", 0, 0)
        now[0] += 65
    assert console.export_text().splitlines() == [
        "prepare smollm2: importing torch and transformers [0:00]",
        "prepare smollm2: training the draft for 3 steps [0:12]",
        "prepare smollm2: saving the draft [1:42]",
        "prepare smollm2: done [2:47]",
    ]


def test_on_a_terminal_the_engine_start_shows_its_timeout_and_a_counted_phase_its_time_left(monkeypatch) -> None:
    console = _console(terminal=True)
    with PhaseProgress(console, "ngram k=2", phases=TRIAL_PHASES, limits={"start": 600}) as job:
        job.hook("start", 0, 0)
        assert re.search(r"ngram k=2: starting engine .* 0:00 of 10:00", _bar(job)[0])
        job.hook("measure", 0, 8)
        job.hook("measure", 1, 8)
        time.sleep(0.3)  # rich's estimate of the time left needs two counts some time apart
        job.hook("measure", 2, 8)
        line = _bar(job)[0]
        assert "ngram k=2: measuring 8 requests" in line and " 2/8 " in line and "of 10:00" not in line
        assert re.search(r"0:00, ~\d+:\d\d left", line)


def test_in_80_columns_the_study_log_takes_short_labels_and_fits() -> None:
    console = Console(record=True, width=80, force_terminal=False, color_system=None)
    long = "draft_model k=4 (SmolLM2-135M-Instruct-draft)"
    with StudyProgress(console, 8, startup_timeout=1800) as progress:
        progress.on_event(StudyEvent("trial_start", 1, 8, "none"))
        progress.on_event(StudyEvent("trial_end", 1, 8, "none", state="COMPLETE", values=[7.57],
                                     best_label="none", best_speedup=1.0))
        progress.on_event(StudyEvent("trial_start", 2, 8, long))
        progress.trial_hook(long)("start", 0, 0)
        progress.on_event(StudyEvent("trial_end", 2, 8, long, state="COMPLETE", values=[10.01],
                                     best_label=long, best_speedup=1.32))
    lines = [line.rstrip() for line in console.export_text().splitlines()]
    assert max(map(len, lines)) <= 80, lines
    short = "draft k=4 (SmolLM2-135M-Instruct-draft)"
    assert lines[1] == "trial 1 of 8 done none 7.57  best (1.00x)"
    assert lines[-1] == f"trial 2 of 8 done {short} 10.01  best (1.32x)"
