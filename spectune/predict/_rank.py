"""Ranking the candidates of a study that have not been measured, by predicted objective.

Acceptance of each candidate comes from the best source there is, named in
:attr:`Prediction.source`:

- ``replay``: n-gram (and suffix, with arctic_inference installed) candidates, replayed exactly
  over the baseline's recorded token ids (:func:`~spectune.predict.replay_ngram`); draft-model
  candidates whose draft transformers can load, from one forward pass of the draft along the
  same outputs (:func:`~spectune.predict.replay_draft`); EAGLE-3 heads, from the target's hidden
  states along them and the head's chains (:func:`~spectune.predict.replay_head`);
- ``truncation``: the same proposer measured at a larger ``k``: its per-position acceptance cut
  to ``k`` (:func:`~spectune.predict.expected_tokens_per_step`);
- ``extrapolation``: the same proposer measured only at a smaller ``k``: the positions beyond
  continue with the last measured conditional acceptance (interval: from "nothing more
  accepted" to "everything that reached the last position accepted");
- ``learned``: the proposer not measured in this study: the random forest over every trial in
  the storage (:class:`~spectune.predict.LearnedAcceptance`), once it has seen the method;
- ``prior``: nothing measured: Leviathan's constant-alpha formula with :data:`PRIOR_ALPHA`.

Cost from :class:`~spectune.predict.CostModel` (fitted on the study's measured trials).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spectune.config import Method, SpecConfig
from spectune.errors import ConfigError
from spectune.predict._acceptance import AcceptanceProfile, conditional_acceptance
from spectune.predict._cost import Estimate, fit_cost_model
from spectune.predict._curve import StepCurve
from spectune.predict._draft_replay import HEAD_REPLAY_DEPTH, DraftReplays, replay_draft, replay_head
from spectune.predict._gauge import CostPoint
from spectune.predict._learned import LearnedAcceptance
from spectune.predict._measured import (
    accepted_sd,
    effective_k,
    lookup_window,
    mean_over_engines,
    measured_profile,
    proposer_of,
    suffix_params,
)
from spectune.predict._prediction import Prediction
from spectune.predict._replay import (
    ReplayAcceptance,
    replay_ngram,
    replay_suffix,
    suffix_available,
)

if TYPE_CHECKING:
    from spectune.measurement import Measurement

__all__ = ["PRIOR_ALPHA", "Prediction", "measured_prediction", "predict_candidates"]


PRIOR_ALPHA: dict[Method, float] = {
    Method.NGRAM: 0.3,
    Method.SUFFIX: 0.4,
    Method.DRAFT_MODEL: 0.6,
    Method.EAGLE: 0.6,
    Method.EAGLE3: 0.7,
    Method.MTP: 0.7,
    Method.MLP_SPECULATOR: 0.5,
    Method.MEDUSA: 0.5,
}
"""Constant per-token acceptance assumed for a proposer with nothing measured (orders of
magnitude from published chat benchmarks; a placeholder until the study measures it)."""

PRIOR_ALPHA_SPREAD = 0.2
"""A prior alpha is believed within this much either way (clipped to [0, 0.99])."""

_OBJECTIVES = ("output_throughput", "tpot_median_ms", "tpot_p99_ms", "ttft_p99_ms", "e2el_median_ms", "e2el_p99_ms")


def measured_prediction(engines: Sequence[Measurement], objective: str = "output_throughput") -> Prediction | None:
    """A measured speculative configuration as a prediction without interval, at its own
    concurrency (so that it can be moved to others, :meth:`ConcurrencyModel.predict`): its mean
    over ``engines``, the measurements of that one configuration on each engine that ran it
    (:func:`~spectune.predict.mean_over_engines`; acceptance from the first: it does not change
    between engines). None without counters."""
    from spectune.measurement import Objective

    m = mean_over_engines(engines)
    profile = measured_profile(m)
    tpot = m.tpot_ms.median
    if profile is None or tpot is None:
        return None
    e, thr, value = profile.tokens_per_step, m.output_throughput, Objective(objective).of(m)
    return Prediction(label=m.spec.label(), spec=m.spec, source="measured",
                      acceptance_rate=profile.acceptance_rate, mean_acceptance_length=profile.mean_acceptance_length,
                      tokens_per_step=Estimate(e, e, e), tpot_ms=Estimate(tpot, tpot, tpot),
                      output_throughput=Estimate(thr, thr, thr), objective=objective,
                      value=Estimate(value, value, value), cost_source="measured")


# -- acceptance of one candidate --------------------------------------------------------------


@dataclass(frozen=True)
class _Accept:
    source: str
    profile: AcceptanceProfile
    tokens: Estimate
    note: str = ""


_OFFLINE = {Method.DRAFT_MODEL: ", the draft run offline", Method.EAGLE3: ", the head run offline"}


def _replay(spec: SpecConfig, baseline: Measurement, drafts: DraftReplays) -> ReplayAcceptance | None:
    has_ids = any(r.ok and r.token_ids and r.prompt_token_ids is not None for r in baseline.requests)
    if not has_ids:
        return None
    k = effective_k(spec)
    max_len = baseline.engine.max_model_len
    if spec.method is Method.NGRAM and k:
        lo, hi = lookup_window(spec)
        return replay_ngram(baseline.requests, k, lo, hi, max_model_len=max_len)
    if spec.method is Method.SUFFIX and suffix_available():
        p = suffix_params(spec)
        return replay_suffix(
            baseline.requests, k, max_tree_depth=int(p["suffix_decoding_max_tree_depth"]),
            max_cached_requests=int(p["suffix_decoding_max_cached_requests"]),
            max_spec_factor=float(p["suffix_decoding_max_spec_factor"]),
            min_token_prob=float(p["suffix_decoding_min_token_prob"]), max_model_len=max_len,
        )
    if spec.method is Method.DRAFT_MODEL and k and spec.model:
        guesses = drafts.guesses(baseline.requests, spec.model, dtype=baseline.engine.dtype)
        return replay_draft(guesses, k, max_model_len=max_len) if guesses is not None else None
    if spec.method is Method.EAGLE3 and k and spec.model and k <= HEAD_REPLAY_DEPTH:
        chains = drafts.chains(baseline.requests, spec.model, baseline.engine.model, dtype=baseline.engine.dtype)
        return replay_head(chains, k, max_model_len=max_len) if chains is not None else None
    return None


def _from_measured(spec: SpecConfig, k: int, measured: Sequence[Measurement]) -> _Accept | None:
    """Truncation from the same proposer at a larger k, else extrapolation from a smaller one."""
    same = proposer_of(spec)
    found: list[tuple[int, AcceptanceProfile, int]] = []
    for m in measured:
        mk = effective_k(m.spec)
        profile = measured_profile(m)
        if mk is None or profile is None or proposer_of(m.spec) != same or not profile.per_position:
            continue
        found.append((len(profile.per_position), profile, m.acceptance.num_drafts if m.acceptance else 0))
    larger = [f for f in found if f[0] >= k]
    if larger:
        # the smallest measured K that covers k: its steps fall most like the candidate's
        _, profile, drafts = min(larger, key=lambda f: (f[0], -f[2]))
        cut = profile.truncated(k)
        spread = 2.0 * accepted_sd(cut, drafts) * cut.draft_share
        e = cut.tokens_per_step
        return _Accept("truncation", cut, Estimate(e, max(1.0, e - spread), e + spread))
    if found:
        kk, profile, _ = max(found, key=lambda f: (f[0], f[2]))
        pp = list(profile.per_position)
        ratio = conditional_acceptance(pp)[-1]
        tail = [pp[-1] * ratio ** (i + 1) for i in range(k - kk)]
        ext = AcceptanceProfile(tuple(pp + tail), profile.draft_share, None)
        flat = AcceptanceProfile(tuple(pp + [pp[-1]] * (k - kk)), profile.draft_share, None)
        return _Accept("extrapolation", ext, Estimate(ext.tokens_per_step, profile.tokens_per_step,
                                                      flat.tokens_per_step),
                       f"measured up to k={kk}")
    return None


def _prior(spec: SpecConfig, k: int) -> _Accept:
    alpha = PRIOR_ALPHA.get(spec.method, 0.5)
    lo, hi = max(0.0, alpha - PRIOR_ALPHA_SPREAD), min(0.99, alpha + PRIOR_ALPHA_SPREAD)
    profile = AcceptanceProfile.leviathan(alpha, k)
    return _Accept("prior", profile, Estimate(profile.tokens_per_step, AcceptanceProfile.leviathan(lo, k).tokens_per_step,
                                              AcceptanceProfile.leviathan(hi, k).tokens_per_step),
                   f"alpha={alpha:g} assumed")


def _acceptance(spec: SpecConfig, baseline: Measurement, measured: Sequence[Measurement],
                replays: dict[str, ReplayAcceptance | None], drafts: DraftReplays,
                learned: LearnedAcceptance | None = None, features: Mapping[str, float] | None = None) -> _Accept:
    k = effective_k(spec) or 1
    if spec.method in (Method.NGRAM, Method.SUFFIX, Method.DRAFT_MODEL, Method.EAGLE3):
        key = f"{spec.model_dump_json()} {baseline.engine.max_model_len}"
        if key not in replays:
            replays[key] = drafts.acceptance(key, baseline.requests, lambda: _replay(spec, baseline, drafts))
        rep = replays[key]
        if rep is not None:
            note = f"{rep.num_drafts} drafts over {rep.num_requests} requests" + _OFFLINE.get(spec.method, "")
            if baseline.workload.sampling.temperature > 0:
                note += "; temperature > 0: approximate"
            profile = rep.profile()
            e = profile.tokens_per_step
            return _Accept("replay", profile, Estimate(e, max(1.0, e * (1 - rep.spread)), e * (1 + rep.spread)), note)
    found = _from_measured(spec, k, measured)
    if found is not None:
        return found
    if learned is not None and learned.knows(spec.method):
        profile, tokens = learned.predict(spec, temperature=baseline.workload.sampling.temperature,
                                          features=features or {})
        return _Accept("learned", profile, tokens, f"forest over {sum(learned.counts.values())} configurations")
    return _prior(spec, k)


# -- objectives ---------------------------------------------------------------------------------


def _objective_scaler(objective: str, baseline: Measurement) -> tuple[float, Callable[[float], float]]:
    """The baseline's value of ``objective`` and how it moves with ``ratio = TPOT / t0``.

    Throughput goes as ``1 / ratio``; TPOT percentiles as ``ratio``; TTFT does not move
    (speculation leaves the prefill alone); end-to-end latency moves on its decode share
    (``1 - TTFT / E2EL`` of the baseline's medians).
    """
    from spectune.measurement import Objective

    if objective not in _OBJECTIVES:
        raise ConfigError(f"cannot predict objective {objective!r} (known: {', '.join(_OBJECTIVES)})")
    base = Objective(objective).of_headline(baseline)
    if objective == "output_throughput":
        return base, lambda r: base / r
    if objective.startswith("tpot"):
        return base, lambda r: base * r
    if objective.startswith("ttft"):
        return base, lambda r: base
    ttft, e2el = baseline.ttft_ms.median, baseline.e2el_ms.median
    share = 1.0 - ttft / e2el if ttft is not None and e2el else 1.0
    return base, lambda r: base * (1.0 - share + share * r)


def predict_candidates(
    candidates: Sequence[SpecConfig],
    baseline: Measurement,
    measured: Sequence[Measurement],
    *,
    objective: str = "output_throughput",
    maximize: bool = True,
    learned: LearnedAcceptance | None = None,
    features: Mapping[str, float] | None = None,
    drafts: DraftReplays | None = None,
    engine_spread: float | None = None,
) -> list[Prediction]:
    """Predict each of ``candidates`` from the baseline and the measured trials; best first.

    ``drafts`` keeps the draft models' offline runs between calls (a new one for this call
    when None: a draft is then run again).

    ``measured`` are the study's speculative measurements (the cost model is fitted on them and
    truncation reads them). Baseline candidates are skipped. ``learned`` (with the study's
    workload ``features``) answers for proposers that neither replay nor the study's own
    trials cover, before the priors. ``engine_spread``: how much the study's engine starts of one
    configuration differ (:func:`spectune.results.engine_spread`; None: not measured yet), which
    widens a cost fitted on one engine start (:func:`~spectune.predict.fit_cost_model`).

    Raises:
        ConfigError: the baseline has no TPOT or throughput, or the objective is unknown.
    """
    t0 = baseline.tpot_ms.median
    if t0 is None or t0 <= 0 or baseline.output_throughput <= 0:
        raise ConfigError("the baseline measurement has no TPOT or throughput to predict from")
    # TPOT from a cost model fitted on TPOT; throughput (and a throughput objective) from one
    # fitted on throughput, which also carries what speculation does to the prefill's share
    curve = StepCurve.of(baseline.step_cost, (baseline.mean_in_flight or 1.0) if baseline.workload.by_rate
                         else baseline.workload.concurrency)
    cost = fit_cost_model(t0, baseline.output_throughput,
                          [p for m in measured if (p := CostPoint.from_measurement(m)) is not None],
                          engine_spread=engine_spread, curve=curve)
    cost_thr = fit_cost_model(t0, baseline.output_throughput, [
        p for m in measured if (p := CostPoint.from_measurement(m, throughput_of=baseline)) is not None],
        engine_spread=engine_spread, curve=curve)
    base_value, scale = _objective_scaler(objective, baseline)
    replays: dict[str, ReplayAcceptance | None] = {}
    drafts = drafts if drafts is not None else DraftReplays()
    out: list[Prediction] = []
    for spec in candidates:
        if spec.is_baseline:
            continue
        acc = _acceptance(spec, baseline, measured, replays, drafts, learned, features)
        tpot = cost.predict_tpot(spec, acc.tokens, acc.profile.drafted_per_step)
        per_token = cost_thr.predict_tpot(spec, acc.tokens, acc.profile.drafted_per_step)
        throughput = Estimate(cost_thr.throughput(per_token.value), cost_thr.throughput(per_token.high),
                              cost_thr.throughput(per_token.low))
        if objective == "output_throughput":
            value = throughput
        else:
            values = sorted(scale(t / t0) for t in (tpot.value, tpot.low, tpot.high))
            value = Estimate(scale(tpot.value / t0), values[0], values[-1])
        out.append(Prediction(
            label=spec.label(), spec=spec, source=acc.source,
            acceptance_rate=acc.profile.acceptance_rate,
            mean_acceptance_length=acc.profile.mean_acceptance_length,
            tokens_per_step=acc.tokens, tpot_ms=tpot, output_throughput=throughput,
            objective=objective, value=value, cost_source=cost.cost(spec).source, note=acc.note,
        ))
    sign = -1.0 if maximize else 1.0
    out.sort(key=lambda p: (sign * p.value.value if math.isfinite(p.value.value) else math.inf, p.label))
    return out
