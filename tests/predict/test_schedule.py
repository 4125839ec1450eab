"""The batch-size schedule (num_speculative_tokens_per_batch_size) from the cost model, as vLLM accepts it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import LANDSCAPE

from spectune.landscape import Landscape
from spectune.measurement import AcceptanceStats, EngineTimingStats, LevelStats, Measurement
from spectune.predict import (
    AcceptanceProfile,
    batch_cost,
    derive_schedule,
)
from spectune.predict._schedule import level_costs, measured_schedule
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



# -- from what a sweep measured -----------------------------------------------------------------

PER_POSITION = (0.8, 0.6, 0.45, 0.3, 0.2, 0.12, 0.07, 0.04)
LAW = {1: (0.02, 0.01), 4: (0.05, 0.04), 16: (0.15, 0.12)}
"""Each level's true ``(overhead, c)`` in the engine core's timing: drafting gets dearer with the batch."""
CLIENT_EXTRA = 0.03
"""What the client's figures add to the overhead: speculation's cost to the prefills sharing the steps,
which the engine core's TPOT leaves out."""


def law(b: int, source: str) -> tuple[float, float]:
    """The ``(overhead, c)`` that ``source``'s figures follow at level ``b``."""
    o, c = LAW[b]
    return (o if source == "engine" else o + CLIENT_EXTRA), c


def t0(b: int) -> float:
    return 2.0 + 0.3 * b


def _level(b: int, k: int | None, engine: bool) -> LevelStats:
    """A level measured under :data:`LAW`: 100 drafts of ``k`` tokens (None: the baseline) on 8
    requests, every decode step drafted; with the engine core's timing or without."""
    a = sum(PER_POSITION[:k]) if k else 0.0
    ratio = 1.0 + LAW[b][0] + LAW[b][1] * k if k else 1.0  # t(b, k) / t(b, 0) in the engine core
    tpot = t0(b) * (ratio + (CLIENT_EXTRA if k else 0.0)) / (1 + a)  # as the client sees it
    thr = 1000.0 * b / tpot
    tokens = 100 * (1 + a) + 8  # decode steps and each request's first token
    acc = AcceptanceStats(num_drafts=100, num_draft_tokens=100 * k, num_accepted_tokens=round(100 * a),
                          acceptance_rate=a / k, mean_acceptance_length=1 + a,
                          per_position=list(PER_POSITION[:k])) if k else None
    return LevelStats(concurrency=b, num_requests=8, num_failed=0, duration_seconds=tokens / thr, output_throughput=thr,
                      tpot_median_ms=tpot, ttft_median_ms=5.0, acceptance=acc,
                      engine_timing=EngineTimingStats(requests=8, prefill_ms=1.0, tpot_ms=t0(b) * ratio / (1 + a))
                      if engine else None)


def _swept(landscape_m: Measurement, k: int | None, engine: bool) -> Measurement:
    return landscape_m.model_copy(update={"levels": [_level(b, k, engine) for b in LAW], "concurrency": 1})


@pytest.mark.parametrize(("engine", "basis", "source"), [(True, "throughput", "throughput"), (True, "tpot", "engine"),
                                                      (False, "tpot", "client_tpot")])
def test_level_costs_recover_each_levels_step_cost(engine: bool, basis: str, source: str) -> None:
    m = Landscape.load(LANDSCAPE).points[0].measurement
    assert m is not None
    base = _swept(m, None, engine)
    costs = level_costs(base, [_swept(m, k, engine) for k in (2, 8)], basis=basis)
    assert [lc.batch for lc in costs] == [1, 4, 16]
    for lc in costs:
        o, c = law(lc.batch, source)  # each source's own law: the client's figures carry the prefills' share
        assert (lc.overhead, lc.c) == (pytest.approx(o, abs=2e-3), pytest.approx(c, abs=5e-4))
        assert lc.source == source and lc.ks == (2, 8) and lc.profile.k == 8
    one = level_costs(base, [_swept(m, 4, engine)], basis=basis)  # one k: its cost is all c
    assert all(lc.overhead == 0.0 and lc.c == pytest.approx((law(lc.batch, source)[0] + 4 * law(lc.batch, source)[1]) / 4,
                                                           rel=0.02) for lc in one)


def test_measured_schedule_takes_the_best_k_at_each_measured_level_and_vllm_accepts_it() -> None:
    from vllm.v1.spec_decode.dynamic.utils import validate_and_normalize_dynamic_sd_schedule

    m = Landscape.load(LANDSCAPE).points[0].measurement
    assert m is not None
    costs = level_costs(_swept(m, None, True), [_swept(m, k, True) for k in (2, 8)])
    schedule = measured_schedule(costs, max_k=8, max_batch=64, scale=lambda b: t0(b) / t0(1))
    assert validate_and_normalize_dynamic_sd_schedule(schedule.to_vllm()) == schedule.ranges
    profile = AcceptanceProfile(PER_POSITION)
    for b in LAW:
        o, c = law(b, "throughput")  # the schedule of a throughput objective: the client's figures
        gains = [1.0] + [profile.truncated(k).tokens_per_step / (1 + o + c * k) for k in range(1, 9)]
        assert schedule.k_at(b) == max(range(9), key=lambda k: (gains[k], -k))
    ks = [schedule.k_at(b) for b in range(1, 65)]
    assert ks[0] > ks[15] >= ks[63]  # dearer drafting with the batch, beyond the last level too
    with pytest.raises(ValueError, match="max_k must be in 1..8"):
        measured_schedule(costs, max_k=9)
    with pytest.raises(ValueError, match="no level"):
        measured_schedule([], max_k=2)


# -- on a real engine --------------------------------------------------------------------------


@pytest.mark.engine
def test_a_schedule_reaches_vllms_scheduler_and_k_follows_the_batch(tiny_models, tmp_path: Path) -> None:
    """A draft model proposes exactly k tokens per draft, so vLLM's counters at each level tell the
    k the scheduler used: the schedule's k for one request in flight, the other for eight."""
    from conftest import tiny_engine_args

    from spectune.config import Prompt, SpecConfig, WorkloadSpec
    from spectune.trial import measure

    prompts = [Prompt(id=f"p{i}", text=f"def f{i}(x):\n    y = x * {i}\n    return", max_tokens=24) for i in range(16)]
    schedule = [[1, 1, 4], [2, 256, 1]]
    spec = SpecConfig.model_validate({"method": "draft_model", "model": str(tiny_models.draft),
                                      "num_speculative_tokens": 4, "num_speculative_tokens_per_batch_size": schedule})
    workload = WorkloadSpec(source="inline", concurrency_levels=[1, 8],
                            sampling={"max_tokens": 24, "temperature": 0.0, "ignore_eos": True})
    m = measure(tiny_engine_args(tiny_models.target), spec, workload, prompts, log_dir=tmp_path, repeats=1)
    assert any("num_speculative_tokens_per_batch_size" in part for part in m.command)
    quiet, busy = m.level_at(1), m.level_at(8)
    assert quiet is not None and busy is not None and quiet.acceptance and busy.acceptance
    k_quiet = quiet.acceptance.num_draft_tokens / quiet.acceptance.num_drafts
    k_busy = busy.acceptance.num_draft_tokens / busy.acceptance.num_drafts
    assert k_quiet == 4.0  # alone on the engine: every step drafted the schedule's k for batch 1
    assert k_busy < 2.0  # eight in flight drafted 1; only the stragglers' steps, alone again, drafted 4
    assert m.acceptance is not None and quiet.acceptance.num_drafts > 0 and busy.acceptance.num_drafts > 0
