"""Rival rules replayed on a recorded landscape's engine starts (successive halving, the grid measured
once, the rule of vLLM's closed ``tune_speculative_k``), and what every replay scores a choice by: the
grid's engine seconds and the regret."""

from __future__ import annotations

import math
import random
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from spectune.landscape import Landscape  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))



VLLM_MAD_SCALE = 1.4826
"""vLLM's closed ``tune_speculative_k``: a k scores its median minus this times its MAD over runs."""


VLLM_TIE = 0.01
"""...and scores within 1 % of the best go to the smaller k."""


VLLM_RUNS = 3
"""Engine starts per candidate the vLLM rule is replayed with (drawn from the recorded ones)."""


def rival_rules(landscape: Landscape, seeds: int) -> dict[str, dict[str, Any]]:
    """Two other ways to decide, replayed on the landscape with the same random draws of its
    recorded engine starts as :func:`decision_quality` (one start drawn per measurement):

    - ``successive_halving``: every candidate on one engine, then the better half (by its mean so
      far) once more, and so on until one is left: the pick;
    - ``grid_once``: every candidate on one engine, the best measured value its pick: the
      regret the recording's own noise leaves at the grid's whole cost;
    - ``vllm_tune_k``: the rule of vLLM's closed ``tune_speculative_k``: every candidate on
      :data:`VLLM_RUNS` engines, scored by its median minus :data:`VLLM_MAD_SCALE` x MAD, the
      pick the best score, where scores within :data:`VLLM_TIE` of it go to the smaller k (the
      baseline's k is 0).

    Per rule: ``stop_ratio`` (median over the seeds of the engine seconds spent over the grid's),
    ``regret_median`` and ``same_pick_rate`` (as :func:`decision_quality`); neither exports a band."""
    objective = landscape.config().objectives[0]
    sign = 1.0 if objective.maximize else -1.0
    means = landscape.means(objective.value)
    best = max(means, key=lambda k: sign * means[k])
    band = landscape.noise_band(objective.value)
    grid = grid_engine_seconds(landscape)
    engines = landscape.engines()

    def draw(rng: random.Random, key: str) -> tuple[float | None, float]:
        p = rng.choice(engines[key])
        return landscape.value(p, objective.value), p.engine_seconds

    def score(values: list[float]) -> float:
        if not values:
            return -math.inf
        signed = [sign * v for v in values]
        med = statistics.median(signed)
        return med - VLLM_MAD_SCALE * statistics.median(abs(v - med) for v in signed)

    def k_of(key: str) -> int:
        return int(engines[key][0].spec.get("num_speculative_tokens") or 0)

    out: dict[str, dict[str, Any]] = {}
    for rule in ("successive_halving", "grid_once", "vllm_tune_k"):
        ratios, chosen = [], []
        for seed in range(seeds):
            rng, spent = random.Random(seed), 0.0
            seen: dict[str, list[float]] = {k: [] for k in engines}
            rounds = VLLM_RUNS if rule == "vllm_tune_k" else 1
            alive = list(engines)
            while True:
                for key in alive:
                    for _ in range(rounds):
                        value, seconds = draw(rng, key)
                        spent += seconds
                        if value is not None:
                            seen[key].append(value)
                if rule != "successive_halving" or len(alive) == 1:
                    break
                ranked = sorted(alive, key=lambda k: -sign * statistics.fmean(seen[k]) if seen[k] else math.inf)
                alive = ranked[: max(1, len(alive) // 2)]
            if rule == "successive_halving":
                pick = alive[0]
            elif rule == "grid_once":
                pick = max((k for k in engines if seen[k]), key=lambda k: sign * seen[k][0])
            else:
                scores = {k: score(seen[k]) for k in engines}
                top = max(scores.values())
                near = [k for k, v in scores.items() if v >= top - VLLM_TIE * abs(top)]
                pick = min(near, key=lambda k: (k_of(k), -scores[k]))
            ratios.append(spent / grid)
            chosen.append(engines[pick][0].label)
        regret = [regret_of(means, best, c, sign) for c in chosen]
        same = [c == best or sign * (means.get(c, -sign * math.inf) / means[best] - 1.0) >= -band for c in chosen]
        out[rule] = {"stop_ratio": statistics.median(ratios), "regret_median": statistics.median(regret),
                     "same_pick_rate": statistics.fmean(same), "chosen": chosen}
    return out


def grid_engine_seconds(landscape: Landscape) -> float:
    """The exhaustive grid's engine seconds: every candidate's first recorded start once (as
    ``evaluate``'s ``landscape_engine_seconds``)."""
    return sum(p.engine_seconds for p in landscape.by_key().values())


def regret_of(means: dict[str, float], best: str, chosen: str, sign: float) -> float:
    """How far the chosen configuration's mean lies below the landscape's best mean (relative; 0
    for the best, and for a choice whose every engine failed on the landscape: counted as 1)."""
    if chosen not in means:
        return 1.0
    return max(0.0, sign * (means[best] - means[chosen]) / abs(means[best]))
