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
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator

from spectune._util import StrictModel, load_yaml_file, validate
from spectune.answers import AnswerRule
from spectune.config import EngineArgs, Method, Prompt, WorkloadSpec
from spectune.engines import DEFAULT_STARTUP_TIMEOUT, detect_platform, method_refusal
from spectune.errors import ConfigError
from spectune.measurement import SLO, Objective
from spectune.records import StudyRecord, write_study_fields
from spectune.storage import (
    DEFAULT_OUTAGE_LIMIT,
    MeasurementStore,
    open_optuna_storage,
    resolve_storage_url,
    safe_url,
    study_lock,
)
from spectune.workloads import WorkloadFeatures, compute_features

if TYPE_CHECKING:
    import optuna

    from spectune.measurement import Measurement
    from spectune.space import SearchSpace

__all__ = ["StudyConfig", "StudyContext", "StudyEvent", "StudyPlan", "StudyResult", "create_study", "join_study",
           "load_study_config", "plan_study", "study_names"]

_logger = logging.getLogger(__name__)



_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(s|sec|m|min|h)?")
_UNIT_SECONDS = {None: 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Seconds in ``"600"``, ``"90s"``, ``"10m"``, ``"1.5h"`` (ValueError otherwise)."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a duration: give seconds or a number with s, m or h (10m)")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


class StudyConfig(StrictModel):
    """Everything a study needs; read from YAML (``--config``) with CLI flags on top."""

    target: str = Field(description="Target model: local path or hub name.")
    draft: str | list[str] | None = Field(
        default=None,
        description="Drafts and heads for spaces that use ${draft}: each goes to the method it serves "
        "(an EAGLE-3 head to eagle3, a model to draft_model); heads built beside a local target join them.",
    )
    engine: dict[str, Any] = Field(default_factory=dict, description="Engine arguments (EngineArgs fields).")
    workload: WorkloadSpec
    space: str = "default"
    objectives: list[Objective] = Field(default_factory=lambda: [Objective.OUTPUT_THROUGHPUT])
    slo: SLO = Field(default_factory=SLO)
    trials: int = Field(default=10, ge=1)
    storage: str | None = None
    study_name: str | None = None
    seed: int = Field(default=0, ge=0, le=2**32 - 1, description="Seed of Optuna's samplers (numpy's range).")
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
    tolerance: float | None = Field(
        default=None, ge=0, lt=1,
        description="Guided search stops once no candidate has more than a 5 % chance of beating the pick by "
        "more than this (relative): 0.05 is 5 %. Default: the larger of 2 % and the study's measured "
        "spread between engine starts.")
    extend: bool = Field(
        default=True, description="Guided search widens an integer range of the space (k, the n-gram window) past "
        "its edge where the pick, or a configuration it cannot tell from the pick, sits on it, and measures what "
        "its models find worth measuring there; false keeps to the space (what lies beyond is still predicted "
        "and reported). A range marked hard: true in the space is never widened.")
    time_budget: float | None = Field(
        default=None, gt=0,
        description="Engine time the study may spend, summed over its trials on every worker: seconds, or "
        "with a unit (90s, 10m, 2h). After the baseline, a trial starts only if it is expected to end within it "
        "(trials take as long as the median one so far); the choice is made from what was measured.")
    answers: AnswerRule = Field(
        default=AnswerRule.ROUNDING,
        description="Which of a configuration's answers, held against the baseline's at temperature 0, rule it "
        "out: rounding (default: a difference where the baseline's choice was a near-tie is allowed, a changed "
        "answer is not), identical (every answer token for token), off (no check).")
    startup_timeout: float = Field(default=DEFAULT_STARTUP_TIMEOUT, gt=0,
                                   description="Seconds an engine may take to become healthy (loading, compiling).")
    window_timeout: float | None = Field(default=1800.0, gt=0)
    log_dir: Path = Path("storage/logs")
    heartbeat_interval: int = Field(default=30, ge=1, description="Seconds between a worker's heartbeats.")
    grace_period: int = Field(default=120, ge=2, description="A RUNNING trial silent this long is stale.")
    storage_outage_limit: float = Field(
        default=DEFAULT_OUTAGE_LIMIT, gt=0,
        description="How long a worker waits for an unreachable storage (seconds, or 90s, 10m): meanwhile it "
        "keeps a finished measurement and starts no engine; past it, it stops its engines and exits (code 2). "
        "Each worker's own (spectune worker --storage-outage-limit).")

    @field_validator("time_budget", "storage_outage_limit", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> Any:
        return parse_duration(v) if isinstance(v, str) else v

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


CLEAR: Any = type("Clear", (), {"__repr__": lambda self: "CLEAR"})()
"""An override that removes its key from the file's configuration (a command-line option that
replaces another way of saying the same thing: ``--concurrency 8`` and a file's levels)."""


def load_study_config(path: Path | None, overrides: dict[str, Any]) -> StudyConfig:
    """A StudyConfig from a YAML file (optional) and CLI overrides (None values are ignored,
    :data:`CLEAR` removes the key)."""
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
        elif "." in key:  # a key of a section: slo.max_memory
            section, name = key.split(".", 1)
            inner = data.get(section) or {}
            inner = inner if isinstance(inner, dict) else {}
            data[section] = {k: v for k, v in inner.items() if k != name} if value is CLEAR else {**inner, name: value}
        elif value is CLEAR:
            data.pop(key, None)
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
    space, engine arguments and prompts. What :func:`spectune.worker.run_worker` works on."""

    config: StudyConfig
    url: str
    storage: optuna.storages.RDBStorage
    store: MeasurementStore
    study: optuna.Study
    space: SearchSpace
    engine: EngineArgs
    prompts: list[Prompt]

    def current_space(self) -> SearchSpace:
        """:attr:`space` with the ranges guided search has widened past its edges so far, as the
        study keeps them (:attr:`~spectune.records.StudyRecord.extensions`, read from the storage)."""
        return self.space.extended(StudyRecord.of(self.study).extensions or [])


PLACEMENT_ENV = ("CUDA_VISIBLE_DEVICES",)
"""Environment that says where an engine runs, not what it measures: left out of a study's
identity, so that workers on other GPUs and hosts share the study."""


@dataclass(frozen=True)
class StudyPlan:
    """What a study's configuration resolves to, checked, before anything is written: its space
    with the drafts filled, the engine arguments of its trials and its prompts."""

    space: SearchSpace
    engine: EngineArgs
    prompts: list[Prompt]


def plan_study(config: StudyConfig) -> StudyPlan:
    """Resolve and check everything :func:`create_study` needs from ``config`` (the space, the
    prompts, the engine, each proposer's pairing with the target) without touching the storage.

    Raises:
        ConfigError: anything :func:`create_study` would refuse before writing.
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
    return StudyPlan(space, _checked_engine(config, space, prompts), prompts)


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


def _open(config: StudyConfig, space: SearchSpace, prompts: list[Prompt], engine: EngineArgs | None = None) -> StudyContext:
    """Validate what the trials need (unless ``engine`` says it was), then open the storage and
    the study (created if new)."""
    import optuna

    engine = engine if engine is not None else _checked_engine(config, space, prompts)
    url = resolve_storage_url(config.storage)
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
    ``plan``: :func:`plan_study`'s for ``config``, where the caller checked it first.

    Raises ConfigError / StorageError for bad input before anything is written: a resumed
    study must keep its target, workload and engine (:data:`RESUME_KEYS`).
    """
    import optuna

    plan = plan if plan is not None else plan_study(config)
    space = plan.space
    ctx = _open(config, space, plan.prompts, plan.engine)
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
    return _open(config, space, prompts)


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


