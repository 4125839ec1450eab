"""The Optuna study: its configuration, creating or joining it, and the wiring of a run.

``run_study(config)`` is the library call behind ``spectune optimize``: :func:`create_study`
(validate, open the storage, store what any worker needs), then a worker
(:func:`spectune.worker.run_worker`) that asks the search (:mod:`spectune.search`) for trials
and measures them with the trial function (:mod:`spectune.objective`). ``spectune worker``
joins an existing study (:func:`join_study`) from any machine on the same storage. Optuna owns
studies, trials, samplers and distribution across machines (RDB storage, heartbeats, the retry
of a dead worker's trial); spectune adds the trial function, its own tables, and the rules:

- Trial 0 is the baseline (no speculation), so every result has a speedup.
- A candidate measured before in the study is not measured again: its values are reused.
- An engine that fails, crashes or times out makes the trial FAIL with the reason in the
  trial's ``fail_reason`` attribute and in spectune's table; the study goes on.
- SIGTERM or Ctrl-C stops the engine, marks the running trial FAIL with ``fail_reason =
  "interrupted"`` and exits 0 (:func:`spectune.worker.run_worker`); the next worker that asks,
  here or on another machine, measures that candidate again and does not count it as done.
- SLOs are constraints: a trial that breaks one is infeasible and never "best".
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spectune._util import validate
from spectune.answers import AnswerRule
from spectune.config import EngineArgs, Method, Prompt
from spectune.engines import detect_platform, method_refusal
from spectune.errors import ConfigError
from spectune.measurement import Objective
from spectune.records import StudyRecord, write_study_fields
from spectune.storage import (
    MeasurementStore,
    StorageGuard,
    open_optuna_storage,
    resolve_storage_url,
    safe_url,
    study_lock,
)
from spectune.study._config import CLEAR, StudyConfig, load_study_config, parse_duration
from spectune.workloads import WorkloadFeatures, compute_features

if TYPE_CHECKING:
    import optuna

    from spectune.measurement import Measurement
    from spectune.search import StudyStrategy
    from spectune.space import SearchSpace

__all__ = ["CLEAR", "StudyConfig", "StudyContext", "StudyEvent", "StudyPlan", "StudyResult", "create_study", "join_study",
           "load_study_config", "parse_duration", "plan_study", "study_names"]

_logger = logging.getLogger(__name__)



@dataclass
class StudyEvent:
    """Progress of a study, given to the progress hook after each trial and during one."""

    kind: str
    """"trial_start", "trial_phase", "trial_end", "guide_stop" (``done``: candidates skipped,
    ``reason``: why it stopped), "budget_stop" (``done``: engine seconds spent, ``of``: the time budget)."""
    number: int
    """The trial's place in the study's count (1 for the first), ``total`` the count planned."""
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
    trial: int | None = None
    """The trial's number as ``spectune show``, the report and the export give it (Optuna's, from 0)."""


StudyHook = Callable[[StudyEvent], None]


@dataclass
class StudyResult:
    """What one worker did, and where the study stands."""

    study_name: str
    storage: str
    measured: int
    """Trials this worker measured on an engine."""
    failed: int
    reused: int
    best: list[int] = field(default_factory=list)
    finished: int = 0
    """Finished trials of the study, by every worker (engine failures count; rechecks and
    confirmations do not): what ``trials`` is a budget of."""
    stopped: str | None = None
    """The signal that stopped this worker politely (``"SIGTERM"``, ``"SIGINT"``), None when the
    study needed no more trials."""
    handed_back: list[int] = field(default_factory=list)
    """Trials the stop interrupted, told FAIL as ``interrupted`` for another worker to measure."""


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


@dataclass
class StudyContext:
    """A study opened for measuring: its configuration as stored, the storage, the resolved
    space, engine arguments and prompts. What :func:`spectune.worker.run_worker` works on, and
    what it hands down: the search and the storage's guard are built from it (:meth:`strategy`,
    :meth:`guard`); nothing below reads the configuration file or resolves the storage again."""

    config: StudyConfig
    url: str
    storage: optuna.storages.RDBStorage
    store: MeasurementStore
    study: optuna.Study
    space: SearchSpace
    engine: EngineArgs
    prompts: list[Prompt]

    def guard(self) -> StorageGuard:
        """A guard of this study's storage, waiting out outages up to its ``storage_outage_limit``."""
        return StorageGuard(self.url, self.config.storage_outage_limit)

    def strategy(self, on_guide_stopped: Callable[[str], None] | None = None,
                 on_budget_spent: Callable[[float], None] | None = None) -> StudyStrategy:
        """The study's search, as its configuration asks (sampler, budget, confirmations)."""
        from spectune.search import StudyStrategy

        c = self.config
        return StudyStrategy(space=self.space, store=self.store, url=self.url, sampler=c.sampler,
                             objectives=len(c.objectives), trials=c.trials, confirm=c.confirm,
                             time_budget=c.time_budget, tolerance=c.tolerance, extend=c.extend,
                             on_guide_stopped=on_guide_stopped, on_budget_spent=on_budget_spent)

    def current_space(self) -> SearchSpace:
        """:attr:`space` with the ranges guided search has widened past its edges so far, as the
        study keeps them (:attr:`~spectune.records.StudyRecord.extensions`, read from the storage)."""
        return self.space.extended(StudyRecord.of(self.study).extensions or [])


PLACEMENT_ENV = ("CUDA_VISIBLE_DEVICES",)
"""Environment that says where an engine runs, not what it measures: left out of a study's
identity, so that workers on other GPUs and hosts share the study."""


@dataclass(frozen=True)
class StudyPlan:
    """What a study's configuration resolves to, checked, before anything is written: the
    configuration with its storage URL resolved, its space with the drafts filled, the engine
    arguments of its trials and its prompts. Resolved once, at the top, and handed down."""

    config: StudyConfig
    space: SearchSpace
    engine: EngineArgs
    prompts: list[Prompt]

    @property
    def url(self) -> str:
        """The storage URL, resolved (``storage`` of :attr:`config`)."""
        return str(self.config.storage)


def plan_study(config: StudyConfig) -> StudyPlan:
    """Resolve and check everything :func:`create_study` needs from ``config`` (the space, the
    prompts, the engine, each proposer's pairing with the target, last the storage URL) without
    writing to the storage (a SQLite file's folder is created).

    Raises:
        ConfigError: anything :func:`create_study` would refuse before writing.
        StorageError: a storage that cannot be used (:func:`~spectune.storage.resolve_storage_url`).
    """
    from spectune.workloads import load_prompts

    space = resolved_space(config)
    prompts = load_prompts(config.workload)
    if config.workload.api == "completions" and any(p.messages for p in prompts):
        _logger.warning("workload %s: its prompts are chat messages, sent as plain text to the completions API "
                        "(api: completions); set api: chat to send them through the model's chat template",
                        config.workload.source)
    if config.workload.by_rate and config.workload.is_mix and Objective.OUTPUT_THROUGHPUT in config.objectives:
        _logger.warning("workload: at a request rate the engine keeps up with, output throughput is the rate's, "
                        "whatever the configuration; a mix of request rates is told apart by its latencies "
                        "(objective tpot_median_ms, e2el_median_ms or their p99)")
    if config.answers is not AnswerRule.OFF and (t := config.workload.sampling.temperature) > 0:
        _logger.warning("answers are not checked against the baseline's: the workload samples at temperature %g, "
                        "where answers differ by chance (set temperature 0 to check them)", t)
    engine = _checked_engine(config, space, prompts)
    resolved = config.model_copy(update={"storage": resolve_storage_url(config.storage)})
    return StudyPlan(resolved, space, engine, prompts)


def _checked_engine(config: StudyConfig, space: SearchSpace, prompts: list[Prompt]) -> EngineArgs:
    """The trials' engine arguments, once what the trials need is checked (ConfigError)."""
    from spectune.pairing import check_model_access, check_pairing
    from spectune.trial import plan_windows

    engine = config.engine_args(space)
    for method in space.methods:
        if why := method_refusal(method.value, space.engine_fields(method), engine.env):
            raise ConfigError(f"{space.source or config.space}: methods.{method}: {why}; leave it out of the space")
    for method, model in space.proposers():
        check_pairing(config.target, model, method)
    check_model_access(config.target)  # a gated or unknown hub model: one line, before any engine
    if Method.NONE not in space.methods:
        raise ConfigError(f"{space.source or config.space}: methods: the space needs 'none' (the baseline)")
    plan_windows(prompts, config.workload, config.repeats)  # a sweep's levels each get enough prompts
    return engine


def _open(config: StudyConfig, url: str, space: SearchSpace, prompts: list[Prompt],
          engine: EngineArgs | None = None) -> StudyContext:
    """Validate what the trials need (unless ``engine`` says it was), then open the storage at
    ``url`` (resolved) and the study (created if new)."""
    import optuna

    engine = engine if engine is not None else _checked_engine(config, space, prompts)
    storage = open_optuna_storage(url, heartbeat_interval=config.heartbeat_interval, grace_period=config.grace_period)
    store = MeasurementStore(url)
    # Optuna logs each failed trial with a traceback at WARNING; spectune reports failures itself.
    optuna.logging.set_verbosity(optuna.logging.INFO if _logger.isEnabledFor(logging.INFO) else optuna.logging.ERROR)
    study = optuna.create_study(
        study_name=config.resolved_study_name(), storage=storage, load_if_exists=True, sampler=_sampler(config),
        directions=[o.direction for o in config.objectives],
    )
    return StudyContext(config, url, storage, store, study, space, engine, prompts)


def resolved_space(config: StudyConfig) -> SearchSpace:
    """The study's space with its ``${draft}`` filled: the drafts and heads given, and the heads
    built beside a local target (:func:`~spectune.space.local_heads`), each under the method
    it serves (:func:`~spectune.space.route_drafts`)."""
    from spectune.space import load_space, local_heads, route_drafts

    given = [config.draft] if isinstance(config.draft, str) else list(config.draft or [])
    found = [h for h in local_heads(config.target) if h not in given]
    for head in found:
        _logger.info("found the EAGLE-3 head %s built for the target; spaces with ${draft} search it", head)
    drafts = given + found
    space = load_space(config.space).for_platform(detect_platform().name)
    return route_drafts(space.resolve(config.target, draft=drafts), drafts)


def create_study(config: StudyConfig, plan: StudyPlan | None = None) -> StudyContext:
    """Create the study ``config`` describes, or open it to resume: everything a worker on any
    machine needs to join it is stored with it (its configuration, resolved space and prompts).
    ``plan``: :func:`plan_study`'s for ``config``, where the caller checked it first (and claimed
    its storage, :attr:`StudyPlan.url`); the study is opened with the plan's configuration.

    Raises ConfigError / StorageError for bad input before anything is written: a resumed
    study must keep its target, workload and engine (:data:`RESUME_KEYS`).
    """
    import optuna

    plan = plan if plan is not None else plan_study(config)
    config, space = plan.config, plan.space
    ctx = _open(config, plan.url, space, plan.prompts, plan.engine)
    study, name = ctx.study, ctx.study.study_name
    have = [d.name.lower() for d in study.directions]  # fixed when Optuna created the study
    if have != [o.direction for o in config.objectives]:
        raise ConfigError(f"study {name!r} has {len(have)} objective(s) ({', '.join(have)}); this run gives "
                          f"{len(config.objectives)} ({', '.join(o.value for o in config.objectives)}): objectives may "
                          "change only keeping their number and directions; give a new --study name")
    with study_lock(ctx.url, name):  # two workers creating one study at once write it once
        record = StudyRecord.of(study)
        stored = record.spectune_config
        current = json.loads(config.model_dump_json())
        if current.get("storage"):  # kept with the study, shown by reports: never its password
            current["storage"] = safe_url(current["storage"])
        resolved = json.loads(ctx.engine.model_dump_json())  # the space's engine section included
        if isinstance(stored, dict):  # a study of an earlier spectune has no resolved engine_args to compare
            before = record.engine_args
            _require_same_measurements(name, {**stored, "engine_args": before},
                                       {**current, "engine_args": resolved if before is not None else None})
        write_study_fields(study, spectune_config=current, engine_args=resolved,
                           objectives=[o.value for o in config.objectives])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([o.value for o in config.objectives])
        if record.workload_features is None:
            write_study_fields(study, workload_features=compute_features(ctx.prompts).model_dump(mode="json"))
        ctx.store.save_definition(name, {
            "config": current, "space": space.model_dump(mode="json", exclude_unset=True),
            "prompts": [p.model_dump(mode="json", exclude_none=True) for p in ctx.prompts],
        })
    return ctx


def join_study(storage: str | None, study_name: str) -> StudyContext:
    """Open study ``study_name``, created by ``spectune optimize --create-only`` on any machine,
    to measure its trials here: its configuration, space and prompts are read from the storage.

    Raises:
        ConfigError: no such study, or one that no spectune created to join.
        StorageError: the storage cannot be used.
    """
    from spectune.config import Prompt
    from spectune.space import SearchSpace

    url = resolve_storage_url(storage, create=False)
    names = study_names(url)
    if study_name not in names:
        raise ConfigError(f"no study named {study_name!r} in {safe_url(url)} (studies: {', '.join(names) or 'none'})")
    definition = MeasurementStore(url).definition(study_name)
    if definition is None:
        raise ConfigError(f"study {study_name!r} in {safe_url(url)} was not created to be joined: "
                          "run spectune optimize with it once to store its definition")
    source = f"study {study_name}"
    config = validate(StudyConfig, {**definition["config"], "storage": url}, source)
    space = validate(SearchSpace, definition["space"], source)
    prompts = [validate(Prompt, p, source) for p in definition["prompts"]]
    return _open(config, url, space, prompts)


def study_names(url: str) -> list[str]:
    """The studies in the storage at ``url``, oldest first (their names alone: a summary would
    read every trial of every study)."""
    import optuna

    return optuna.get_all_study_names(open_optuna_storage(url))



RESUME_KEYS = ("target", "workload", "engine", "engine_args", "repeats")
"""What a resumed study must keep: trials measured otherwise are not comparable (the space, the
number of trials, the sampler and the objectives (keeping their number and directions, which Optuna fixes) may change; ``engine_args`` is the resolved
engine, with the space's ``engine:`` section; the GPUs an engine is given, :data:`PLACEMENT_ENV`,
may change)."""


def _require_same_measurements(name: str, stored: dict[str, Any], current: dict[str, Any]) -> None:
    """Refuse to resume study ``name`` with another target, workload or engine (ConfigError)."""
    def flat(value: Any, prefix: str) -> dict[str, Any]:
        if isinstance(value, dict):
            return {k: v for key, sub in value.items() for k, v in flat(sub, f"{prefix}.{key}").items()}
        return {prefix: value}

    def identity(config: dict[str, Any]) -> dict[str, Any]:  # where an engine runs is not what it measures
        return {k: v for key in RESUME_KEYS for k, v in flat(config.get(key), key).items()
                if k.rpartition(".")[2] not in PLACEMENT_ENV}

    old, new = identity(stored), identity(current)
    changed = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    if changed:
        shown = ", ".join(f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in changed[:3])
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        raise ConfigError(f"study {name!r} was measured with another {changed[0].split('.')[0].removesuffix('_args')} ({shown}{more}); "
                          "its trials would not compare: give a new --study name")


def features_with_outputs(prompts: Sequence[Prompt], m: Measurement) -> WorkloadFeatures:
    """Workload features with the outputs of the first window (one output per prompt)."""
    first = m.requests[: len(prompts)]
    ok = [(p, r) for p, r in zip(prompts, first, strict=False) if r.ok]
    with_ids = all(r.token_ids is not None and r.prompt_token_ids is not None for _, r in ok)
    return compute_features(
        [p for p, _ in ok], [r.text for _, r in ok],
        prompt_token_ids=[r.prompt_token_ids or [] for _, r in ok] if with_ids else None,
        output_token_ids=[r.token_ids or [] for _, r in ok] if with_ids else None,
    )


