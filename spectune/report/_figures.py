"""The figures of a study (plotly), pure: a view in, a Figure out."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spectune.records import TrialRecord

if TYPE_CHECKING:
    from plotly.graph_objects import Figure

    from spectune.results import StudyView, TrialRow


__all__ = ["FIGURE_IDS", "fig_acceptance_per_position", "fig_predicted_vs_measured", "fig_speedup_vs_k", "fig_throughput_vs_latency", "figures", "points"]

_logger = logging.getLogger(__name__)

FIGURE_IDS: dict[str, str] = {
    "speedup_vs_k": "spectune-speedup-vs-k",
    "acceptance_per_position": "spectune-acceptance-per-position",
    "throughput_vs_latency": "spectune-throughput-vs-latency",
    "predicted_vs_measured": "spectune-predicted-vs-measured",
}
"""Dashboard graph-object id of each figure; fixed, so that annotating again replaces them."""

_TEMPLATE = "plotly_white"
_LATENCY_DEFAULT = "tpot_median_ms"
_UNITS = {"output_throughput": "output tokens/s", "tpot_median_ms": "TPOT median (ms)",
          "tpot_p99_ms": "TPOT p99 (ms)", "ttft_p99_ms": "TTFT p99 (ms)",
          "e2el_median_ms": "end-to-end median (ms)", "e2el_p99_ms": "end-to-end p99 (ms)"}


# -- what the figures read ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Point:
    """A completed, measured (not reused) trial with the user attributes figures need."""

    row: TrialRow
    rec: TrialRecord

    @property
    def k(self) -> int | None:
        k = self.row.spec.get("num_speculative_tokens")
        return int(k) if k is not None else None

    @property
    def proposer(self) -> str:
        """The candidate without its k: ``ngram lookup=1..3``, ``draft_model (draft)``."""
        return re.sub(r" k=\d+", "", self.row.label)

    def metric(self, view: StudyView, name: str) -> float | None:
        """An objective's value (the trial's value when it is an objective, else its attribute)."""
        if name in view.objectives and self.row.values is not None:
            return float(self.row.values[view.objectives.index(name)])
        value = getattr(self.rec, name, None) if name in TrialRecord.model_fields else None
        return float(value) if isinstance(value, int | float) else None


def points(view: StudyView) -> list[_Point]:
    records = {t.number: TrialRecord.of(t) for t in view.study.get_trials(deepcopy=False)}
    return [_Point(r, records.get(r.number, TrialRecord())) for r in view.complete() if r.duplicate_of is None]


def _go() -> Any:
    import plotly.graph_objects as go

    return go


def _layout(fig: Figure, title: str, x: str, y: str) -> Figure:
    fig.update_layout(title=title, xaxis_title=x, yaxis_title=y, template=_TEMPLATE,
                      legend={"title": {"text": ""}}, margin={"l": 60, "r": 20, "t": 60, "b": 50})
    return fig


def _hover(p: _Point) -> str:
    return f"#{p.row.number} {p.row.label}"


# -- figures (pure) ------------------------------------------------------------------------------


def fig_speedup_vs_k(view: StudyView) -> Figure:
    """Speedup over the baseline against k, one line per proposer (method and its model or
    lookup range); the baseline is the dashed line at 1. Infeasible trials are hollow."""
    go = _go()
    fig = go.Figure()
    groups: dict[str, list[_Point]] = {}
    for p in points(view):
        if p.row.is_baseline or p.k is None or p.row.speedup is None:
            continue
        groups.setdefault(p.proposer, []).append(p)
    for name, pts in sorted(groups.items()):
        pts.sort(key=lambda p: (p.k or 0, p.row.number))
        fig.add_trace(go.Scatter(
            x=[p.k for p in pts], y=[p.row.speedup for p in pts], name=name, mode="lines+markers",
            text=[_hover(p) for p in pts], hovertemplate="%{text}<br>k=%{x}: %{y:.3f}x<extra></extra>",
            marker={"size": 9, "symbol": ["circle" if p.row.feasible else "circle-open" for p in pts]},
        ))
    fig.add_hline(y=1.0, line_dash="dash", line_color="gray", annotation_text="baseline (no speculation)",
                  annotation_position="bottom right")
    fig.update_xaxes(dtick=1)
    objective = view.objectives[0] if view.objectives else "objective"
    return _layout(fig, "Speedup over no speculation against k", "k (num_speculative_tokens)",
                   f"speedup ({objective})")


def fig_acceptance_per_position(view: StudyView) -> Figure:
    """P(the first i drafted tokens are all accepted) for i = 1..k, one curve per proposer,
    from its trial with the largest k (acceptance hardly depends on k; more positions show more)."""
    go = _go()
    fig = go.Figure()
    chosen: dict[str, _Point] = {}
    for p in points(view):
        per = p.rec.per_position_acceptance
        if p.row.is_baseline or not per:
            continue
        old = chosen.get(p.proposer)
        if old is None or len(per) > len(old.rec.per_position_acceptance or []):
            chosen[p.proposer] = p
    for name, p in sorted(chosen.items()):
        per = [float(x) for x in p.rec.per_position_acceptance or []]
        fig.add_trace(go.Scatter(
            x=list(range(1, len(per) + 1)), y=per, name=name, mode="lines+markers",
            text=[_hover(p)] * len(per),
            hovertemplate="%{text}<br>position %{x}: %{y:.3f}<extra></extra>",
        ))
    fig.update_xaxes(dtick=1)
    fig.update_yaxes(range=[0, 1.05])
    return _layout(fig, "Acceptance per draft position", "draft position i",
                   "P(first i drafted tokens accepted)")


def _latency_metric(view: StudyView) -> str:
    return next((o for o in view.objectives if o.endswith("_ms")), _LATENCY_DEFAULT)


def _pareto(points: Iterable[tuple[float, float, _Point]]) -> list[tuple[float, float, _Point]]:
    """Points no other point beats on both lower latency and higher throughput, by latency."""
    pts = sorted(points, key=lambda t: (t[0], -t[1]))
    front: list[tuple[float, float, _Point]] = []
    for lat, thr, p in pts:
        if not front or thr > front[-1][1]:
            front.append((lat, thr, p))
    return front


def fig_throughput_vs_latency(view: StudyView) -> Figure:
    """Output throughput against latency (the latency objective, else TPOT median) of every
    measured trial, with the Pareto front of the feasible ones; SLO breakers are crosses."""
    go = _go()
    latency = _latency_metric(view)
    fig = go.Figure()
    measured = [(lat, thr, p) for p in points(view)
                if (lat := p.metric(view, latency)) is not None
                and (thr := p.metric(view, "output_throughput")) is not None]
    groups = {
        "baseline": [t for t in measured if t[2].row.is_baseline],
        "speculative": [t for t in measured if not t[2].row.is_baseline and t[2].row.feasible],
        "breaks SLO": [t for t in measured if not t[2].row.is_baseline and not t[2].row.feasible],
    }
    symbols = {"baseline": "diamond", "speculative": "circle", "breaks SLO": "x"}
    for name, pts in groups.items():
        if not pts:
            continue
        fig.add_trace(go.Scatter(
            x=[t[0] for t in pts], y=[t[1] for t in pts], name=name, mode="markers",
            text=[_hover(t[2]) for t in pts], marker={"size": 10, "symbol": symbols[name]},
            hovertemplate="%{text}<br>%{x:.2f} ms, %{y:.1f} tok/s<extra></extra>",
        ))
    front = _pareto(t for t in measured if t[2].row.feasible)
    if front:
        fig.add_trace(go.Scatter(
            x=[t[0] for t in front], y=[t[1] for t in front], name="Pareto front", mode="lines+markers",
            line={"dash": "dot", "color": "black", "shape": "hv"}, text=[_hover(t[2]) for t in front],
            marker={"size": 16, "symbol": "circle-open", "color": "black"},
            hovertemplate="%{text}<extra>Pareto front</extra>",
        ))
    def axis(name: str) -> str:  # over a load mix an objective is the whole's, any other figure the headline level's
        unit = _UNITS.get(name, name)
        if not view.is_mix():
            return unit
        return f"{unit}, {'over the load mix' if name in view.objectives else 'at the headline level'}"

    return _layout(fig, "Throughput against latency", axis(latency), axis("output_throughput"))


def fig_predicted_vs_measured(view: StudyView) -> Figure | None:
    """Predicted against measured value per objective, for trials that carry a
    ``predicted_<objective>`` user attribute, with the line y = x; None when no trial does."""
    go = _go()
    fig = go.Figure()
    lo, hi = math.inf, -math.inf
    for objective in view.objectives:
        pairs = [(float(pred), meas, p) for p in points(view)
                 if p.rec.predicted_objective == objective and (pred := p.rec.predicted) is not None
                 and (meas := p.metric(view, objective)) is not None]
        if not pairs:
            continue
        lo = min(lo, *(min(a, b) for a, b, _ in pairs))
        hi = max(hi, *(max(a, b) for a, b, _ in pairs))
        fig.add_trace(go.Scatter(
            x=[a for a, _, _ in pairs], y=[b for _, b, _ in pairs], name=objective, mode="markers",
            text=[_hover(p) for _, _, p in pairs], marker={"size": 9},
            hovertemplate="%{text}<br>predicted %{x:.4g}, measured %{y:.4g}<extra></extra>",
        ))
    if not fig.data:
        return None
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], name="y = x", mode="lines",
                             line={"dash": "dash", "color": "gray"}, hoverinfo="skip"))
    return _layout(fig, "Predicted against measured", "predicted", "measured")


def figures(view: StudyView) -> dict[str, Figure]:
    """Every figure that applies to the study, by the keys of :data:`FIGURE_IDS`."""
    out: dict[str, Figure] = {
        "speedup_vs_k": fig_speedup_vs_k(view),
        "acceptance_per_position": fig_acceptance_per_position(view),
        "throughput_vs_latency": fig_throughput_vs_latency(view),
    }
    predicted = fig_predicted_vs_measured(view)
    if predicted is not None:
        out["predicted_vs_measured"] = predicted
    return out


