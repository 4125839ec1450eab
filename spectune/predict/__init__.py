"""Modelling: acceptance arithmetic, offline replay, a cost model, and the ranking of candidates.

Pure functions over measurements: no engine and no storage here (reading a study's inputs is
:meth:`spectune.results.StudyView.prediction_inputs`). Acceptance depends on the target, the
proposer, the workload and the sampling, not on the hardware; for model-free proposers it is
replayed exactly from the baseline's recorded outputs, and for a draft model from one forward pass
of the draft along them. Cost depends on the hardware and is
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
from spectune.predict._concurrency import (
    ConcurrencyModel,
    LevelPrediction,
    StepTime,
    fit_concurrency,
    fit_step_time,
)
from spectune.predict._cost import (
    COST_PRIORS,
    PRIOR_ENGINE_SPREAD,
    PRIOR_OVERHEAD_HIGH,
    CostModel,
    Estimate,
    ProposerCost,
    fit_cost,
    fit_cost_model,
    gauge_weight,
)
from spectune.predict._curve import CURVE_NOISE, StepCurve
from spectune.predict._draft_replay import (
    DRAFT_REPLAY_SPREAD,
    HEAD_REPLAY_DEPTH,
    DraftGuesses,
    DraftReplays,
    HeadChains,
    draft_guesses,
    head_chains,
    replay_draft,
    replay_head,
    warm_replays,
)
from spectune.predict._errors import FigureError, PredictionErrors
from spectune.predict._gauge import (
    CostPoint,
    at_typical_speed,
    engine_gauge_ms,
    engine_prefill_ms,
    engine_speeds,
)
from spectune.predict._guide import (
    DEFAULT_MARGIN,
    DEFAULT_STOP_CHANCE,
    GuidePlan,
    chance_to_beat,
    chance_to_beat_all,
    could_beat,
    plan_next,
    prediction_sd,
    surprising,
)
from spectune.predict._inputs import StudyInputs
from spectune.predict._learned import LearnedAcceptance, TrainingTrial
from spectune.predict._measured import (
    effective_k,
    mean_over_engines,
    measured_profile,
    proposer_of,
)
from spectune.predict._prediction import Prediction
from spectune.predict._rank import (
    PRIOR_ALPHA,
    measured_prediction,
    predict_candidates,
)
from spectune.predict._replay import (
    ReplayAcceptance,
    ReplayRequest,
    ngram_proposal,
    replay_ngram,
    replay_suffix,
    suffix_available,
)
from spectune.predict._schedule import BatchSchedule, batch_cost, derive_schedule

__all__ = [
    "FigureError",
    "PredictionErrors",
    "COST_PRIORS",
    "PRIOR_ENGINE_SPREAD",
    "PRIOR_OVERHEAD_HIGH",
    "DEFAULT_MARGIN",
    "DEFAULT_STOP_CHANCE",
    "DRAFT_REPLAY_SPREAD",
    "PRIOR_ALPHA",
    "AcceptanceProfile",
    "BatchSchedule",
    "ConcurrencyModel",
    "CURVE_NOISE",
    "CostModel",
    "CostPoint",
    "DraftGuesses",
    "DraftReplays",
    "HEAD_REPLAY_DEPTH",
    "HeadChains",
    "Estimate",
    "GuidePlan",
    "LearnedAcceptance",
    "LevelPrediction",
    "Prediction",
    "ProposerCost",
    "StepCurve",
    "ReplayAcceptance",
    "ReplayRequest",
    "StepTime",
    "StudyInputs",
    "TrainingTrial",
    "acceptance_rate_at",
    "at_typical_speed",
    "batch_cost",
    "conditional_acceptance",
    "chance_to_beat",
    "chance_to_beat_all",
    "could_beat",
    "derive_schedule",
    "draft_guesses",
    "head_chains",
    "warm_replays",
    "ngram_proposal",
    "effective_k",
    "engine_gauge_ms",
    "engine_prefill_ms",
    "engine_speeds",
    "expected_tokens_per_step",
    "fit_concurrency",
    "fit_cost",
    "fit_cost_model",
    "fit_step_time",
    "gauge_weight",
    "leviathan_expected_tokens",
    "leviathan_improvement",
    "mean_over_engines",
    "measured_prediction",
    "measured_profile",
    "plan_next",
    "predict_candidates",
    "prediction_sd",
    "proposer_of",
    "replay_draft",
    "replay_head",
    "replay_ngram",
    "replay_suffix",
    "suffix_available",
    "surprising",
]
