"""A prediction of one candidate: what ranking, guided search and concurrency moves pass around."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from spectune.config import SpecConfig
from spectune.predict._cost import Estimate

__all__ = ["Prediction"]


@dataclass(frozen=True)
class Prediction:
    """What one unmeasured candidate is predicted to do, with intervals and their sources.

    ``value`` is the study's first objective; ``source`` says where acceptance comes from
    (replay, truncation, extrapolation, prior) and ``cost_source`` where a step's cost does (fit,
    fit-method, fit-model-free, step-cost: the baseline's step-cost curve, prior).
    """

    label: str
    spec: SpecConfig
    source: str
    acceptance_rate: float
    mean_acceptance_length: float
    tokens_per_step: Estimate
    tpot_ms: Estimate
    output_throughput: Estimate
    objective: str
    value: Estimate
    cost_source: str
    note: str = ""

    def record(self) -> dict[str, Any]:
        """Everything this prediction says, as JSON-ready data (``spectune predict --json``)."""
        out = dataclasses.asdict(self)
        out["spec"] = self.spec.model_dump(mode="json", exclude_none=True)
        return out
