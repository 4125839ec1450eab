"""``spectune import``: result files of vllm bench serve (and sweep folders) as completed trials of a
study, refused when they measured something else, and counted by guided search (recorded landscape)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from bench_results import bench_result, write_result

from spectune.errors import ConfigError
from spectune.imports import import_results
from spectune.landscape import Landscape
from spectune.records import RECHECK_BEST
from spectune.results import open_study
from spectune.study import create_study
from spectune.worker import run_study


def _best(landscape: Landscape):  # noqa: ANN202
    """The landscape's best speculative point (by its first engine start) and its measurement."""
    points = [p for p in landscape.points if p.measurement is not None and not p.measurement.spec.is_baseline]
    p = max(points, key=lambda p: p.measurement.output_throughput)
    return p, p.measurement


def test_an_imported_result_is_a_completed_trial_marked_imported(landscape: Landscape, tmp_path: Path) -> None:
    config = landscape.config(storage=f"sqlite:///{tmp_path / 'i.db'}", study_name="warm", trials=4,
                              log_dir=str(tmp_path / "logs"))
    create_study(config)
    point, m = _best(landscape)
    path = write_result(tmp_path, "bench-best.json", bench_result(m))
    done = import_results(config.storage, "warm", [path])
    assert [i.label for i in done] == [point.label]
    view = open_study(config.storage, "warm")
    row = view.rows[0]
    assert row.state == "COMPLETE" and row.imported == str(path) and row.note == "imported from bench-best.json"
    assert row.values == pytest.approx([m.output_throughput]) and row.acceptance_rate == pytest.approx(
        m.acceptance.acceptance_rate)  # type: ignore[union-attr]
    stored = view.store.measurement(row.trial_id)
    assert stored is not None and stored.hardware.platform == "imported" and stored.acceptance is not None


@pytest.mark.parametrize(("change", "field"), [
    ({"model_id": "org/another-model"}, "model_id"),
    ({"max_concurrency": 8}, "max_concurrency"),
    ({"num_prompts": 100}, "num_prompts"),
    ({"request_rate": 2.0}, "request_rate"),
    ({"workload": "mtbench"}, "workload"),
])
def test_a_result_of_another_model_workload_or_load_is_refused_in_one_line_and_nothing_is_written(
        landscape: Landscape, tmp_path: Path, change: dict, field: str) -> None:
    config = landscape.config(storage=f"sqlite:///{tmp_path / 'i.db'}", study_name="warm", trials=4,
                              log_dir=str(tmp_path / "logs"))
    create_study(config)
    _, m = _best(landscape)
    good = write_result(tmp_path, "good.json", bench_result(m))
    bad = write_result(tmp_path, "bad.json", bench_result(m, **change))
    with pytest.raises(ConfigError, match=rf"^{bad}: {field} .* differs from the study's .*; nothing imported$"):
        import_results(config.storage, "warm", [good, bad])
    assert open_study(config.storage, "warm").rows == []  # the good one was not written either


def test_a_speculative_result_without_its_config_asks_for_it(landscape: Landscape, tmp_path: Path) -> None:
    config = landscape.config(storage=f"sqlite:///{tmp_path / 'i.db'}", study_name="warm", trials=4,
                              log_dir=str(tmp_path / "logs"))
    create_study(config)
    _, m = _best(landscape)
    data = bench_result(m)
    del data["speculative_config"]
    path = write_result(tmp_path, "anonymous.json", data)
    with pytest.raises(ConfigError, match="speculative_config: the file drafted tokens but does not say how"):
        import_results(config.storage, "warm", [path])
    from spectune.config import parse_spec

    other = parse_spec('{"method": "ngram", "num_speculative_tokens": 7, "prompt_lookup_max": 3}')
    with pytest.raises(ConfigError, match="not a candidate of study warm's space"):
        import_results(config.storage, "warm", [path], spec=other)
    assert len(import_results(config.storage, "warm", [path], spec=m.spec)) == 1  # said on the command line


def test_guided_search_counts_imported_results_and_spends_no_more_engine_runs(landscape: Landscape,
                                                                           tmp_path: Path) -> None:
    plain: list[tuple[str, float]] = []
    config = landscape.config(storage=f"sqlite:///{tmp_path / 'g.db'}", study_name="cold", sampler="guided",
                              trials=len(landscape.points), log_dir=str(tmp_path / "logs"))
    run_study(config, measure_fn=landscape.measurer(plain))
    cold = open_study(config.storage, "cold").best()
    # the same study, but the team's vllm bench result of the best configuration is imported first
    warm_config = config.model_copy(update={"study_name": "warm"})
    create_study(warm_config)
    point = next(p for p in landscape.points if p.label == cold.row.label)
    path = write_result(tmp_path, "known-best.json", bench_result(point.measurement))
    import_results(config.storage, "warm", [path])
    warm: list[tuple[str, float]] = []
    run_study(warm_config, measure_fn=landscape.measurer(warm))
    view = open_study(config.storage, "warm")
    assert view.best().row.label == cold.row.label
    # here the imported best is measured on this machine at most once, as the pick before the search stops
    again = [r for r in view.rows if r.label == point.label and r.imported is None]
    assert [r.recheck_reason for r in again] in ([], [RECHECK_BEST])
    # the cold study found the best itself (its first pick after the baseline, with what else it
    # measured on the way); the warm one did not measure the imported best as a pick, and needed
    # no more engine runs (here as many: the pick, imported, measured on this machine before the stop)
    # (the cold study measured the baseline twice first, knowing no engine spread on this machine;
    # the warm one, in the same storage, starts from the spread the cold one measured)
    cold_runs, warm_runs = [label for label, _ in plain], [label for label, _ in warm]
    assert cold_runs[:3] == ["none", "none", point.label]
    assert warm_runs[0] == "none" != warm_runs[1] and warm_runs.count(point.label) == len(again)
    assert len(warm_runs) <= len(cold_runs)


@pytest.mark.engine
def test_a_result_vllm_bench_serve_wrote_against_a_real_server_is_imported(tiny_models, repetitive_prompts: Path,
                                                                           tmp_path: Path) -> None:
    from conftest import study_config, tiny_engine_args

    from spectune.config import parse_spec
    from spectune.engines import VLLMServer, vllm_cli

    spec = parse_spec('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}')
    space = "methods:\n  none: {}\n  ngram:\n    num_speculative_tokens: 3\n    prompt_lookup_max: 3\n    prompt_lookup_min: 1\n"
    config = study_config(tmp_path, tiny_models.target, repetitive_prompts, space, "bench", trials=2,
                          workload={"source": str(repetitive_prompts), "num_prompts": 6, "concurrency": 2,
                                    "sampling": {"max_tokens": 32, "temperature": 0.0}})
    create_study(config)
    with VLLMServer(tiny_engine_args(tiny_models.target), spec, log_path=tmp_path / "engine.log",
                    startup_timeout=300) as server:
        bench = subprocess.run([
            *vllm_cli(), "bench", "serve", "--backend", "openai", "--endpoint", "/v1/completions",
            "--base-url", server.base_url, "--model", server.served_model_name, "--tokenizer", str(tiny_models.target),
            "--dataset-name", "custom", "--dataset-path", str(repetitive_prompts), "--skip-chat-template",
            "--disable-shuffle", "--num-prompts", "6", "--max-concurrency", "2", "--request-rate", "inf",
            "--custom-output-len", "32", "--temperature", "0", "--disable-tqdm",
            "--metadata", f"speculative_config={json.dumps(spec.to_vllm())}", "workload=repetitive",
            "--save-result", "--result-dir", str(tmp_path), "--result-filename", "bench.json",
        ], capture_output=True, text=True, timeout=600, check=False,
            env={**os.environ, "OPENAI_API_KEY": server.api_key})  # vllm bench sends it as the bearer key
    assert bench.returncode == 0, bench.stderr[-3000:]
    written = json.loads((tmp_path / "bench.json").read_text())
    assert written["spec_decode_num_drafts"] > 0  # vllm bench read the engine's counters itself
    mismatched = write_result(tmp_path, "other-load.json", {**written, "max_concurrency": 4})
    cli = [sys.executable, "-m", "spectune.cli", "import", "--storage", config.storage,
           "--study", "bench"]
    refused = subprocess.run([*cli, str(tmp_path / "bench.json"), str(mismatched)], capture_output=True, text=True,
                             timeout=120, check=False)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "max_concurrency 4 differs from the study's 2; nothing imported" in refused.stderr
    assert open_study(config.storage, "bench").rows == []  # not even the file that fits
    done = subprocess.run([*cli, str(tmp_path / "bench.json")], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    view = open_study(config.storage, "bench")
    (row,) = view.rows
    assert row.state == "COMPLETE" and row.spec == spec.to_vllm() and row.note == "imported from bench.json"
    assert row.values == pytest.approx([written["output_throughput"]])
    assert row.mean_acceptance_length == pytest.approx(written["spec_decode_acceptance_length"])


def test_a_load_mix_study_refuses_a_result_of_one_load(landscape: Landscape, tmp_path: Path) -> None:
    """A result file measured one load; a mix study's objective weighs several: not comparable."""
    config = landscape.config(storage=f"sqlite:///{tmp_path / 'i.db'}", study_name="mix", trials=4,
                              log_dir=str(tmp_path / "logs"))
    assert config.workload.concurrency == 1
    config = config.model_copy(update={"workload": config.workload.model_copy(update={"concurrency_levels": [1, 2]})})
    create_study(config)
    _, m = _best(landscape)
    path = write_result(tmp_path, "one-load.json", bench_result(m))
    with pytest.raises(ConfigError, match=r"measures a load mix .* cannot stand for it; nothing imported$"):
        import_results(config.storage, "mix", [path])
    assert open_study(config.storage, "mix").rows == []
