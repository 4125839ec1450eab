"""Predictions as a rich table (rendered by the CLI)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.table import Table

    from spectune.predict._concurrency import LevelPrediction
    from spectune.predict._cost import Estimate
    from spectune.predict._prediction import Prediction

__all__ = ["levels_table", "predictions_table"]


def _interval(e: Estimate, fmt: str = ".4g") -> str:
    if e.low == e.high == e.value:
        return f"{e.value:{fmt}}"
    return f"{e.value:{fmt}} [{e.low:{fmt}}, {e.high:{fmt}}]"


def predictions_table(predictions: Sequence[Prediction], *, title: str = "predicted, not measured") -> Table:
    """One row per prediction, in the given order: objective, TPOT and throughput with intervals."""
    from rich.markup import escape
    from rich.table import Table

    objective = predictions[0].objective if predictions else "output_throughput"
    # TPOT and throughput have their own columns; another objective gets one too
    own = objective not in ("output_throughput", "tpot_median_ms")
    t = Table(title=escape(title))
    for col in ("#", "config", *([objective] if own else []), "tpot ms", "throughput tok/s", "acceptance",
                "accept len", "tokens/step", "source", "cost", "note"):
        t.add_column(col, overflow="fold")
    for i, p in enumerate(predictions, 1):
        t.add_row(str(i), escape(p.label), *([_interval(p.value)] if own else []), _interval(p.tpot_ms),
                  _interval(p.output_throughput), f"{p.acceptance_rate:.3f}", f"{p.mean_acceptance_length:.2f}",
                  _interval(p.tokens_per_step, ".3f"), p.source, p.cost_source, escape(p.note))
    return t


def levels_table(predictions: Sequence[Prediction], levels: Sequence[Sequence[LevelPrediction]], *,
                 title: str) -> Table:
    """One row per prediction, one column per concurrency level: output throughput and TPOT."""
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=escape(title))
    t.add_column("#")
    t.add_column("config", overflow="fold")
    for lp in levels[0] if levels else ():
        t.add_column(f"c={lp.concurrency} tok/s", overflow="fold")
        t.add_column(f"c={lp.concurrency} tpot ms", overflow="fold")
    t.add_column("from")
    t.add_column("scaling")
    for i, (p, row) in enumerate(zip(predictions, levels, strict=True), 1):
        cells = [c for lp in row for c in (_interval(lp.output_throughput), _interval(lp.tpot_ms))]
        t.add_row(str(i), escape(p.label), *cells, p.source, row[0].scale_source if row else "")
    return t
