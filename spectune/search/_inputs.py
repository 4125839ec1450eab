"""What guided search and ``spectune predict`` predict from: a study's candidates, baseline and
measured trials read from the storage, and every other study's trials to learn acceptance from.
The predictions themselves are :mod:`spectune.predict`'s pure functions."""

from __future__ import annotations

from typing import TYPE_CHECKING

from spectune._util import validate
from spectune.errors import ConfigError
from spectune.measurement import spec_key
from spectune.predict import (
    DraftReplays,
    LearnedAcceptance,
    StudyInputs,
    TrainingTrial,
    mean_over_engines,
)
from spectune.records import StudyRecord, not_the_candidates
from spectune.results import StudyView
from spectune.space import SearchSpace, load_space
from spectune.storage import MeasurementStore, open_optuna_storage
from spectune.workloads import WorkloadFeatures

if TYPE_CHECKING:
    from spectune.predict import Prediction

__all__ = ["measured_trials", "predict_study", "study_inputs", "study_space"]


def study_space(view: StudyView) -> SearchSpace:
    """The space stored with the study (``spectune_config``), with the ranges guided search
    widened past their edges (:attr:`StudyRecord.extensions`, :meth:`SearchSpace.extended`).

    Raises:
        ConfigError: the study was not made by spectune, or its space cannot be loaded.
    """
    record = StudyRecord.of(view.study)
    cfg = record.spectune_config
    if not isinstance(cfg, dict) or "space" not in cfg or "target" not in cfg:
        raise ConfigError(f"study {view.name} carries no spectune configuration to read its space from")
    definition = view.store.definition(view.name)  # a worker elsewhere may not have the space's file
    space = (validate(SearchSpace, definition["space"], f"study {view.name}") if definition is not None
             else load_space(cfg["space"]).resolve(cfg["target"], draft=cfg.get("draft")))
    return space.extended(record.extensions or [])


def study_inputs(view: StudyView, *, confirmations: bool = True, drafts: DraftReplays | None = None,
                 space: SearchSpace | None = None) -> StudyInputs:
    """The unmeasured candidates of the study's space, its baseline (its mean over the engines
    that measured it, :func:`spectune.predict.mean_over_engines`: predictions move from the figures the choice
    compares with) and its measured trials.

    The space is :func:`study_space` unless ``space`` is given; a candidate counts as
    measured when a trial completed it or its engine failed on it (a trial interrupted, or
    abandoned by a dead worker, does not count). ``confirmations=False``: the measured
    trials without ``confirm``'s (:meth:`StudyView.measured_rows`), as guided search plans on them.
    ``drafts``: the draft models' offline runs kept between calls (guided search keeps one).
    Its engine spread is :meth:`StudyView.spread` over the same trials (the platform's prior
    where nothing was measured twice).

    Raises:
        ConfigError: the study was not made by spectune, has no completed baseline, or its
            space cannot be loaded.
        StorageError: the storage cannot be read.
    """
    record = StudyRecord.of(view.study)
    space = space if space is not None else study_space(view)
    done = {spec_key(r.spec) for r in view.rows  # at any engine knobs: the models predict the spec
            if r.state == "COMPLETE" or (r.state == "FAIL" and r.fail_reason is not None
                                                 and not not_the_candidates(r.fail_reason))}
    base_row = view.baseline()
    if base_row is None:
        raise ConfigError(f"study {view.name} has no completed baseline trial to predict from")
    first = view.store.measurement(base_row.trial_id)
    if first is None:
        raise ConfigError(f"study {view.name}: the baseline trial {base_row.number} has no stored measurement")
    again = [m for r in view.measured_rows(confirmations=confirmations)
             if r.is_baseline and r.number != base_row.number and (m := view.store.measurement(r.trial_id))]
    baseline = mean_over_engines([first, *again])
    measured = view.speculative_measurements(confirmations=confirmations)
    candidates = [s for s in space.enumerate() if not s.is_baseline and spec_key(s.to_vllm()) not in done]
    raw = record.workload_features
    features = WorkloadFeatures.model_validate(raw).flat() if raw else {}
    others = measured_trials(view.url, skip_study=view.name)  # this study's are loaded above
    learned = LearnedAcceptance.fit(others + [TrainingTrial(m, features) for m in measured])
    return StudyInputs(candidates, baseline, measured, view.objectives[0], view.maximize,
                       features, learned, drafts if drafts is not None else DraftReplays(),
                       view.spread(confirmations=confirmations).value)


def predict_study(view: StudyView) -> list[Prediction]:
    """Predict every candidate of the study's space not measured yet, best first by its first
    objective (:func:`spectune.predict.predict_candidates`).

    Raises:
        ConfigError: as :func:`study_inputs`.
        StorageError: the storage cannot be read.
    """
    return study_inputs(view).predict()


def measured_trials(url: str, *, skip_study: str | None = None) -> list[TrainingTrial]:
    """Every measured speculative trial of every study in the storage at ``url`` (but
    ``skip_study``), with its study's workload features: the training data of
    :class:`spectune.predict.LearnedAcceptance`.

    Raises:
        StorageError: the storage cannot be read.
    """
    import optuna

    rdb = open_optuna_storage(url)
    store = MeasurementStore(url)
    out: list[TrainingTrial] = []
    for summary in optuna.get_all_study_summaries(rdb, include_best_trial=False):
        if summary.study_name == skip_study:
            continue
        raw = StudyRecord.of(summary).workload_features
        try:
            features = WorkloadFeatures.model_validate(raw).flat() if raw else {}
        except ValueError:
            features = {}
        for t in store.trials(summary.study_name):
            m = t.measurement()
            if m is not None and not m.spec.is_baseline:
                out.append(TrainingTrial(m, features))
    return out
