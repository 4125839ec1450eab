"""The tables of ``landscapes.json`` as RESULTS.md shows them (``landscapes.py --markdown``): search
efficiency, decisions, the edges of the space, and the courses of guided studies."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


RESULTS = REPO / "benchmarks" / "results"


def result_path(name: str) -> Path:
    """Where ``search_efficiency.py evaluate`` wrote landscape ``name``'s result."""
    return RESULTS / ("search_efficiency.json" if name == "tiny" else f"search_efficiency_{name}.json")



def _ratio(value: float | None, strategy: str, *, goal: bool = False) -> str:
    """A ratio or share of guided search's engine seconds over ``strategy``'s: against the grid
    (``grid``, which measures everything) None where some guided seed never got there; against
    random search or TPE (medians over the seeds) None where guided's median never got there, 0
    where the other's did not."""
    if value is None:
        return "a guided seed never got there" if strategy == "grid" else "guided's median never got there"
    if value == 0.0 and strategy != "grid":
        return f"{strategy}'s median never got there"
    return f"**{value:.3f}**" if goal and value <= GOAL_RATIO else f"{value:.3f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}".replace("%", " %")


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


GOAL_RATIO = 0.15
"""The goal for guided search: a configuration within the tolerance of the best for at most this
share of the exhaustive grid's engine seconds."""


def markdown(rows: list[dict[str, Any]]) -> str:
    """The table of ``rows`` (``landscapes.json``) as ``benchmarks/RESULTS.md`` shows it: guided
    search's engine seconds to within the noise band of the best and to within 2 % of it, as a
    share of the exhaustive grid's (bold where at most :data:`GOAL_RATIO`) and over the grid's
    in the space's order; over random search and TPE in the median over the seeds, to within
    the band; and the other figures."""
    head = ("| landscape | dtype | workload | in flight | candidates | noise band "
            "| guided to within the band, share of the grid | guided / grid in order, within the band "
            "| guided / random, medians within the band | guided / TPE, medians within the band "
            "| guided to within 2 %, share of the grid | guided / grid in order, within 2 % "
            "| acceptance length error (median / max) | throughput error "
            "| a prediction at the true value, from the recorded mean | one engine start from its candidate's mean "
            "| same pick | baseline pick "
            "| first speculative trial inside the prior's interval | candidates inside the prior's interval |")
    lines = [head, "|" + "---|" * (head.count(" | ") + 1)]
    for r in rows:
        lines.append("| " + " | ".join([
            f"`{r['name']}`", str(r.get("dtype") or "-"), str(r["workload"]), str(r["concurrency"]),
            str(r["candidates"]), f"+-{_pct(r['noise_band'])}",
            _ratio(r["grid_share_band"], "grid", goal=True), _ratio(r["grid_ratio_band"], "grid"),
            _ratio(r["random_median_ratio_band"], "random"), _ratio(r["tpe_median_ratio_band"], "TPE"),
            _ratio(r["grid_share"], "grid", goal=True), _ratio(r["grid_ratio"], "grid"),
            f"{_pct(r['acceptance_error_median'])} / {_pct(r['acceptance_error_max'])}", _pct(r["throughput_error"]),
            _pct(r["throughput_target_noise"]), _pct(r["single_engine_error"]), _rate(r["same_pick_rate"]), _rate(r["baseline_pick_rate"]), _rate(r["prior_interval_hit_rate"]),
            _rate(r["prior_interval_coverage"]),
        ]) + " |")
    return "\n".join(lines) + "\n"


STOP_GOAL = 0.30
"""Issue 42's goal: a study stops after at most this share of the grid's engine seconds."""


def decisions_markdown(rows: list[dict[str, Any]]) -> str:
    """Where guided search stops and how right its answer is, beside successive halving and
    vLLM's ``tune_speculative_k`` rule replayed on the same draws (:func:`rival_rules`): the
    median share of the grid's engine seconds spent until the study stopped (``stop_ratio``,
    bold where at most :data:`STOP_GOAL`), the share of studies whose exported band holds the
    landscape's best (``band_coverage``), the median regret and the same-pick rate."""
    head = ("| landscape | studies | guided: stop ratio | band coverage | median regret | same pick "
            "| successive halving: stop ratio / median regret / same pick "
            "| the grid once: median regret / same pick "
            "| vLLM's tune_speculative_k rule: stop ratio / median regret / same pick |")
    lines = [head, "|" + "---|" * (head.count(" | ") + 1)]

    def stop(v: float | None) -> str:
        return "-" if v is None else f"**{v:.2f}**" if v <= STOP_GOAL else f"{v:.2f}"

    for r in rows:
        if r.get("stop_ratio") is None:
            continue
        rivals = r.get("rival_rules") or {}

        def rival(name: str) -> str:
            x = rivals.get(name)
            return "-" if x is None else f"{x['stop_ratio']:.2f} / {_pct(x['regret_median'])} / {x['same_pick_rate']:.2f}"

        lines.append("| " + " | ".join([
            f"`{r['name']}`", str(r.get("decision_seeds")), stop(r["stop_ratio"]), _rate(r["band_coverage"]),
            _pct(r["regret_median"]), _rate(r["same_pick_rate"]), rival("successive_halving"),
            "-" if (g := rivals.get("grid_once")) is None else f"{_pct(g['regret_median'])} / {g['same_pick_rate']:.2f}",
            rival("vllm_tune_k"),
        ]) + " |")
    return "\n".join(lines) + "\n"


def edges_markdown(rows: list[dict[str, Any]]) -> str:
    """The landscapes whose studies start from a narrower space (:func:`start_space`): guided
    search widening past the edges against the same studies kept to the space (``--no-extend``),
    each scored against the best of the whole landscape."""
    head = ("| landscape | studies | widened in | widened: same pick / median regret / stop ratio "
            "| kept to the space: same pick / median regret / stop ratio |")
    lines = [head, "|---|---|---|---|---|"]
    for r in rows:
        d, kept = r.get("decision") or {}, (r.get("decision") or {}).get("kept")
        if not d.get("start_space") or kept is None:
            continue
        widened = statistics.fmean(bool(w) for w in d.get("widened") or [[]])
        lines.append(f"| `{r['name']}` | {r.get('decision_seeds')} | {widened:.2f} of the studies | "
                     f"{d['same_pick_rate']:.2f} / {_pct(d['regret_median'])} / {d['stop_ratio']:.2f} | "
                     f"{kept['same_pick_rate']:.2f} / {_pct(kept['regret_median'])} / {kept['stop_ratio']:.2f} |")
    return "\n".join(lines) + "\n"


def _seconds(value: float | None, trials: list[int | None] | None = None) -> str:
    if value is None:
        return "a seed never got there"
    return f"{value:.0f}" + (f" ({trials[0]})" if trials and len(set(trials)) == 1 and trials[0] else "")


def courses_markdown(names: list[str]) -> str:
    """What guided search spent on each landscape (its ``evaluate`` result): engine seconds (and
    trials) until within the noise band and within 2 % of the best, the grid's in the space's
    order and random search's and TPE's means, where it stopped and how far below the best its
    choice lies; then the configurations it measured, in order."""
    head = ("| landscape | guided: engine s (trials) to within the band | to within 2 % | grid in order: within the band "
            "/ 2 % | random, mean: within the band / 2 % | TPE, mean: within the band / 2 % | grid's engine s "
            "| guided stopped after (share of the grid's engine s) | guided's choice below the best |")
    lines = [head, "|" + "---|" * (head.count(" | ") + 1)]
    courses = ["", "| landscape | guided search measured, in order |", "|---|---|"]
    for name in names:
        result = json.loads(result_path(name).read_text())
        st, total = result["strategies"], result["landscape_engine_seconds"]
        guided, trace = st["guided"], result["guided_trace"]
        near = set(result["within_noise_band"])  # its trials to there: guided search is deterministic, seed 0's trace
        within = [next((i + 1 for i, lb in enumerate(trace["measured"]) if lb in near), None)] \
            if len(set(guided["seconds_to_reach_band"])) == 1 else None

        def both(s: dict[str, Any]) -> str:
            return f"{_seconds(s['mean_seconds_to_reach_band'])} / {_seconds(s['mean_seconds_to_reach'])}"

        lines.append("| " + " | ".join([
            f"`{name}`", _seconds(guided["mean_seconds_to_reach_band"], within),
            _seconds(guided["mean_seconds_to_reach"], guided["trials_to_reach"]), both(st["grid"]), both(st["random"]),
            both(st["tpe"]), f"{total:.0f}",
            f"{len(trace['measured'])} starts ({_pct(statistics.fmean(guided['total_seconds']) / total)})",
            _pct(guided["mean_regret"]),
        ]) + " |")
        courses.append(f"| `{name}` | {', '.join(trace['measured'])} |")
    return "\n".join(lines + courses) + "\n"
