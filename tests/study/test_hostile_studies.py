"""Hostile study YAMLs, command-line values and ``vllm bench`` result files for ``spectune
import``, through the real command line: each ends with exit 0, or exit 2 with one line and
nothing written (``tests/hostile.py`` says what counts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hostile import (
    WARM,
    Case,
    Harness,
    bench_result,
    cli_cases,
    import_cases,
    run_property,
    study_cases,
)

from spectune.errors import ConfigError
from spectune.results import open_study

STUDY_EXAMPLES, CLI_EXAMPLES, IMPORT_EXAMPLES = 400, 500, 100



def trials_of(harness: Harness, study: str = WARM) -> int:
    return len(open_study(harness.url, study).rows)


def test_hostile_study_configurations_end_in_exit_0_or_one_line_with_nothing_written(fresh_harness: Harness) -> None:
    seen = run_property(fresh_harness, study_cases(), STUDY_EXAMPLES)
    assert seen["exit 0"] >= STUDY_EXAMPLES // 20 and seen["exit 2"] >= STUDY_EXAMPLES // 4, seen


def test_hostile_command_lines_end_in_exit_0_or_one_line_with_nothing_written(fresh_harness: Harness) -> None:
    seen = run_property(fresh_harness, cli_cases(), CLI_EXAMPLES)
    assert seen["exit 0"] >= CLI_EXAMPLES // 20 and seen["exit 2"] >= CLI_EXAMPLES // 4, seen


def test_hostile_result_files_end_in_exit_0_or_one_line_with_nothing_imported(fresh_harness: Harness) -> None:
    before = trials_of(fresh_harness)
    seen = run_property(fresh_harness, import_cases(), IMPORT_EXAMPLES)
    assert seen["exit 0"] >= IMPORT_EXAMPLES // 20 and seen["exit 2"] >= IMPORT_EXAMPLES // 4, seen
    assert trials_of(fresh_harness) - before >= seen["exit 0"]  # what exit 0 said it imported is there


def optimize(*args: str, files: tuple[tuple[str, bytes], ...] = ()) -> Case:
    return Case("study", ("optimize", "--create-only", "--target", "org/model", "--workload", "@FIX@/w.jsonl",
                          "--space", "ngram", "--study", "@STUDY@", *args), files)


def test_bad_input_to_optimize_claims_no_storage_and_creates_no_folder(harness: Harness) -> None:
    bad = harness.run(optimize("--storage", "sqlite:///@CASE@/new/s.db", "--workload", "@CASE@/missing.jsonl"))
    assert bad.code == 2 and "missing.jsonl: no such file" in bad.stderr and bad.written == []
    assert not (harness.case_dir / "new").exists()
    good = harness.run(optimize("--storage", "sqlite:///@CASE@/new/s.db"))
    assert good.code == 0 and (harness.case_dir / "new" / "s.db.workers.lock").exists()


@pytest.mark.parametrize(("args", "error"), [
    (("--seed", str(2**32)), "seed: Input should be less than or equal to 4294967295"),
    (("--seed", "-1"), "seed: Input should be greater than or equal to 0"),
    (("--storage", "sqlite:///@CASE@"), "is a folder"),
    (("--storage", "sqlite:///@FIX@/w.jsonl"), "w.jsonl is not a SQLite database"),
    (("--target", "org/m\udcff"), r"target: a lone surrogate '\udcff' at character 5: not valid Unicode text"),
    (("--time-budget", "1e999"), "time_budget: '1e999' is not a duration"),
])
def test_a_value_that_broke_optimize_is_refused_in_one_line(harness: Harness, args: tuple[str, ...], error: str) -> None:
    outcome = harness.run(optimize("--storage", "@STORAGE@", *args))
    assert outcome.problem is None and outcome.code == 2 and error in outcome.stderr, outcome


@pytest.mark.parametrize("command", [["show"], ["export", "-o", "@CASE@/best.yaml"], ["report", "-o", "@CASE@/r.md"],
                                     ["import", "@CASE@/r.json", "--study", WARM]])
def test_a_reading_command_on_a_missing_sqlite_file_creates_nothing(harness: Harness, command: list[str]) -> None:
    files = (("r.json", json.dumps(bench_result()).encode()),)
    for storage in ("sqlite:///@CASE@/typo/spectune.db", None):  # None: the default, storage/ here
        outcome = harness.run(Case("cli", (*command, *(("--storage", storage) if storage else ())), files))
        assert outcome.problem is None and outcome.code == 2 and "no such file" in outcome.stderr, outcome
        assert sorted(p.name for p in harness.case_dir.iterdir()) == ["r.json"]


def import_file(data: object, *args: str) -> Case:
    text = data if isinstance(data, str) else json.dumps(data)
    return Case("import", ("import", "@CASE@/r.json", "--study", WARM, "--storage", "@STORAGE@", *args),
                (("r.json", text.encode()),))


@pytest.mark.parametrize(("data", "args", "error"), [
    (bench_result(duration="4 s"), (), "r.json: duration: expected a finite number >= 0, got '4 s'"),
    (bench_result(output_throughput=float("nan")), (), "r.json: output_throughput: expected a finite number >= 0, got nan"),
    ({k: v for k, v in bench_result().items() if k != "duration"}, (), "r.json: duration: missing"),
    (bench_result(completed=[4]), (), "r.json: completed: expected a finite number >= 0, got [4]"),
    (bench_result(completed=2.5), (), "r.json: completed: expected a whole number, got 2.5"),
    (bench_result(spec_decode_per_position_acceptance_rates="0.5"), (), "expected a list of numbers, got str"),
    (bench_result(request_rate="fast"), (), "r.json: request_rate: expected a number or 'inf', got 'fast'"),
    (bench_result(speculative_config="{"), (), "r.json: speculative_config: not JSON and not 'none'"),
    (bench_result(speculative_config={"method": "ngram", "num_speculative_tokens": float("nan")}), (),
     "r.json: speculative_config: not JSON"),
    ("[" * 50_000, (), "r.json: not JSON: nested too deeply"),
    ("\ufeff" + json.dumps(bench_result()), (), None),  # a byte-order mark is read past
    (bench_result(), ("--engine-arg", "max_num_seqs=["), "--engine-arg 'max_num_seqs=[': line"),
    (bench_result(), ("--spec", "[" * 5000), "--spec: not JSON and not 'none': nested too deeply"),
])
def test_a_result_file_that_broke_import_is_refused_in_one_line_and_nothing_imported(
        harness: Harness, data: object, args: tuple[str, ...], error: str | None) -> None:
    before = trials_of(harness)
    outcome = harness.run(import_file(data, *args))
    assert outcome.problem is None, outcome
    if error is None:
        assert outcome.code == 0 and trials_of(harness) == before + 1
    else:
        assert outcome.code == 2 and error in outcome.stderr and trials_of(harness) == before, outcome.stderr


def test_a_result_without_the_objectives_value_is_refused_before_a_trial_is_asked(harness: Harness) -> None:
    made = harness.run(optimize("--storage", "@STORAGE@", "--study", "tpot", "--objective", "tpot_median_ms"))
    assert made.code == 0, made.stderr
    data = {k: v for k, v in bench_result().items() if "tpot" not in k}
    outcome = harness.run(Case("import", ("import", "@CASE@/r.json", "--study", "tpot", "--storage", "@STORAGE@"),
                               (("r.json", json.dumps(data).encode()),)))
    assert outcome.problem is None and outcome.code == 2, outcome
    assert "the study's objective tpot_median_ms: the file has no value for it" in outcome.stderr
    assert open_study(harness.url, "tpot").study.trials == []  # no trial asked and left running


@pytest.mark.parametrize(("case", "error"), [
    (import_file("\x00garbage\xff"), "r.json: not JSON"),
    (Case("cli", ("import", "@CASE@/r.json", "--study", WARM, "--storage", "@STORAGE@", "--engine-arg", "max_num_seqs=*a"),
          (("r.json", json.dumps(bench_result()).encode()),)), "invalid YAML: found undefined alias"),
    (Case("study", ("optimize", "--create-only", "--config", "@CASE@/s.yaml"),
          (("s.yaml", b"target: org/model\ntarget: other\nworkload: {source: '@FIX@/w.jsonl'}\n"),)),
     "key 'target' given twice"),
])
def test_no_traceback_reaches_a_terminal(harness: Harness, case: Case, error: str) -> None:
    outcome = harness.run(case, in_subprocess=True)
    assert outcome.problem is None and outcome.code == 2, outcome
    assert outcome.stderr.count("\n") == 1 and error in outcome.stderr, outcome.stderr


def test_the_harness_catches_a_file_written_on_exit_2(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check itself: a command that writes a file and then refuses its input is a problem."""
    def write_then_refuse(spec: object) -> None:
        (harness.case_dir / "half.txt").write_text("half")
        raise ConfigError("refused after writing")

    monkeypatch.setattr("spectune.workloads.load_prompts", write_then_refuse)
    outcome = harness.run(optimize("--storage", "@STORAGE@"))
    assert outcome.code == 2 and outcome.problem == "exit 2 and written: case/half.txt", outcome


def test_a_result_imported_in_a_process_prints_what_it_imported_and_nothing_else(harness: Harness) -> None:
    before = trials_of(harness)
    outcome = harness.run(import_file(bench_result()), in_subprocess=True)
    assert outcome.code == 0 and outcome.stderr == "", outcome  # no warning of Optuna's about heartbeats
    assert outcome.stdout.endswith(f"study {WARM}: 1 result imported\n") and trials_of(harness) == before + 1


def test_export_to_a_folder_is_refused_in_one_line_and_writes_nothing(harness: Harness) -> None:
    baseline = {k: v for k, v in bench_result(output_throughput=50.0).items()
                if not k.startswith("spec") and k != "speculative_config"}
    for data in (baseline, bench_result()):  # a baseline and a speculative trial: the study has a best
        assert harness.run(import_file(data)).code == 0
    for target in ("", "@CASE@", "."):
        outcome = harness.run(Case("cli", ("export", "--storage", "@STORAGE@", "--study", WARM, "-o", target)))
        assert outcome.problem is None and outcome.code == 2 and "is a folder; give the file to write" in outcome.stderr, outcome
    written = harness.run(Case("cli", ("export", "--storage", "@STORAGE@", "--study", WARM, "-o", "@CASE@/best.yaml")))
    assert written.code == 0, written.stderr
    assert sorted(p.name for p in harness.case_dir.iterdir()) == ["best.provenance.json", "best.yaml"]


def test_a_storage_path_with_a_nul_is_refused_in_one_line(harness: Harness) -> None:
    study = b"target: org/model\nworkload: {source: '@FIX@/w.jsonl'}\nspace: ngram\nstorage: \"sqlite:///a\\0b.db\"\n"
    outcome = harness.run(Case("study", ("optimize", "--create-only", "--config", "@CASE@/s.yaml"), (("s.yaml", study),)))
    assert outcome.problem is None and outcome.code == 2, outcome
    assert "cannot be used: its path holds a NUL character" in outcome.stderr


def test_a_study_resumed_with_other_objective_directions_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Optuna fixes a study's directions when it creates it: a resume that asks for others is refused, not a traceback."""
    from spectune.cli import main

    (tmp_path / "w.jsonl").write_text('{"prompt": "hello"}\n{"prompt": "world"}\n')
    common = ["optimize", "--create-only", "--storage", f"sqlite:///{tmp_path / 's.db'}", "--study", "x",
              "--target", "org/model", "--workload", str(tmp_path / "w.jsonl")]
    for extra, code in ((["--objective", "output_throughput", "--objective", "tpot_median_ms"], 0), ([], 2),
                        (["--objective", "tpot_median_ms"], 2), (["--objective", "output_throughput", "--objective", "tpot_p99_ms"], 0)):
        with pytest.raises(SystemExit) as exit_:
            main([*common, *extra])
        err = capsys.readouterr().err
        assert exit_.value.code == code, err
        if code == 2:
            assert "study 'x' has 2 objective(s) (maximize, minimize)" in err and err.count("\n") == 1
