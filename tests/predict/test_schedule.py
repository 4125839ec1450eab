"""The batch-size schedule (num_speculative_tokens_per_batch_size) from the cost model, as vLLM accepts it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from spectune.landscape import Landscape
from spectune.predict import (
    AcceptanceProfile,
    batch_cost,
    derive_schedule,
)
from spectune.results import open_study
from spectune.worker import run_study


def test_schedule_is_what_vllm_accepts_and_maximises_the_modelled_gain() -> None:
    from vllm.v1.spec_decode.dynamic.utils import (
        build_dynamic_sd_schedule_lookup,
        validate_and_normalize_dynamic_sd_schedule,
    )

    per_position = [0.8, 0.62, 0.47, 0.33, 0.2]
    schedule = derive_schedule(per_position, c1=0.08, measured_concurrency=2, max_batch=128)
    assert validate_and_normalize_dynamic_sd_schedule(schedule.to_vllm()) == schedule.ranges
    lookup = build_dynamic_sd_schedule_lookup(schedule.to_vllm(), 128, 5)
    profile = AcceptanceProfile(tuple(per_position))
    for b in (1, 2, 3, 7, 20, 64, 128):
        c = batch_cost(0.08, 2, b)
        gains = [1.0] + [profile.truncated(k).tokens_per_step / (1 + c * k) for k in range(1, 6)]
        assert lookup[b] == schedule.k_at(b) == max(range(6), key=lambda k: (gains[k], -k))
    ks = [lookup[b] for b in range(1, 129)]
    assert ks == sorted(ks, reverse=True), "drafting gets dearer with the batch: k never grows"
    assert ks[0] == 5 and ks[-1] < ks[0]
    assert batch_cost(0.08, 2, 2) == pytest.approx(0.08)
    assert batch_cost(0.08, 2, 1) < 0.08 < batch_cost(0.08, 2, 4) < 1.0


def test_schedule_without_a_gain_drafts_nothing_and_bad_input_is_refused() -> None:
    schedule = derive_schedule([0.1, 0.01], c1=0.5, measured_concurrency=1, max_batch=16)
    assert schedule.ranges == [(1, 16, 0)]
    with pytest.raises(ValueError, match="max_k must be in 1..2"):
        derive_schedule([0.1, 0.01], c1=0.5, measured_concurrency=1, max_k=3)
    with pytest.raises(ValueError, match="no measured per-position acceptance"):
        derive_schedule([], c1=0.5, measured_concurrency=1)


def test_export_adds_a_batch_schedule_vllm_accepts(landscape: Landscape, tmp_path: Path) -> None:
    from vllm.v1.spec_decode.dynamic.utils import (
        validate_and_normalize_dynamic_sd_schedule,
    )

    from spectune.export import export_best

    config = landscape.config(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="grid",
                              sampler="grid", trials=len(landscape.points), log_dir=str(tmp_path / "logs"))
    run_study(config, measure_fn=landscape.measurer())
    view = open_study(config.storage, "grid")
    choice = view.best()
    assert not choice.is_baseline, "the tiny landscape has a speculative winner"
    out = export_best(view, tmp_path / "best.yaml", schedule_max_batch=64)
    spec = yaml.safe_load((tmp_path / "best.yaml").read_text())["speculative-config"]
    schedule = spec["num_speculative_tokens_per_batch_size"]
    assert validate_and_normalize_dynamic_sd_schedule(schedule) == [tuple(r) for r in schedule]
    assert schedule[0][0] == 1 and schedule[-1][1] == 64
    assert all(0 <= k <= spec["num_speculative_tokens"] for _, _, k in schedule)
    record = json.loads(out.provenance_path.read_text())["batch_schedule"]
    assert record["num_speculative_tokens_per_batch_size"] == schedule and record["c_from_trials"] >= 1
    plain = export_best(view, tmp_path / "plain.yaml")
    assert "num_speculative_tokens_per_batch_size" not in plain.config["speculative-config"]
