"""A learned acceptance model: per-position acceptance from proposer, k, sampling and workload.

Truncation and replay are exact where they apply; for a proposer the study has not measured
(a draft or head on a new workload, an n-gram setting without recorded token ids) this model
generalises from every measured trial in the storage, across studies. A scikit-learn random
forest predicts the conditional acceptance of draft position ``i`` (``P(i accepted | 1..i-1
accepted)``, bounded in [0, 1]) from:

- the method (one-hot) and the draft or head model (one-hot over the models seen; others zero);
- ``k``, the position ``i`` and ``i / k``; n-gram ``prompt_lookup_min/max``; suffix decoding's
  tree depth, spec factor and minimum token probability;
- the temperature and the study's workload features
  (:meth:`spectune.workloads.WorkloadFeatures.flat`, e.g. the share of output n-grams already
  in the prompt; missing values as -1).

The profile is the cumulative product of the conditional acceptances; its uncertainty is the
spread of the forest's trees (10th to 90th percentile of the tokens per step each tree implies).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from spectune.config import Method, SpecConfig
from spectune.measurement import spec_key
from spectune.predict._acceptance import AcceptanceProfile, conditional_acceptance
from spectune.predict._cost import Estimate
from spectune.predict._measured import (
    effective_k,
    lookup_window,
    measured_profile,
    suffix_params,
)

if TYPE_CHECKING:
    from spectune.measurement import Measurement

__all__ = ["LearnedAcceptance", "TrainingTrial"]


MIN_TRIALS = 3
"""Measured configurations of a method the model needs before it predicts that method (a
configuration measured on several engines counts once: its acceptance does not change; on
another workload or temperature it counts again)."""

_METHODS = [m for m in Method if m is not Method.NONE]
_MISSING = -1.0


@dataclass(frozen=True)
class TrainingTrial:
    """One measured speculative trial and the context it was measured in."""

    measurement: Measurement
    features: Mapping[str, float]


class LearnedAcceptance:
    """Random forest over measured trials (see the module docstring). Build with :meth:`fit`."""

    def __init__(self, forest: object, models: list[str], feature_names: list[str],
                 counts: dict[Method, int]) -> None:
        """``counts``: the distinct configurations of each method the forest learned from."""
        self._forest = forest
        self._models = models
        self._features = feature_names
        self.counts = counts

    @classmethod
    def fit(cls, trials: Sequence[TrainingTrial], *, seed: int = 0) -> LearnedAcceptance | None:
        """The model of ``trials``; None when no method has :data:`MIN_TRIALS` usable configurations."""
        usable = [(t, p) for t in trials if (p := measured_profile(t.measurement)) is not None
                  and p.per_position and not t.measurement.spec.is_baseline]
        configs: dict[Method, set[tuple[object, ...]]] = {}
        for t, _ in usable:  # one configuration on one workload, however many engines measured it
            m = t.measurement
            configs.setdefault(m.spec.method, set()).add(
                (spec_key(m.spec.to_vllm()), m.workload.sampling.temperature, tuple(sorted(t.features.items()))))
        counts = {method: len(keys) for method, keys in configs.items()}
        if not any(n >= MIN_TRIALS for n in counts.values()):
            return None
        from sklearn.ensemble import RandomForestRegressor

        models = sorted({t.measurement.spec.model for t, _ in usable if t.measurement.spec.model})
        names = sorted({k for t, _ in usable for k in t.features})
        xs, ys = [], []
        for t, profile in usable:
            m = t.measurement
            for i, cond in enumerate(conditional_acceptance(profile.per_position), start=1):
                xs.append(_row(m.spec, len(profile.per_position), i, m.workload.sampling.temperature,
                               t.features, models, names))
                ys.append(cond)
        forest = RandomForestRegressor(n_estimators=64, min_samples_leaf=2, random_state=seed)
        forest.fit(xs, ys)
        return cls(forest, models, names, counts)

    def knows(self, method: Method) -> bool:
        return self.counts.get(method, 0) >= MIN_TRIALS

    def predict(self, spec: SpecConfig, *, temperature: float,
                features: Mapping[str, float]) -> tuple[AcceptanceProfile, Estimate]:
        """Per-position acceptance of ``spec`` and its tokens per step with the trees' spread."""
        k = effective_k(spec) or 1
        rows = [_row(spec, k, i, temperature, features, self._models, self._features) for i in range(1, k + 1)]
        mean = self._forest.predict(rows)  # type: ignore[attr-defined]
        profile = AcceptanceProfile(tuple(_cumulative(mean)))
        per_tree = [AcceptanceProfile(tuple(_cumulative(tree.predict(rows)))).tokens_per_step
                    for tree in self._forest.estimators_]  # type: ignore[attr-defined]
        lo, hi = (float(x) for x in np.percentile(per_tree, [10, 90]))
        e = profile.tokens_per_step
        return profile, Estimate(e, min(lo, e), max(hi, e))


def _cumulative(conditional: Sequence[float]) -> list[float]:
    out, p = [], 1.0
    for c in conditional:
        p *= min(max(float(c), 0.0), 1.0)
        out.append(p)
    return out


def _row(spec: SpecConfig, k: int, i: int, temperature: float, features: Mapping[str, float],
         models: list[str], names: list[str]) -> list[float]:
    row = [1.0 if spec.method is m else 0.0 for m in _METHODS]
    row += [1.0 if spec.model == name else 0.0 for name in models]
    row += [float(k), float(i), i / k, float(temperature)]
    lo, hi = lookup_window(spec) if spec.method is Method.NGRAM else (_MISSING, _MISSING)
    row += [float(lo), float(hi)]
    if spec.method is Method.SUFFIX:
        p = suffix_params(spec)
        row += [float(p["suffix_decoding_max_tree_depth"]), float(p["suffix_decoding_max_spec_factor"]),
                float(p["suffix_decoding_min_token_prob"])]
    else:
        row += [_MISSING] * 3
    row += [float(features.get(n, _MISSING)) for n in names]
    return row
