"""The engine spread as studies learn and remember it: the baseline measured twice where nothing
is known, pooled over the studies of one storage on one machine, a platform prior before that,
and the one interval the decision, ``show --json`` and the export state (the recorded landscape)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
from landscape_runs import second_engine
from typer.testing import CliRunner

from spectune.landscape import Landscape
from spectune.measurement import Measurement
from spectune.noise import PRIOR_DOF, PRIORS, EngineSpread, estimate, interval, machine_key, prior_for
from spectune.records import RECHECK_SPREAD
from spectune.results import open_study
from spectune.worker import run_study


def _pooled(groups: list[list[float]], prior: float) -> float:
    dof = sum(len(g) - 1 for g in groups)
    rel = sum((len(g) - 1) * statistics.variance(g) / statistics.fmean(g) ** 2 for g in groups)
    return math.sqrt((rel + PRIOR_DOF * prior ** 2) / (dof + PRIOR_DOF))


def test_the_spread_is_its_prior_until_measured_and_moves_to_what_is() -> None:
    cpu = prior_for("cpu")
    assert estimate([], [], cpu) == EngineSpread(cpu.value, "prior", 0, cpu)
    assert prior_for("gpu").value < cpu.value / 3  # GPU engines differ far less between starts
    one = estimate([[100.0, 90.0]], [], cpu)
    assert one.source == "study" and one.starts == 2 and one.value == pytest.approx(_pooled([[100.0, 90.0]], cpu.value))
    assert one.measured == one.value and estimate([], [], cpu).measured is None
    many = estimate([[100.0, 97.0]], [[50.0, 51.0, 49.0]] * 6, cpu)
    assert many.source == "machine" and many.starts == 20 and many.value < 0.06  # the prior weighs as one pair
    assert estimate([[100.0]], [[7.0]], cpu).source == "prior"  # a single start measures nothing


def test_the_interval_is_on_the_log_of_the_gain() -> None:
    low, high = interval(1.57, 0.2)
    assert low * high == pytest.approx(1.57 ** 2) and high / low == pytest.approx(math.exp(0.4))


def _elsewhere(m: Measurement) -> Measurement:
    """``m`` as if measured on a processor without AVX-512."""
    return m.model_copy(update={"hardware": m.hardware.model_copy(update={"cpu_features": ["avx2"], "cpu": "Other CPU"})})


def test_a_study_learns_the_spread_first_and_the_next_on_the_machine_starts_from_it(
        landscape: Landscape, tmp_path: Path) -> None:
    from spectune.cli import app

    url = f"sqlite:///{tmp_path / 'm.db'}"
    config = landscape.config(storage=url, study_name="first", sampler="guided", trials=len(landscape.points),
                              log_dir=str(tmp_path / "logs"))
    spent: list[tuple[str, float]] = []
    run_study(config, measure_fn=second_engine(landscape, 0.85, spent, baseline_factor=0.9))
    measured = [label for label, _ in spent]
    assert measured[:2] == ["none", "none"]  # the baseline again before the first pick
    view = open_study(url, "first")
    again = [r for r in view.rows if r.recheck_reason == RECHECK_SPREAD]
    assert len(again) == 1 and again[0].is_baseline and again[0].state == "COMPLETE"
    groups = [c.values for c in view.engines() if len(c.values) > 1]
    first = view.record()["engine_spread"]
    assert first["source"] == "study" and first["starts"] == sum(len(g) for g in groups)
    assert first["value"] == pytest.approx(_pooled(groups, PRIORS["cpu"].value))

    # a second study in the same storage, on the same machine: the figure is there from its start
    spent = []
    run_study(config.model_copy(update={"study_name": "second"}),
              measure_fn=second_engine(landscape, 0.85, spent, baseline_factor=0.9))
    assert [label for label, _ in spent][:2] != ["none", "none"]
    second = open_study(url, "second")
    assert not [r for r in second.rows if r.recheck_reason == RECHECK_SPREAD]
    mine = [c.values for c in second.engines() if len(c.values) > 1]
    result = CliRunner().invoke(app, ["show", "--storage", url, "--study", "second", "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["engine_spread"]["source"] == "machine"
    assert shown["engine_spread"]["starts"] == first["starts"] + sum(len(g) for g in mine)
    assert shown["engine_spread"]["value"] == pytest.approx(_pooled(groups + mine, PRIORS["cpu"].value))
    best = shown["best"]
    low, high = best["interval"]
    assert low == pytest.approx(best["speedup"] * math.exp(-best["noise_band"]))
    assert high == pytest.approx(best["speedup"] * math.exp(best["noise_band"]))
    assert (low > 1.0) != best["is_baseline"]  # the decision is the interval's
    # and the export states the same interval and where the spread came from
    result = CliRunner().invoke(app, ["export", "--storage", url, "--study", "second", "-o", str(tmp_path / "best.yaml")])
    assert result.exit_code == 0, result.output
    provenance = json.loads((tmp_path / "best.provenance.json").read_text())
    assert provenance["interval"] == pytest.approx(best["interval"])
    assert provenance["engine_spread"]["source"] == "machine"
    header = (tmp_path / "best.yaml").read_text()
    assert "this machine's, over the studies in this storage" in header
    if not best["is_baseline"]:
        assert f"{best['speedup']:.2f}x, {low:.2f}-{high:.2f}x the baseline" in header


def test_another_machine_does_not_pool(landscape: Landscape, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'o.db'}"
    config = landscape.config(storage=url, study_name="here", sampler="guided", trials=len(landscape.points),
                              log_dir=str(tmp_path / "logs"))
    run_study(config, measure_fn=second_engine(landscape, 0.85, [], baseline_factor=0.9))
    inner = second_engine(landscape, 0.85, [], baseline_factor=0.9)
    spent: list[str] = []

    def other(engine: object, spec: object, *args: object, **kwargs: object) -> Measurement:
        spent.append(spec.label())  # type: ignore[attr-defined]
        return _elsewhere(inner(engine, spec, *args, **kwargs))

    run_study(config.model_copy(update={"study_name": "there"}), measure_fn=other)
    there = open_study(url, "there")
    here = open_study(url, "here")
    assert machine_key(there.store.measurement(there.baseline().trial_id)) != \
        machine_key(here.store.measurement(here.baseline().trial_id))
    assert spent[:2] == ["none", "none"]  # nothing known on this machine: it learns its own
    assert there.spread().source == "study"


def test_a_gpu_study_leans_on_the_gpu_prior_and_says_it_is_assumed(landscape: Landscape, tmp_path: Path) -> None:
    inner = landscape.measurer()

    def on_gpu(engine: object, spec: object, *args: object, **kwargs: object) -> Measurement:
        m = inner(engine, spec, *args, **kwargs)
        gpus = ["0, GPU-1111, NVIDIA H100 80GB HBM3, 81559 MiB"]
        return m.model_copy(update={"hardware": m.hardware.model_copy(update={"platform": "gpu", "gpus": gpus})})

    config = landscape.config(storage=f"sqlite:///{tmp_path / 'g.db'}", study_name="gpu", sampler="grid", trials=3,
                              log_dir=str(tmp_path / "logs"))
    run_study(config, measure_fn=on_gpu)
    view = open_study(config.storage, "gpu")
    spread = view.spread()
    assert "NVIDIA H100 80GB HBM3" in machine_key(view.store.measurement(view.baseline().trial_id))
    assert spread.source == "prior" and spread.value == PRIORS["gpu"].value
    assert "assumed" in spread.note() and "gpu prior" in spread.note()
    choice = view.best()
    assert choice.spread == spread and choice.engine_spread is None  # nothing measured: no figure of its own
