"""How far a study's predictions can be trusted: each measured configuration predicted from the
others (leave-one-out), against what it measured."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spectune.predict._prediction import Prediction

__all__ = ["FigureError", "PredictionErrors", "summarize_errors"]

FIGURES = ("value", "tpot_ms", "mean_acceptance_length")
"""The predicted figures whose error is measured: the study's objective, TPOT, acceptance length."""


@dataclass(frozen=True)
class FigureError:
    """The relative error of one predicted figure over a study's measured configurations."""

    median: float
    max: float
    n: int
    """Measured configurations it rests on."""


@dataclass(frozen=True)
class PredictionErrors:
    """Leave-one-out errors of a study's predictions, figure by figure (``value`` is the
    study's objective), with the configurations they rest on."""

    objective: str
    figures: dict[str, FigureError]
    configs: list[dict[str, object]]
    """Each measured configuration: its label, what it measured and what the others predicted."""

    def record(self) -> dict[str, object]:
        """As JSON-ready data: the study's ``guide`` attribute keeps it, ``predict --json`` prints it."""
        return {"objective": self.objective, "line": self.line(), "configs": self.configs,
                "figures": {k: {"median": e.median, "max": e.max, "n": e.n} for k, e in self.figures.items()}}

    def line(self) -> str:
        """One sentence for the tables and the report."""
        names = {"value": self.objective, "tpot_ms": "TPOT", "mean_acceptance_length": "acceptance length"}
        n = max((e.n for e in self.figures.values()), default=0)
        parts = [f"{names[k]} off by {e.median:.1%} in the median (at most {e.max:.1%})"
                 for k, e in self.figures.items() if k != "tpot_ms" or self.objective != "tpot_median_ms"]
        return (f"leave-one-out on this study's {n} measured configuration{'s' if n != 1 else ''}, each predicted "
                f"from the others: " + ", ".join(parts))


def summarize_errors(objective: str, rows: Sequence[tuple[str, Prediction, Prediction]]) -> PredictionErrors | None:
    """The errors of ``rows``: each measured configuration's label, its prediction from the other
    configurations, and what it measured (as a prediction without interval); None without rows."""
    if not rows:
        return None
    figures = {name: _error([_relative(p, t, name) for _, p, t in rows]) for name in FIGURES}
    configs = [{"config": label, "source": p.source, "measured": t.value.value, "predicted": p.value.value,
                "measured_acceptance_length": t.mean_acceptance_length,
                "predicted_acceptance_length": p.mean_acceptance_length} for label, p, t in rows]
    return PredictionErrors(objective, figures, configs)


def _relative(predicted: Prediction, truth: Prediction, figure: str) -> float:
    def get(p: Prediction) -> float:
        x = getattr(p, figure)
        return float(x if isinstance(x, int | float) else x.value)

    return abs(get(predicted) / get(truth) - 1.0) if get(truth) else float("inf")


def _error(errors: Sequence[float]) -> FigureError:
    return FigureError(statistics.median(errors), max(errors), len(errors))
