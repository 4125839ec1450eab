"""Workers that plan together: guided search counts the trials running on other workers at their predictions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from landscape_runs import replay_workers

from spectune.config import Method, SpecConfig
from spectune.landscape import Landscape
from spectune.predict import Estimate, Prediction, chance_to_beat, chance_to_beat_all, plan_next

FLEET_LANDSCAPE = Path(__file__).resolve().parents[2] / "benchmarks" / "landscapes" / "tiny.json"


def _pred(value: float, low: float, high: float, *, method: Method = Method.NGRAM, k: int = 3,
          source: str = "replay") -> Prediction:
    spec = SpecConfig(method=method, num_speculative_tokens=k, model="draft" if method is Method.DRAFT_MODEL else None)
    e = Estimate(value, low, high)
    return Prediction(label=spec.label(), spec=spec, source=source, acceptance_rate=0.5, mean_acceptance_length=1.5,
                      tokens_per_step=e, tpot_ms=e, output_throughput=e, objective="output_throughput",
                      value=e, cost_source="fit")


@pytest.mark.parametrize("maximize", [True, False])
def test_the_chance_to_beat_several_rivals_is_the_chance_to_beat_their_best(maximize: bool) -> None:
    rng = np.random.default_rng(0)
    n = 400_000
    c, a, b = rng.normal(100, 10, n), rng.normal(95, 5, n), rng.normal(98 if maximize else 102, 8, n)
    sampled = (np.mean(c > 1.02 * np.maximum(a, b)) if maximize else np.mean(c < 0.98 * np.minimum(a, b)))
    found = chance_to_beat_all(100, 10, [(95, 5), (98 if maximize else 102, 8)], tolerance=0.02, maximize=maximize)
    assert found == pytest.approx(sampled, abs=0.005)
    single = chance_to_beat(100, 10, 95, 5, tolerance=0.02, maximize=maximize)
    assert chance_to_beat_all(100, 10, [(95, 5)], tolerance=0.02, maximize=maximize) == single
    assert found < single  # a second rival only makes it harder


def test_a_candidate_the_running_trials_make_pointless_is_not_started() -> None:
    candidate = _pred(110, 105, 115, k=3)
    alone = plan_next([candidate], pick=100.0, pick_sd=1.0, step=0)
    assert alone.pick == candidate  # it could beat the pick by more than 2 %
    # another worker measures a candidate predicted at 130: beating 100 alone is not worth an engine now
    running = [_pred(130, 125, 135, method=Method.SUFFIX, k=8)]
    plan = plan_next([candidate], pick=100.0, pick_sd=1.0, step=0, running=running)
    assert plan.pick is None and plan.skipped == [candidate]
    assert plan.chances[candidate.label] < 0.05 < alone.chances[candidate.label]


def test_a_candidate_waits_for_the_acceptance_a_running_trial_will_give_it() -> None:
    small = _pred(120, 60, 180, method=Method.DRAFT_MODEL, k=3, source="prior")
    replayed = _pred(115, 100, 130, method=Method.SUFFIX, k=4)
    larger = _pred(118, 60, 176, method=Method.DRAFT_MODEL, k=6, source="prior")
    assert plan_next([small], pick=100.0, step=0).pick == small
    # the same draft running at k=6: its counters give k=3 by truncation; the replayed suffix goes first
    plan = plan_next([small, replayed], pick=100.0, step=0, running=[larger])
    assert plan.pick == replayed and small in plan.candidates
    assert plan_next([small], pick=100.0, step=0, running=[larger]).pick is None  # wait, not stop: still alive
    # at a smaller k it gives no truncation: the candidate is picked
    lower = _pred(110, 60, 160, method=Method.DRAFT_MODEL, k=2, source="prior")
    assert plan_next([small], pick=100.0, step=0, running=[lower]).pick == small


def test_the_uncertain_pick_passes_over_a_proposer_being_measured() -> None:
    promising = _pred(130, 129, 131, method=Method.SUFFIX, k=8)
    uncertain = _pred(120, 80, 170, k=4)
    assert plan_next([promising, uncertain], pick=100.0, step=1).pick == uncertain
    running = [_pred(115, 80, 160, k=6)]  # n-gram measured elsewhere: its cost is being calibrated
    plan = plan_next([promising, uncertain], pick=100.0, step=1, running=running)
    assert plan.pick == promising and plan.reason == "promising"


@pytest.mark.usefixtures("spread_not_learned_first")
def test_three_workers_reach_the_best_sooner_with_no_more_engine_runs(tmp_path: Path) -> None:
    """The fleet benchmark's study (tiny.json, three engine starts per candidate, no weights read: drafts predicted
    without their offline run), on the virtual clock: engine seconds, the same on every run."""
    landscape = Landscape.load(FLEET_LANDSCAPE)
    landscape = landscape.rebase("landscape/target", "landscape/draft")
    means = landscape.means("output_throughput")
    good = {label for label, v in means.items() if v >= 0.98 * max(means.values())}

    def study(slots: int) -> list[tuple[float, str]]:
        config = landscape.config(storage=f"sqlite:///{tmp_path / f'{slots}.db'}", study_name=f"w{slots}",
                                  sampler="guided", trials=12, log_dir=str(tmp_path / "logs"))
        return replay_workers(config, landscape, slots)

    one, three = study(1), study(3)
    assert len(three) <= len(one), "three workers ran more engines than one"
    reached = [next(t for t, label in runs if label in good) for runs in (one, three)]
    # before the workers planned together: 9 engines, and the best at 84 s against 134 s
    assert reached[1] <= reached[0] / 2, f"the best at {reached[1]:.0f} s of engine time against {reached[0]:.0f}"
