"""A study's inputs to its predictions (:class:`StudyInputs`): its unmeasured candidates, baseline,
measured trials and engine spread, predicted together and scored leave-one-out."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from spectune.config import SpecConfig
from spectune.errors import ConfigError
from spectune.measurement import spec_key
from spectune.predict._concurrency import ConcurrencyModel, LevelPrediction, fit_concurrency
from spectune.predict._cost import Estimate
from spectune.predict._draft_replay import DraftReplays
from spectune.predict._errors import PredictionErrors, summarize_errors
from spectune.predict._learned import LearnedAcceptance
from spectune.predict._measured import mean_over_engines
from spectune.predict._prediction import Prediction
from spectune.predict._rank import measured_prediction, predict_candidates

if TYPE_CHECKING:
    from spectune.measurement import Measurement

__all__ = ["StudyInputs"]


@dataclass(frozen=True)
class StudyInputs:
    """What predictions of a study rest on: its unmeasured candidates, baseline and measured trials."""

    candidates: list[SpecConfig]
    baseline: Measurement
    measured: list[Measurement]
    objective: str
    maximize: bool
    features: dict[str, float]
    learned: LearnedAcceptance | None
    drafts: DraftReplays = field(default_factory=DraftReplays)
    """The draft models' offline runs, kept by whoever predicts again and again (guided search)."""
    engine_spread: float | None = None
    """How much the study's engine starts of one configuration differ (None: none measured twice)."""

    def predict(self, candidates: Sequence[SpecConfig] | None = None) -> list[Prediction]:
        """Predictions of ``candidates`` (default: every unmeasured one), best first; over a load
        mix, of the mix (:meth:`over_mix`)."""
        return self.over_mix(predict_candidates(
            self.candidates if candidates is None else candidates, self.baseline, self.measured,
            objective=self.objective, maximize=self.maximize, learned=self.learned, features=self.features,
            drafts=self.drafts, engine_spread=self.engine_spread))

    def over_mix(self, predictions: Sequence[Prediction], model: ConcurrencyModel | None = None) -> list[Prediction]:
        """``predictions`` (made at the headline concurrency) with their value over the study's load
        mix (:attr:`~spectune.config.WorkloadSpec.is_mix`), best first: moved to each level
        (:class:`ConcurrencyModel`), each level's ratio to the baseline's there applied to the
        baseline's measured value at that level, weighted as :meth:`Objective.of` weights the
        measured ones. Throughput moves with the throughput, TPOT with the TPOT, the other
        latencies keep their headline ratio. Unchanged when the study is no mix. ``model``: the
        concurrency model to move by (default: fitted on every measured trial)."""
        from spectune.measurement import Objective

        objective = Objective(self.objective)
        base_levels = objective.of_levels(self.baseline) if self.baseline.levels else None
        model = (model or self.concurrency_model()) if base_levels else None
        if base_levels is None or model is None:
            return list(predictions)
        weights = self.baseline.workload.weights()
        head = objective.of_headline(self.baseline)

        def ratios(p: Prediction, k: float) -> tuple[float, float, float]:
            b = model.batches.get(k, k)
            lp = model.predict(p, b)
            if objective is Objective.OUTPUT_THROUGHPUT:
                est, base = lp.output_throughput, model.baseline_throughput(b)
            elif objective.value.startswith("tpot"):
                est, base = lp.tpot_ms, model.t0(b)
            else:
                est, base = p.value, head
            return est.value / base, est.low / base, est.high / base

        out = []
        for p in predictions:
            per_level = {c: ratios(p, c) for c, w in weights.items() if w > 0}
            whole = [math.exp(math.fsum(w * math.log(max(base_levels[c] * per_level[c][i], 1e-300))
                                        for c, w in weights.items() if w > 0)) for i in range(3)]
            out.append(dataclasses.replace(p, value=Estimate(whole[0], min(whole), max(whole))))
        sign = -1.0 if self.maximize else 1.0
        out.sort(key=lambda p: (sign * p.value.value if math.isfinite(p.value.value) else math.inf, p.label))
        return out

    def errors(self) -> PredictionErrors | None:
        """How far predictions miss on this study's own model, workload and machine: each measured
        speculative configuration (its mean over its engines) predicted from the baseline and the
        other configurations' measurements alone, as an unmeasured candidate is, against what it
        measured (leave-one-out); None before any completed. With one measured configuration its
        prediction comes from replay, the learned model or the priors alone."""
        groups: dict[str, list[Measurement]] = {}
        for m in self.measured:
            groups.setdefault(spec_key(m.spec.to_vllm()), []).append(m)
        rows = []
        for key, engines in groups.items():
            others = [m for k, ms in groups.items() if k != key for m in ms]
            truth = measured_prediction(engines, self.objective)
            predicted = self.over_mix(predict_candidates(
                [engines[0].spec], self.baseline, others, objective=self.objective, maximize=self.maximize,
                learned=self.learned, features=self.features, drafts=self.drafts, engine_spread=self.engine_spread),
                model=fit_concurrency(self.baseline, others))  # moved without its own sweep
            if truth is not None and predicted:
                rows.append((engines[0].spec.label(), predicted[0], truth))
        return summarize_errors(self.objective, rows)

    def measured_predictions(self) -> list[Prediction]:
        """The measured configurations as predictions without interval, one per configuration at
        its mean over its engines (:func:`measured_prediction`): what moves to other levels."""
        engines: dict[str, list[Measurement]] = {}
        for m in self.measured:
            engines.setdefault(m.spec.label(), []).append(m)
        return [p for ms in engines.values() if (p := measured_prediction(ms, self.objective)) is not None]

    def concurrency_model(self) -> ConcurrencyModel | None:
        """How the study's trials scale with the batch; None unless its baseline swept two levels
        (``workload.concurrency_levels``, :mod:`spectune.predict._concurrency`)."""
        return fit_concurrency(self.baseline, self.measured)

    def at_concurrency(self, predictions: Sequence[Prediction], levels: Sequence[int],
                       model: ConcurrencyModel | None = None) -> list[list[LevelPrediction]]:
        """Each of ``predictions`` moved to each of ``levels``, requests in flight (by ``model``,
        default: fitted here).

        Raises:
            ConfigError: the study measured one concurrency level only (nothing to scale by), or
                a level below 1.
        """
        model = self._model(model)
        if any(b < 1 for b in levels):
            raise ConfigError(f"concurrency levels must be >= 1, got {list(levels)}")
        by_rate = self.baseline.workload.by_rate  # measured levels are rates: none is a concurrency
        return [[(None if by_rate else self._measured_at(p, b)) or model.predict(p, b) for b in levels]
                for p in predictions]

    def at_levels(self, predictions: Sequence[Prediction],
                  model: ConcurrencyModel | None = None) -> list[list[LevelPrediction]]:
        """Each of ``predictions`` at each level of the study's own sweep (a concurrency, or a
        request rate at the batch its baseline ran there): measured where it was, else moved.

        Raises:
            ConfigError: the study measured one level only (nothing to scale by).
        """
        model = self._model(model)
        workload = self.baseline.workload
        return [[self._measured_at(p, k, workload.level_name(k, short=True))
                 or model.predict(p, model.batches.get(k, k), workload.level_name(k, short=True))
                 for k in workload.levels] for p in predictions]

    def _model(self, model: ConcurrencyModel | None) -> ConcurrencyModel:
        model = model or self.concurrency_model()
        if model is None:
            raise ConfigError(
                f"the baseline was measured at {self.baseline.workload.level_name(self.baseline.headline)} "
                "only: predictions at other levels need a sweep (workload.concurrency_levels or request_rate_levels, "
                "two levels at least)")
        return model

    def _measured_at(self, p: Prediction, key: float, name: str | None = None) -> LevelPrediction | None:
        """A measured configuration at a level its sweep measured (by the level's key): its mean
        over its engines there."""
        if p.source != "measured":
            return None
        engines = [m for m in self.measured if m.spec.label() == p.label]
        level = mean_over_engines(engines).level_at(key) if engines else None
        if level is None or not level.tpot_median_ms:
            return None
        t, thr = level.tpot_median_ms, level.output_throughput
        return LevelPrediction(level.batch, Estimate(t, t, t), Estimate(thr, thr, thr), "measured", name)
