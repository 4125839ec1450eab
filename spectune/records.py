"""The trial record: everything spectune keeps about one trial in Optuna's storage, typed and
versioned; read and written here only (:class:`TrialRecord`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from spectune._util import StrictModel

__all__ = [
    "HANDED_BACK",
    "INTERRUPTED",
    "KNOBS_BY_SAMPLER",
    "RECHECK_BASELINE",
    "RECHECK_BEST",
    "RECHECK_CONTENDER",
    "RECHECK_SPREAD",
    "RECHECK_SURPRISE",
    "RECORD_VERSION",
    "Placement",
    "StudyRecord",
    "TrialRecord",
    "handed_back",
    "not_the_candidates",
    "write_fields",
    "write_study_fields",
]


RECORD_VERSION = 1
"""Version of :class:`TrialRecord`'s layout in a trial's user attributes."""

INTERRUPTED = "interrupted"
"""``fail_reason`` of a trial stopped by Ctrl-C: measured again, not counted as finished."""

HANDED_BACK = "handed back"
"""Start of the ``fail_reason`` of a trial whose engine failed for a reason of its slot, not of
its candidate (``handed back (devices): ...``): measured again, not counted as finished."""


def handed_back(cause: str, reason: str) -> str:
    """The ``fail_reason`` of a trial handed back for its slot's fault ``cause``."""
    return f"{HANDED_BACK} ({cause}): {reason}"


def not_the_candidates(fail_reason: str | None) -> bool:
    """Whether a trial that failed with ``fail_reason`` says nothing about its candidate:
    interrupted, or handed back for its slot's fault (both are measured again)."""
    return fail_reason is not None and (fail_reason == INTERRUPTED or fail_reason.startswith(f"{HANDED_BACK} ("))

RECHECK_SURPRISE = "outside its predicted interval"
"""Why guided search measured a configuration again: its measurement fell outside its prediction."""
RECHECK_BEST = "the best when the search would stop"
"""Why guided search measured a configuration again: the best, before the search stops."""
RECHECK_BASELINE = "the baseline, the best gain within the band"
"""Why guided search measured the baseline again: the best speculative configuration's gain lay
within the paired band (:func:`spectune.results.paired_band`), the baseline tried on fewer engines
than :data:`spectune.search._rechecks.SETTLE_STARTS` (the best then once more too, as a rival)."""
RECHECK_SPREAD = "the baseline, no engine spread known on this machine"
"""Why guided search measured the baseline again before its first pick: no configuration was
measured on two engines on this machine yet (:meth:`spectune.results.StudyView.spread` on its
prior alone), and the band and stopping rule rest on that spread."""
RECHECK_CONTENDER = "a rival when the search would stop"
"""Why guided search measured a configuration again: measured on one engine, it still had more
than the stopping rule's chance of beating the pick by more than the tolerance."""

KNOBS_BY_SAMPLER = "engine knobs"
"""``guide_reason`` of a trial guided search asked for to try the engine knobs: its speculative
configuration from the models, the knobs from Optuna's sampler (spectune has no model of them)."""

_PREDICTION_KEYS = ("predicted_low", "predicted_high", "predicted_acceptance_length")


class Placement(StrictModel):
    """Where a trial ran: its worker's host and process, and the GPUs its engine was given."""

    host: str
    gpus: str | None = None
    pid: int | None = None

    def label(self) -> str:
        return f"{self.host} gpus {self.gpus}" if self.gpus else self.host


class TrialRecord(BaseModel):
    """Everything spectune keeps about one trial in Optuna's storage, as the trial's user
    attributes (one attribute per field, readable in optuna-dashboard); the full Measurement is
    in spectune's own table. Read with :meth:`of`, written with :meth:`write`: no other code
    reads or writes a trial's attributes by name.

    Fields that are None are not written. ``predicted`` is stored under ``predicted_<objective>``.
    Records of earlier versions are read too (``recheck`` was True for a surprise).
    """

    model_config = {"extra": "ignore"}

    record_version: int | None = None
    # the candidate, and where it ran
    config: str | None = Field(default=None, description="The candidate's label.")
    spec: dict[str, Any] | None = Field(default=None, description="vLLM's speculative config ({'method': 'none'}).")
    spec_key: str | None = Field(default=None, description="The candidate's key: its speculative configuration "
                                 "and engine knobs (spectune.measurement.candidate_key).")
    engine: dict[str, Any] | None = Field(default=None, description="The values of the engine knobs the space tunes.")
    role: str | None = Field(default=None, description="'baseline' for the study's baseline trial.")
    placement: Placement | None = None
    # why it ran
    retry_of: int | None = Field(default=None, description="The interrupted trial this one measures again.")
    confirms: int | None = Field(default=None, description="The trial whose configuration this one measures again.")
    recheck: str | None = Field(default=None, description="Why guided search measured it again (RECHECK_*).")
    duplicate_of: int | None = Field(default=None, description="An earlier trial of the same candidate it reuses.")
    imported: str | None = Field(default=None, description="The result file (vllm bench serve) it was imported "
                                 "from: measured elsewhere, not by spectune (spectune import).")
    # guided search's prediction, before it ran
    predicted_objective: str | None = None
    predicted: float | None = None
    predicted_low: float | None = None
    predicted_high: float | None = None
    predicted_acceptance_length: float | None = None
    prediction_source: str | None = None
    guide_reason: str | None = None
    guide_step: int | None = None
    # how it ended
    fail_reason: str | None = None
    output_throughput: float | None = None
    tpot_median_ms: float | None = None
    ttft_p99_ms: float | None = None
    e2el_median_ms: float | None = None
    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    per_position_acceptance: list[float] | None = None
    startup_seconds: float | None = None
    failed_requests: int | None = None
    peak_memory_bytes: int | None = None
    memory_kind: str | None = Field(default=None, description="gpu_weights (the engine's weights, target and draft), "
                                       "gpu_device (its devices' memory) or host_rss: what peak_memory_bytes measures.")
    kv_cache_tokens: int | None = None
    step_cost: list[dict[str, float]] | None = Field(default=None, description="A baseline's step-cost curve: "
                                                     "{batch, new_tokens, tokens, ms} per point (spectune.stepcost).")
    step_cost_seconds: float | None = Field(default=None, description="Engine time its step-cost curve took.")
    bursty_delivery: bool | None = Field(default=None, description="Its tokens reached the client in bursts "
                                         "(Measurement.bursty_delivery): its client latencies are the delivery's.")
    level_values: dict[str, float] | None = Field(default=None, description="A load mix: the first objective at "
                                                  "each concurrency level (its value is their weighted whole).")
    fidelity: dict[str, Any] | None = Field(default=None, description="Its answers against the baseline's at "
                                            "temperature 0 (spectune.answers.Fidelity).")
    speedup: float | None = None
    noise: float | None = None
    constraints: dict[str, float] | None = None
    feasible: bool | None = None

    @classmethod
    def of(cls, trial: Any) -> TrialRecord:
        """The record of an Optuna trial (a FrozenTrial, or a running Trial)."""
        return cls.from_attrs(trial.user_attrs)

    @classmethod
    def from_attrs(cls, attrs: dict[str, Any]) -> TrialRecord:
        data = dict(attrs)
        if data.get("recheck") is True:  # spectune before records had versions
            data["recheck"] = RECHECK_SURPRISE
        elif data.get("recheck") is False:
            data["recheck"] = None
        for key in list(data):
            if key.startswith("predicted_") and key not in _PREDICTION_KEYS and key != "predicted_objective":
                data["predicted_objective"], data["predicted"] = key.removeprefix("predicted_"), data.pop(key)
        return cls.model_validate(data)

    def attrs(self) -> dict[str, Any]:
        """The fields that are set, as user attributes."""
        out = self.model_dump(mode="json", exclude_none=True, exclude={"predicted_objective", "predicted"})
        if self.predicted_objective is not None and self.predicted is not None:
            out[f"predicted_{self.predicted_objective}"] = self.predicted
        return out

    def write(self, trial: Any) -> None:
        """Set this record's fields (those not None) on an Optuna trial."""
        for key, value in self.attrs().items():
            trial.set_user_attr(key, value)

    # -- what the search reads ---------------------------------------------------------------
    @property
    def is_baseline(self) -> bool:
        return self.role == "baseline"

    @property
    def guided(self) -> bool:
        """Chosen by guided search's models, with a prediction."""
        return self.guide_reason is not None and self.guide_reason != KNOBS_BY_SAMPLER

    @property
    def measured_again(self) -> bool:
        """A re-measurement (a recheck or a confirmation): it spends no budget."""
        return self.confirms is not None

    @property
    def interrupted(self) -> bool:
        """Stopped by Ctrl-C, or handed back for its slot's fault: measured again, not counted."""
        return not_the_candidates(self.fail_reason)

    def guide(self) -> TrialRecord:
        """Its prediction alone (a guided pick measured again keeps it)."""
        return TrialRecord(**{k: getattr(self, k) for k in (
            "predicted_objective", "predicted", *_PREDICTION_KEYS, "prediction_source", "guide_reason", "guide_step")})


def write_fields(trial: Any, **fields: Any) -> None:
    """Set some fields of a trial's :class:`TrialRecord` (validated as the record's)."""
    TrialRecord(**fields).write(trial)


class StudyRecord(BaseModel):
    """Everything spectune keeps on an Optuna study as its user attributes (the dashboard shows
    them); read with :meth:`of`, written with :meth:`write`, nowhere else by name. What a worker
    needs to join a study (its prompts, its resolved space) is in spectune's own table instead
    (:meth:`spectune.storage.MeasurementStore.definition`)."""

    model_config = {"extra": "ignore"}

    spectune_config: dict[str, Any] | None = Field(default=None, description="The StudyConfig as created or resumed.")
    engine_args: dict[str, Any] | None = Field(default=None, description="The resolved engine arguments of every trial.")
    objectives: list[str] | None = None
    workload_features: dict[str, Any] | None = Field(
        default=None, description="The prompts' features, with the baseline's outputs once it ran.")
    guide: dict[str, Any] | None = Field(default=None, description="Guided search's last plan: what it skipped, and why.")
    stopped: str | None = Field(default=None, description="Why the search ended before it had measured what it "
                                "would (the time budget), while it did.")
    extensions: list[dict[str, Any]] | None = Field(
        default=None, description="The ranges guided search widened past an edge where its pick sat, in order: "
        "param (method.field), range (the range after), was (before), because (the configuration at the edge).")
    gpu_model: str | None = Field(
        default=None, description="The model of the GPUs the study measures on (nvidia-smi's name); set by the "
        "first worker on GPUs, the same for every worker after it unless it shares with --mixed-gpus.")
    gpus_per_engine: int | None = Field(
        default=None, description="GPUs each engine of the study is given (0: placed by its environment); set by the "
        "first worker, the same for every worker after it.")

    @classmethod
    def of(cls, study: Any) -> StudyRecord:
        """The record of an Optuna study (or a study summary)."""
        return cls.model_validate(study.user_attrs)

    @property
    def made_by_spectune(self) -> bool:
        return self.spectune_config is not None or self.objectives is not None

    def write(self, study: Any) -> None:
        """Set this record's fields (those not None) on an Optuna study."""
        for key, value in self.model_dump(mode="json", exclude_none=True).items():
            study.set_user_attr(key, value)


def write_study_fields(study: Any, **fields: Any) -> None:
    """Set some fields of a study's :class:`StudyRecord` (validated as the record's)."""
    StudyRecord(**fields).write(study)
