"""Modelling: acceptance arithmetic, offline replay, a cost model, and the ranking of candidates.

Pure functions over stored measurements: no engine here. Acceptance depends on the target, the
proposer, the workload and the sampling, not on the hardware; for model-free proposers it is
replayed exactly from the baseline's recorded outputs. Cost depends on the hardware and is
fitted on the study's measured trials. Together they predict candidates never run.
"""

from spectune.predict._acceptance import (
    AcceptanceProfile,
    acceptance_rate_at,
    conditional_acceptance,
    expected_tokens_per_step,
    leviathan_expected_tokens,
    leviathan_improvement,
)
from spectune.predict._cost import (
    COST_PRIORS,
    CostModel,
    CostPoint,
    Estimate,
    ProposerCost,
    fit_cost,
    fit_cost_model,
)
from spectune.predict._rank import PRIOR_ALPHA, Prediction, predict_candidates, predict_study
from spectune.predict._replay import ReplayAcceptance, ReplayRequest, replay_ngram, replay_suffix, suffix_available
from spectune.predict._table import predictions_table

__all__ = [
    "COST_PRIORS",
    "PRIOR_ALPHA",
    "AcceptanceProfile",
    "CostModel",
    "CostPoint",
    "Estimate",
    "Prediction",
    "ProposerCost",
    "ReplayAcceptance",
    "ReplayRequest",
    "acceptance_rate_at",
    "conditional_acceptance",
    "expected_tokens_per_step",
    "fit_cost",
    "fit_cost_model",
    "leviathan_expected_tokens",
    "leviathan_improvement",
    "predict_candidates",
    "predict_study",
    "predictions_table",
    "replay_ngram",
    "replay_suffix",
    "suffix_available",
]
