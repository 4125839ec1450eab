"""The Optuna study: baseline first, one real engine run per trial, failures as data, resume.

``run_study(config)`` is the library call behind ``spectune optimize``. Optuna owns studies,
trials, samplers and distribution across machines (workers pointed at the same RDB storage,
heartbeats for dead workers); spectune adds the trial function, its own measurement table,
and the rules below:

- Trial 0 is the baseline (no speculation), so every result has a speedup.
- A candidate measured before in the study is not measured again: its values are reused.
- An engine that fails, crashes or times out makes the trial FAIL with the reason in the
  trial's ``fail_reason`` attribute and in spectune's table; the study goes on.
- Ctrl-C stops the engine, marks the running trial FAIL with ``fail_reason = "interrupted"``
  and exits non-zero; the next run re-queues that candidate and does not count it as done.
- SLOs are constraints: a trial that breaks one is infeasible and never "best".
"""

from __future__ import annotations

import json
import logging
import math
import re
import statistics
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator

from spectune._util import StrictModel, load_yaml_file, validate
from spectune.config import EngineArgs, Method, SpecConfig
from spectune.errors import ConfigError, EngineError
from spectune.results import speedup
from spectune.storage import MeasurementStore, open_optuna_storage, resolve_storage_url, spec_key
from spectune.workloads import Prompt, WorkloadFeatures, WorkloadSpec, compute_features

if TYPE_CHECKING:
    import optuna

    from spectune.space import SearchSpace
    from spectune.trial import Measurement, TrialHook

__all__ = ["SLO", "Objective", "StudyConfig", "StudyEvent", "load_study_config", "run_study"]

_logger = logging.getLogger(__name__)

INTERRUPTED = "interrupted"
MAX_ATTEMPTS_PER_TRIAL = 5
"""A sampler that keeps suggesting measured candidates is stopped after this many tries per trial."""


class Objective(str, Enum):
    """What a study optimises. Throughput is maximised, latencies minimised."""

    OUTPUT_THROUGHPUT = "output_throughput"
    TPOT_MEDIAN = "tpot_median_ms"
    TPOT_P99 = "tpot_p99_ms"
    TTFT_P99 = "ttft_p99_ms"
    E2EL_MEDIAN = "e2el_median_ms"
    E2EL_P99 = "e2el_p99_ms"

    @property
    def maximize(self) -> bool:
        return self is Objective.OUTPUT_THROUGHPUT

    @property
    def direction(self) -> str:
        return "maximize" if self.maximize else "minimize"

    def window_values(self, m: Measurement) -> list[float]:
        """This objective in each repeat of the window (for its noise)."""
        return [v for w in m.windows if (v := getattr(w, self.value)) is not None]

    def of(self, m: Measurement) -> float:
        """The measured value: the median over the windows."""
        values = self.window_values(m)
        if not values:
            raise EngineError(f"no request produced a value for {self.value}")
        return float(statistics.median(values))


class SLO(StrictModel):
    """Service-level limits. A trial that breaks any of them is infeasible."""

    ttft_p99_ms: float | None = Field(default=None, gt=0)
    tpot_median_ms: float | None = Field(default=None, gt=0)
    tpot_p99_ms: float | None = Field(default=None, gt=0)
    e2el_p99_ms: float | None = Field(default=None, gt=0)
    min_output_throughput: float | None = Field(default=None, gt=0)

    def violations(self, m: Measurement) -> dict[str, float]:
        """Optuna constraint values by SLO name: <= 0 is satisfied, > 0 by how much it is broken."""
        out: dict[str, float] = {}
        for name, limit in self:
            if limit is None:
                continue
            if name == "min_output_throughput":
                out[name] = limit - m.output_throughput
            else:
                out[name] = Objective(name).of(m) - limit
        return out


class StudyConfig(StrictModel):
    """Everything a study needs; read from YAML (``--config``) with CLI flags on top."""

    target: str = Field(description="Target model: local path or hub name.")
    draft: str | None = Field(default=None, description="Draft model for spaces that use ${draft}.")
    engine: dict[str, Any] = Field(default_factory=dict, description="Engine arguments (EngineArgs fields).")
    workload: WorkloadSpec
    space: str = "default"
    objectives: list[Objective] = Field(default_factory=lambda: [Objective.OUTPUT_THROUGHPUT])
    slo: SLO = Field(default_factory=SLO)
    trials: int = Field(default=10, ge=1)
    storage: str | None = None
    study_name: str | None = None
    seed: int = 0
    sampler: Literal["guided", "tpe", "random", "grid"] = Field(
        default="guided",
        description="guided: after the baseline, measure what the acceptance and cost models rank most "
        "promising or most uncertain (a pick measured outside its predicted interval is measured again on "
        "a fresh engine, beyond the trial budget), and stop when the rest is predicted clearly worse, after "
        "measuring the best again on a fresh engine (the engines' spread then widens the noise; a search "
        "ended by the trial budget does not: --confirm does; one objective; "
        "NSGA-II for two, TPE for a space too large to list); tpe (NSGA-II for two objectives); random; "
        "grid: every candidate once, in order.",
    )
    repeats: int = Field(default=2, ge=1, description="Disjoint windows of the prompts per trial, on one engine (noise = their MAD).")
    confirm: int = Field(
        default=0, ge=0,
        description="After the search, measure the baseline and the N best configurations again, each on a "
        "fresh engine: the choice then rests on each one's mean over its engines, and its noise band on "
        "the spread between them (engine starts differ more than windows on one engine).",
    )
    startup_timeout: float = Field(default=600.0, gt=0)
    window_timeout: float | None = Field(default=1800.0, gt=0)
    log_dir: Path = Path("storage/logs")
    heartbeat_interval: int = Field(default=30, ge=1, description="Seconds between a worker's heartbeats.")
    grace_period: int = Field(default=120, ge=2, description="A RUNNING trial silent this long is stale.")

    @field_validator("objectives")
    @classmethod
    def _one_or_two(cls, v: list[Objective]) -> list[Objective]:
        if not 1 <= len(v) <= 2 or len(set(v)) != len(v):
            raise ValueError("give one objective, or two different ones for a Pareto front")
        return v

    def engine_args(self, space: SearchSpace | None = None) -> EngineArgs:
        """The engine arguments of every trial: the space's fixed ones (its ``engine:``
        section), then the study's ``engine`` on top (the study's values win), with the target."""
        shared = space.engine_args(self.target).model_dump(exclude_unset=True) if space is not None else {}
        env = {**shared.get("env", {}), **self.engine.get("env", {})}  # key by key
        return validate(EngineArgs, {**shared, **self.engine, **({"env": env} if env else {}), "model": self.target},
                        "engine")

    def resolved_study_name(self) -> str:
        if self.study_name:
            return self.study_name
        target = Path(self.target.rstrip("/")).name or self.target
        source = self.workload.source
        workload = Path(source).stem if ("/" in source or "." in source) else source
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{target}-{workload}")


def load_study_config(path: Path | None, overrides: dict[str, Any]) -> StudyConfig:
    """A StudyConfig from a YAML file (optional) and CLI overrides (None values are ignored)."""
    data: dict[str, Any] = {}
    source = "study config"
    if path is not None:
        loaded = load_yaml_file(path)
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping at the top level")
        data = dict(loaded or {})
        source = str(path)
    for key, value in overrides.items():
        if value is None:
            continue
        if key == "workload":
            wl = data.get("workload") or {}
            data["workload"] = {**wl, "source": value} if isinstance(wl, dict) else {"source": value}
        else:
            data[key] = value
    if "target" not in data:
        raise ConfigError(f"{source}: target: the target model is missing (--target)")
    if "workload" not in data:
        raise ConfigError(f"{source}: workload: no workload given (--workload)")
    return validate(StudyConfig, data, source)


@dataclass
class StudyEvent:
    """Progress of a study, given to the progress hook after each trial and during one."""

    kind: str  # "trial_start", "trial_phase", "trial_end", "guide_stop" (done = candidates skipped)
    number: int
    total: int
    label: str
    phase: str = ""
    done: int = 0
    of: int = 0
    state: str = ""
    values: list[float] | None = None
    reason: str | None = None
    best_label: str | None = None
    best_speedup: float | None = None


StudyHook = Callable[[StudyEvent], None]


@dataclass
class StudyResult:
    study_name: str
    storage: str
    measured: int
    failed: int
    reused: int
    best: list[int] = field(default_factory=list)


def _sampler(config: StudyConfig) -> optuna.samplers.BaseSampler:
    import optuna

    if config.sampler in ("grid", "random"):  # grid: the candidates are enqueued; random beyond
        return optuna.samplers.RandomSampler(seed=config.seed)
    if len(config.objectives) > 1:
        return optuna.samplers.NSGAIISampler(seed=config.seed)
    # SLO constraints reach the samplers through Trial.set_constraint (Optuna >= 5).
    # guided: its picks are enqueued; TPE answers when the space cannot be listed
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=config.seed, n_startup_trials=4, multivariate=True, group=True)


def headline(m: Measurement) -> dict[str, Any]:
    """The trial attributes a person reads in the dashboard."""
    acc = m.acceptance
    return {
        "output_throughput": round(m.output_throughput, 3),
        "tpot_median_ms": m.tpot_ms.median,
        "ttft_p99_ms": m.ttft_ms.p99,
        "e2el_median_ms": m.e2el_ms.median,
        "acceptance_rate": acc.acceptance_rate if acc else None,
        "mean_acceptance_length": acc.mean_acceptance_length if acc else None,
        "per_position_acceptance": acc.per_position if acc else None,
        "startup_seconds": round(m.startup_seconds, 2),
        "failed_requests": m.num_failed,
    }


def relative_noise(objective: Objective, m: Measurement) -> float | None:
    """Median absolute deviation over the windows, relative to the median (None for 1 window)."""
    values = objective.window_values(m)
    if len(values) < 2:
        return None
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values)
    return mad / med if med else None


def run_study(
    config: StudyConfig,
    *,
    progress: StudyHook | None = None,
    trial_progress: Callable[[str], TrialHook | None] | None = None,
    measure_fn: Callable[..., Measurement] | None = None,
) -> StudyResult:
    """Run (or resume) the study ``config`` describes until it has ``config.trials`` finished trials.

    ``measure_fn`` replaces :func:`spectune.trial.measure` (same arguments): a recorded
    landscape answers with :meth:`spectune.landscape.Landscape.measurer`, to compare search
    strategies without engines.

    Raises ConfigError / StorageError for bad input before anything is written, and lets
    KeyboardInterrupt through after the running engine has been stopped.
    """
    import optuna

    from spectune.pairing import check_pairing
    from spectune.space import load_space
    from spectune.trial import measure as measure_engine
    from spectune.trial import plan_windows
    from spectune.workloads import load_prompts

    measure = measure_fn or measure_engine

    # -- validate everything before touching the storage or starting an engine ----------------
    space = load_space(config.space).resolve(config.target, draft=config.draft)
    engine = config.engine_args(space)
    for method, model in space.proposers():
        check_pairing(config.target, model, method)
    if Method.NONE not in space.methods:
        raise ConfigError(f"{space.source or config.space}: methods: the space needs 'none' (the baseline)")
    prompts = load_prompts(config.workload)
    plan_windows(prompts, config.workload, config.repeats)  # a sweep's levels each get enough prompts
    url = resolve_storage_url(config.storage)
    storage = open_optuna_storage(url, heartbeat_interval=config.heartbeat_interval,
                                  grace_period=config.grace_period)
    store = MeasurementStore(url)
    name = config.resolved_study_name()
    hook = progress or (lambda e: None)

    # Optuna logs each failed trial with a traceback at WARNING; spectune reports failures itself.
    optuna.logging.set_verbosity(optuna.logging.INFO if _logger.isEnabledFor(logging.INFO) else optuna.logging.ERROR)
    study = optuna.create_study(
        study_name=name, storage=storage, load_if_exists=True, sampler=_sampler(config),
        directions=[o.direction for o in config.objectives],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names([o.value for o in config.objectives])
    stored = study.user_attrs.get("spectune_config")
    current = json.loads(config.model_dump_json())
    resolved = json.loads(engine.model_dump_json())  # the space's engine section included
    if isinstance(stored, dict):  # a study of an earlier spectune has no resolved engine_args to compare
        before = study.user_attrs.get("engine_args")
        _require_same_measurements(name, {**stored, "engine_args": before},
                                   {**current, "engine_args": resolved if before is not None else None})
    study.set_user_attr("spectune_config", current)
    study.set_user_attr("engine_args", resolved)
    study.set_user_attr("objectives", [o.value for o in config.objectives])
    if "workload_features" not in study.user_attrs:
        study.set_user_attr("workload_features", compute_features(prompts).model_dump(mode="json"))

    def finished() -> list[optuna.trial.FrozenTrial]:
        # An engine failure counts as a finished trial (it is data). A trial failed by Ctrl-C, or
        # by Optuna's heartbeat after its worker died (no fail_reason), is retried instead.
        # A candidate suggested again is answered from the earlier trial and does not count.
        return [t for t in study.get_trials(deepcopy=False)
                if "duplicate_of" not in t.user_attrs and "confirms" not in t.user_attrs
                and (t.state == optuna.trial.TrialState.COMPLETE
                     or (t.state == optuna.trial.TrialState.FAIL
                         and t.user_attrs.get("fail_reason") not in (None, INTERRUPTED)))]

    # the baseline first; interrupted candidates again
    trials = study.get_trials(deepcopy=False)
    waiting = {_params_key(t) for t in trials if t.state == optuna.trial.TrialState.WAITING}
    baseline_params = space.params_of(SpecConfig())
    if not any(t.params == baseline_params for t in trials if t.state != optuna.trial.TrialState.FAIL) \
            and json.dumps(baseline_params, sort_keys=True) not in waiting:
        study.enqueue_trial(baseline_params, user_attrs={"role": "baseline"})
    for t in trials:  # confirmations left queued by an interrupted run: queued again after the search
        if t.state == optuna.trial.TrialState.WAITING and "confirms" in t.user_attrs:
            storage.set_trial_user_attr(t._trial_id, "fail_reason", INTERRUPTED)
            storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)
    retried = {t.user_attrs.get("retry_of") for t in trials}
    for t in trials:  # an interrupted confirmation is queued again by the confirmation phase
        if t.user_attrs.get("fail_reason") == INTERRUPTED and t.number not in retried and "confirms" not in t.user_attrs:
            guide = {k: v for k, v in t.user_attrs.items() if k in _GUIDE_ATTRS or k.startswith("predicted_")}
            study.enqueue_trial(t.params, user_attrs={**guide, "retry_of": t.number})  # a guided pick keeps its prediction

    counts = {"measured": 0, "failed": 0, "reused": 0}
    primary = config.objectives[0]
    total = config.trials

    def baseline_value() -> float | None:
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            if t.user_attrs.get("spec_key") == spec_key(None):
                return t.values[0]
        return None

    def best_so_far(finishing: optuna.Trial | None = None,
                    values: list[float] | None = None) -> tuple[str | None, float | None]:
        """The best feasible configuration so far and its speedup, among the configurations
        ``show`` and ``export`` would choose from (:meth:`StudyView.contenders`: each at its mean
        over the engines that measured it; once the study confirms, the confirmed ones), the
        trial ``finishing`` now with its ``values`` too (it is not COMPLETE until it returns)."""
        from spectune.results import StudyView

        view = StudyView(study, store, url)
        if finishing is not None and values is not None:
            view.rows = [replace(r, state="COMPLETE", values=values) if r.number == finishing.number else r
                         for r in view.rows]
        base, candidates, _ = view.contenders(on_front=[finishing.number] if finishing is not None else [])
        best: tuple[str | None, float | None] = (None, None)
        for c in candidates if base is not None else ():
            s = speedup(primary.maximize, c.value, base.value)
            if best[1] is None or s > best[1]:
                best = (c.row.label, s)
        return best

    confirming: list[tuple[int, int]] = []  # number and total of the confirmation running (set by its loop)

    def objective(trial: optuna.Trial) -> list[float] | float:
        spec = space.suggest(trial)
        key = spec_key(spec.to_vllm())
        confirms = trial.user_attrs.get("confirms")
        if confirms is not None and confirming:
            number, of = confirming[0]
        else:  # guided search's re-measurement does not advance the count of candidates
            number, of = len(finished()) + (confirms is None), total
        trial.set_user_attr("config", spec.label())
        trial.set_user_attr("spec", spec.to_vllm() or {"method": "none"})
        trial.set_user_attr("spec_key", key)
        label = spec.label() if confirms is None else f"{spec.label()} (again, as #{confirms})"
        hook(StudyEvent("trial_start", number, of, label))
        previous = None if confirms is not None else _finished_with_key(study, key, exclude=trial.number)
        if previous is not None:  # measured before in this study: reuse, start no engine
            for k, v in previous.user_attrs.items():
                if k not in {"role", "retry_of"}:
                    trial.set_user_attr(k, v)
            trial.set_user_attr("duplicate_of", previous.number)
            for slo_name, value in (previous.user_attrs.get("constraints") or {}).items():
                trial.set_constraint(slo_name, value)
            counts["reused"] += 1
            if previous.state == optuna.trial.TrialState.FAIL:
                reason = f"same candidate as trial {previous.number}: {previous.user_attrs['fail_reason']}"
                trial.set_user_attr("fail_reason", reason)
                _finish_event(hook, number, of, spec, "FAIL", None, reason, best_so_far())
                raise EngineError(reason)
            _finish_event(hook, number, of, spec, "REUSED", previous.values, None, best_so_far())
            return previous.values if len(previous.values) > 1 else previous.values[0]
        phase_hook = trial_progress(spec.label()) if trial_progress else None
        try:
            m = measure(engine, spec, config.workload, prompts, log_dir=config.log_dir,
                        startup_timeout=config.startup_timeout, window_timeout=config.window_timeout,
                        progress=phase_hook, repeats=config.repeats)
            values = [o.of(m) for o in config.objectives]
        except EngineError as e:
            counts["failed"] += 1
            trial.set_user_attr("fail_reason", str(e))
            store.record(study_name=name, trial_id=trial._trial_id, trial_number=trial.number,
                         spec_key=key, error=str(e))
            _finish_event(hook, number, of, spec, "FAIL", None, str(e), best_so_far())
            raise
        except KeyboardInterrupt:
            trial.set_user_attr("fail_reason", INTERRUPTED)
            raise
        counts["measured"] += 1
        attrs = headline(m)
        base = baseline_value()
        if spec.is_baseline and confirms is None:
            base = values[0]
        if base is not None:
            attrs["speedup"] = round(speedup(primary.maximize, values[0], base), 4)
        attrs["noise"] = relative_noise(primary, m)
        attrs["constraints"] = config.slo.violations(m)
        attrs["feasible"] = all(c <= 0 for c in attrs["constraints"].values())
        for slo_name, value in attrs["constraints"].items():
            trial.set_constraint(slo_name, value)
        for k, v in attrs.items():
            trial.set_user_attr(k, v)
        store.record(study_name=name, trial_id=trial._trial_id, trial_number=trial.number,
                     spec_key=key, measurement=m)
        if spec.is_baseline and confirms is None:  # the target's own outputs: repetition features
            study.set_user_attr("workload_features", _features_with_outputs(prompts, m).model_dump(mode="json"))
        _finish_event(hook, number, of, spec, "COMPLETE", values, None, best_so_far(trial, values))
        return values if len(values) > 1 else values[0]

    candidates = _count_candidates(space)
    guided = config.sampler == "guided" and len(config.objectives) == 1 and candidates is not None
    if config.sampler == "guided" and not guided:
        _logger.info("guided search needs one objective and a space that can be listed; using %s",
                     "NSGA-II" if len(config.objectives) > 1 else "TPE")
    attempts = 0
    while len(finished()) < total and attempts < MAX_ATTEMPTS_PER_TRIAL * total:
        if candidates is not None and len(finished()) >= candidates:
            _logger.info("every candidate of the space has been measured")
            break
        if guided and not _pending(study) and not _enqueue_guided(study, store, url, space, config, hook):
            break
        if config.sampler == "grid" and not _pending(study):
            _enqueue_grid(study, space)  # one at a time: nothing queued is left beyond the budget
        study.optimize(objective, n_trials=1, catch=(EngineError,))
        attempts += 1
    if guided and not _pending(study) and _enqueue_recheck(study):  # the last pick, past the budget
        study.optimize(objective, n_trials=1, catch=(EngineError,))
    if config.confirm:
        waiting = _enqueue_confirmations(study, store, url, config.confirm)
        searched = len(finished())
        for i in range(waiting):
            if not _next_confirms(study):  # a queue of an earlier spectune, or another worker's
                _logger.warning("the confirmations wait behind other queued trials: raise --trials to run those first")
                break
            confirming[:] = [(searched + i + 1, searched + waiting)]
            study.optimize(objective, n_trials=1, catch=(EngineError,))
    _annotate(study, store, url)
    return StudyResult(study_name=name, storage=url, **counts,
                       best=[t.number for t in study.best_trials] if _has_complete(study) else [])


RESUME_KEYS = ("target", "workload", "engine", "engine_args", "repeats")
"""What a resumed study must keep: trials measured otherwise are not comparable (the space, the
number of trials, the sampler and the objectives may change; ``engine_args`` is the resolved
engine, with the space's ``engine:`` section)."""


def _require_same_measurements(name: str, stored: dict[str, Any], current: dict[str, Any]) -> None:
    """Refuse to resume study ``name`` with another target, workload or engine (ConfigError)."""
    def flat(value: Any, prefix: str) -> dict[str, Any]:
        if isinstance(value, dict):
            return {k: v for key, sub in value.items() for k, v in flat(sub, f"{prefix}.{key}").items()}
        return {prefix: value}

    old = {k: v for key in RESUME_KEYS for k, v in flat(stored.get(key), key).items()}
    new = {k: v for key in RESUME_KEYS for k, v in flat(current.get(key), key).items()}
    changed = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    if changed:
        shown = ", ".join(f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in changed[:3])
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        raise ConfigError(f"study {name!r} was measured with another {changed[0].split('.')[0].removesuffix('_args')} ({shown}{more}); "
                          "its trials would not compare: give a new --study name")


def _pending(study: optuna.Study) -> bool:
    """Whether an enqueued trial is waiting to run."""
    import optuna

    return bool(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)))


def _enqueue_guided(study: optuna.Study, store: MeasurementStore, url: str, space: Any,
                    config: StudyConfig, hook: StudyHook) -> bool:
    """Enqueue the guided plan's next candidate, with its prediction as trial attributes.

    False when the search should stop: every candidate left is predicted clearly worse than
    the best measured, and that best was measured on two engines (the skipped ones are listed
    in the study attribute ``guide``). A best measured on one engine is measured again first
    (:data:`RECHECK_BEST`): its lead may be its engine's, and the two engines tell the study how
    much engines differ (:func:`spectune.results.engine_spread`), which widens the noise of
    every configuration measured once. Without a measured baseline there is nothing to predict
    from and the sampler chooses (True).
    """
    import optuna

    from spectune.predict import plan_next
    from spectune.results import StudyView, engine_spread

    view = StudyView(study, store, url)
    if view.baseline() is None:
        return True
    if _enqueue_recheck(study):  # measured again before anything is fitted on that one engine
        return True
    inputs = view.prediction_inputs(confirmations=False)  # the search plans on its own measurements
    busy = {t.user_attrs.get("spec_key") for t in study.get_trials(
        deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))}  # other workers' candidates
    todo = [c for c in inputs.candidates if spec_key(c.to_vllm()) not in busy]
    if not todo:
        return True
    sign = 1.0 if inputs.maximize else -1.0
    # the best measured (mean over its engines), at the low end of its noise: one lucky window,
    # or one lucky engine once engines are known to differ, does not end the search
    engines = view.engines(confirmations=False)  # measured once: noise at least the engines' spread
    spread = engine_spread(engines)
    feasible = [c for c in engines if c.feasible]
    lows = [c.value * (1.0 - sign * c.noise) for c in feasible]
    best = max(lows, key=lambda v: sign * v) if lows else -sign * math.inf  # none feasible yet: all could beat it
    top = max(feasible, key=lambda c: sign * c.value) if feasible else None  # what the study would choose
    trials = study.get_trials(deepcopy=False)
    step = sum(1 for t in trials if "guide_reason" in t.user_attrs and "retry_of" not in t.user_attrs)
    # its best measured again before stopping, and the search goes on: no guided pick since then
    rechecked = max((t.number for t in trials if t.user_attrs.get("recheck") == RECHECK_BEST), default=None)
    contested = rechecked is not None and not any("guide_reason" in t.user_attrs and t.number > rechecked
                                                  for t in trials)
    plan = plan_next(inputs.predict(todo), best=best, maximize=inputs.maximize, step=step, contested=contested)
    study.set_user_attr("guide", {
        "best_measured": best,
        "engine_spread": spread,
        "candidates_left": len(plan.candidates),
        "skipped": [{"config": p.label, f"predicted_{p.objective}": p.value.value,
                     "optimistic": p.value.high if inputs.maximize else p.value.low, "source": p.source}
                    for p in plan.skipped],
    })
    if plan.pick is None and top is not None and len(top.values) == 1 and top.row.number not in _measured_again(trials):
        _logger.info("guided search would stop; first measuring its best, %s, on a second engine", top.row.label)
        study.enqueue_trial(next(t for t in trials if t.number == top.row.number).params,
                            user_attrs={"confirms": top.row.number, "recheck": RECHECK_BEST})
        return True
    if plan.pick is None:
        _logger.info("guided search stops: the %d candidates left are predicted clearly worse than %.4g",
                     len(plan.skipped), best)
        hook(StudyEvent("guide_stop", 0, config.trials, "", done=len(plan.skipped)))
        return False
    p = plan.pick
    study.enqueue_trial(space.params_of(p.spec), user_attrs={
        f"predicted_{p.objective}": p.value.value, "predicted_low": p.value.low,
        "predicted_high": p.value.high, "predicted_acceptance_length": p.mean_acceptance_length,
        "prediction_source": p.source, "guide_reason": plan.reason, "guide_step": step,
    })
    return True


# Why guided search measured a configuration again (trial attribute ``recheck``; True in studies
# of spectune before session 7, meaning a surprise).
RECHECK_SURPRISE = "outside its predicted interval"
RECHECK_BEST = "the best when the search would stop"

_GUIDE_ATTRS = ("prediction_source", "guide_reason", "guide_step")
"""A guided pick's attributes beside its ``predicted_*`` ones (:func:`_enqueue_guided`)."""


def _enqueue_recheck(study: optuna.Study) -> bool:
    """Enqueue a fresh-engine measurement of a guided pick measured outside its predicted interval
    (:func:`spectune.predict.surprising`) and not measured again yet; whether one was enqueued.

    Which re-measurements count: :func:`_measured_again`."""
    import optuna

    from spectune.predict import surprising

    trials = study.get_trials(deepcopy=False)
    again = _measured_again(trials)
    for t in trials:
        a = t.user_attrs
        if t.state == optuna.trial.TrialState.COMPLETE and "guide_reason" in a and "duplicate_of" not in a \
                and "confirms" not in a and t.number not in again and t.values \
                and surprising(a["predicted_low"], a["predicted_high"], t.values[0]):
            _logger.info("trial %d measured %.4g, outside its predicted interval [%.4g, %.4g]: measuring it again",
                         t.number, t.values[0], a["predicted_low"], a["predicted_high"])
            study.enqueue_trial(t.params, user_attrs={"confirms": t.number, "recheck": RECHECK_SURPRISE})
            return True
    return False


def _measured_again(trials: Sequence[optuna.trial.FrozenTrial]) -> set[int]:
    """The trials whose configuration is measured again on a fresh engine (``confirms``), queued,
    running or done: completed, or failed by its engine (that is data, not retried on resume).
    One interrupted by Ctrl-C, or abandoned by a dead worker, does not count."""
    import optuna

    going = (optuna.trial.TrialState.WAITING, optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.COMPLETE)
    return {t.user_attrs["confirms"] for t in trials if "confirms" in t.user_attrs
            and (t.state in going or t.user_attrs.get("fail_reason") not in (None, INTERRUPTED))}


def _enqueue_grid(study: optuna.Study, space: Any) -> None:
    """Enqueue the first candidate of the space, in its order, that no trial has taken yet."""
    taken = {_params_key(t) for t in study.get_trials(deepcopy=False)}
    for spec in space.enumerate():
        params = space.params_of(spec)
        if not spec.is_baseline and json.dumps(params, sort_keys=True) not in taken:
            study.enqueue_trial(params)
            return


def _next_confirms(study: optuna.Study) -> bool:
    """Whether the trial Optuna runs next (the oldest waiting one) is a confirmation."""
    import optuna

    waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    return bool(waiting) and "confirms" in min(waiting, key=lambda t: t.number).user_attrs


def _enqueue_confirmations(study: optuna.Study, store: MeasurementStore, url: str, n: int) -> int:
    """Enqueue a fresh-engine measurement of the baseline and of the ``n`` best feasible
    configurations by the first objective, each measured on one engine only so far (a resumed
    study does not confirm twice; more searching, or a larger ``n``, confirms the new best).
    Returns how many trials are waiting."""
    import optuna

    from spectune.results import StudyView

    view = StudyView(study, store, url)
    configs = view.engines()
    sign = 1.0 if view.directions[0] == "maximize" else -1.0
    # ranked by their first engine, as the search met them: a resumed study confirms the same ones
    # (a configuration guided search already measured twice takes its place without a third)
    ranked = sorted((c for c in configs if c.feasible and not c.row.is_baseline), key=lambda c: -sign * c.values[0])
    if len(view.directions) > 1:  # two objectives: the configurations of the Pareto front
        front = {t.number for t in study.best_trials}
        ranked = [c for c in ranked if front.intersection(c.numbers)]
    chosen = [c for c in configs if c.row.is_baseline] + ranked[:n]
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    done = _measured_again(list(trials.values()))
    for c in chosen:
        if len(c.values) == 1 and c.row.number not in done:
            study.enqueue_trial(trials[c.row.number].params, user_attrs={"confirms": c.row.number})
    return sum(1 for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
               if "confirms" in t.user_attrs)


def _features_with_outputs(prompts: Sequence[Prompt], m: Measurement) -> WorkloadFeatures:
    """Workload features with the outputs of the first window (one output per prompt)."""
    first = m.requests[: len(prompts)]
    ok = [(p, r) for p, r in zip(prompts, first, strict=False) if r.ok]
    with_ids = all(r.token_ids is not None and r.prompt_token_ids is not None for _, r in ok)
    return compute_features(
        [p for p, _ in ok], [r.text for _, r in ok],
        prompt_token_ids=[r.prompt_token_ids or [] for _, r in ok] if with_ids else None,
        output_token_ids=[r.token_ids or [] for _, r in ok] if with_ids else None,
    )


def _count_candidates(space: object) -> int | None:
    """How many distinct candidates a space has, or None when it is too large to list."""
    try:
        return len(space.enumerate())  # type: ignore[attr-defined]
    except ConfigError:
        return None


def _annotate(study: optuna.Study, store: MeasurementStore, url: str) -> None:
    """Note and figures for the dashboard; a study that cannot be annotated is still a result."""
    from spectune.errors import SpectuneError
    from spectune.report import annotate_study
    from spectune.results import StudyView

    try:
        annotate_study(StudyView(study, store, url))
    except SpectuneError as e:
        _logger.warning("study %s not annotated: %s", study.study_name, e)


def _params_key(t: optuna.trial.FrozenTrial) -> str:
    """A trial's parameters as text; for a WAITING (enqueued) trial, the ones it will get."""
    return json.dumps(t.params or t.system_attrs.get("fixed_params", {}), sort_keys=True)


def _has_complete(study: optuna.Study) -> bool:
    import optuna

    return bool(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))


def _finished_with_key(study: optuna.Study, key: str, exclude: int) -> optuna.trial.FrozenTrial | None:
    """An earlier trial of the same candidate that completed, or failed for a reason of its engine."""
    import optuna

    for t in study.get_trials(deepcopy=False):
        if t.number == exclude or t.user_attrs.get("spec_key") != key or "duplicate_of" in t.user_attrs:
            continue
        if t.state == optuna.trial.TrialState.COMPLETE or (
            t.state == optuna.trial.TrialState.FAIL and t.user_attrs.get("fail_reason") not in (None, INTERRUPTED)
        ):
            return t
    return None


def _finish_event(hook: StudyHook, number: int, total: int, spec: SpecConfig, state: str,
                  values: list[float] | None, reason: str | None, best: tuple[str | None, float | None]) -> None:
    hook(StudyEvent("trial_end", number, total, spec.label(), state=state, values=values, reason=reason,
                    best_label=best[0], best_speedup=best[1]))
