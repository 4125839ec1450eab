"""Guided search with engine knobs in the space, replayed on the recorded landscape: the speculative
configurations from its models, the knobs from Optuna's sampler, the best configuration then tried at
the knobs' other settings, and the choice exported with both."""

from __future__ import annotations

from pathlib import Path

import yaml
from landscape_runs import scaled

from spectune.config import SpecConfig
from spectune.export import export_best
from spectune.landscape import Landscape
from spectune.measurement import Measurement
from spectune.records import KNOBS_BY_SAMPLER, StudyRecord, TrialRecord
from spectune.results import open_study
from spectune.worker import run_study

REPO = Path(__file__).resolve().parents[2]


def test_guided_search_tunes_engine_knobs_with_optunas_sampler_and_exports_both(landscape: Landscape,
                                                                                tmp_path: Path) -> None:
    space = yaml.safe_load((REPO / "benchmarks" / "landscapes" / "tiny_space.yaml").read_text())
    space["engine"] = {"max_num_seqs": [4, 16]}
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    inner = landscape.measurer()
    ran: list[tuple[str, int | None]] = []

    def measure(engine, spec: SpecConfig, *args: object, **kwargs: object) -> Measurement:  # noqa: ANN001
        ran.append((spec.label(), engine.max_num_seqs))
        m = inner(engine, spec, *args, **kwargs)
        m = m.model_copy(update={"engine": m.engine.model_copy(update={"max_num_seqs": engine.max_num_seqs})})
        return scaled(m, 1.25) if engine.max_num_seqs == 16 else m  # the larger batch cap pays here

    config = landscape.config(storage=f"sqlite:///{tmp_path / 'k.db'}", study_name="knobs", sampler="guided",
                              trials=12, space=str(tmp_path / "space.yaml"), log_dir=str(tmp_path / "logs"))
    run_study(config, measure_fn=measure)
    assert ran[0] == ("none", 4)  # the baseline at the knobs' first values
    view = open_study(config.storage, "knobs")
    rows = [r for r in view.rows if r.state == "COMPLETE" and r.duplicate_of is None]
    assert all(r.engine is not None and r.label.endswith(f", max_num_seqs={r.engine['max_num_seqs']}") for r in rows)
    keys = [r.config_key for r in rows if r.confirms is None]
    assert len(keys) == len(set(keys))  # no candidate measured twice but by a recheck
    # once the models had nothing left to measure, the sampler gave the best configuration other knobs
    explored = [t for t in view.study.trials if TrialRecord.of(t).guide_reason == KNOBS_BY_SAMPLER]
    assert explored and all(TrialRecord.of(t).predicted is None for t in explored)  # no model: no prediction
    choice = view.best()
    assert not choice.is_baseline and choice.row.engine == {"max_num_seqs": 16}
    assert "Optuna's TPESampler" in (StudyRecord.of(view.study).guide or {})["engine_knobs"]
    out = export_best(view, tmp_path / "best.yaml")
    exported = yaml.safe_load(out.path.read_text())
    assert exported["max-num-seqs"] == 16 and exported["speculative-config"] == choice.row.spec
