"""A study's configuration (:class:`StudyConfig`): what it measures, where, and when it stops, read
from a YAML file and the command line's overrides (:func:`load_study_config`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator

from spectune._util import StrictModel, load_yaml_file, validate
from spectune.answers import AnswerRule
from spectune.config import EngineArgs, WorkloadSpec
from spectune.engines import DEFAULT_STARTUP_TIMEOUT
from spectune.errors import ConfigError
from spectune.measurement import SLO, Objective
from spectune.storage import (
    DEFAULT_OUTAGE_LIMIT,
)

if TYPE_CHECKING:

    from spectune.space import SearchSpace


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
    step_cost: bool = Field(
        default=True,
        description="The baseline's engine times its forwards over the new tokens a verification step holds, at "
        "each load level, after its windows (a few seconds, untimed): the cost model prices candidates from it.")
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
