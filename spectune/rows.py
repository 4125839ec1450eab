"""A study's trials as a person reads them (:class:`TrialRow`), each configuration over the engines
that measured it (:class:`Engines`), the configurations other studies in a storage measured twice
on one machine (:func:`machine_groups`), and the shape of a decision (:class:`Choice`,
:class:`LevelRow`): what :class:`spectune.results.StudyView` builds and answers with."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spectune.answers import ANSWERS, Fidelity
from spectune.measurement import NOISE_FLOOR, candidate_key
from spectune.noise import EngineSpread, interval, interval_text, machine_key
from spectune.records import StudyRecord, TrialRecord
from spectune.storage import MeasurementStore, open_optuna_storage

if TYPE_CHECKING:
    import optuna

__all__ = ["Choice", "Engines", "LevelRow", "TrialRow", "machine_groups", "trial_row"]


@dataclass(frozen=True)
class TrialRow:
    """One trial as a person reads it."""

    number: int
    trial_id: int | None
    """Its id in the storage where spectune recorded it (None: not measured yet, or failed before)."""
    state: str
    label: str
    spec: dict[str, Any]
    values: list[float] | None
    speedup: float | None
    """The first objective against the baseline's mean over its engines (:meth:`StudyView.speedups`)."""
    noise: float | None
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    feasible: bool
    duplicate_of: int | None
    fail_reason: str | None
    predicted: float | None = None
    """The first objective as predicted before the trial ran (guided search), if it was."""
    confirms: int | None = None
    """The trial whose configuration this one measured again on a fresh engine (``confirm``, or
    guided search's re-measurement: of a surprise, or of its best before it stops)."""
    recheck: bool = False
    """Measured again by guided search, not by ``confirm``: the first measurement fell outside
    its predicted interval (:func:`spectune.predict.surprising`), or it was the best measured
    when the search would have stopped (``recheck_reason``)."""
    recheck_reason: str | None = None
    placement: str | None = None
    """Where the trial ran: its worker's host, and the GPUs its engine was given."""
    engine: dict[str, Any] | None = None
    """The values of the engine knobs its space tunes (None without)."""
    imported: str | None = None
    """The result file it was imported from (``spectune import``); None: measured by spectune."""
    broken: tuple[str, ...] = ()
    """The limits it breaks (its SLOs, max_memory, min_kv_cache_tokens), by name."""
    peak_memory_bytes: int | None = None
    memory_kind: str | None = None
    """``gpu_weights``, ``gpu_device`` (``gpu`` in studies stored before) or ``host_rss``: what
    ``peak_memory_bytes`` measures."""
    kv_cache_tokens: int | None = None
    step_cost: list[dict[str, float]] | None = None
    """A baseline's step-cost curve: ``{batch, new_tokens, tokens, ms}`` per point (:mod:`spectune.stepcost`)."""
    step_cost_seconds: float | None = None
    """The engine time its curve took, after its measured windows."""
    bursty_delivery: bool = False
    """Its tokens reached the client in bursts (:attr:`spectune.measurement.Measurement.bursty_delivery`)."""
    fidelity: dict[str, Any] | None = None
    """Its answers against the baseline's (:class:`spectune.answers.Fidelity`); None: not checked."""

    @property
    def answers(self) -> Fidelity | None:
        return Fidelity.model_validate(self.fidelity) if self.fidelity is not None else None

    @property
    def memory(self) -> str:
        """Its peak memory for a person: ``3.1 GiB`` (GPU) or ``2.1 GiB host`` (a CPU engine's RSS)."""
        if self.peak_memory_bytes is None:
            return "-"
        suffix = {"gpu_weights": " weights", "gpu_device": "", "gpu": ""}.get(self.memory_kind or "", " host")
        return f"{self.peak_memory_bytes / 2**30:.2f} GiB{suffix}"

    @property
    def is_baseline(self) -> bool:
        return self.spec.get("method", "none") == "none"

    @property
    def config_key(self) -> str:
        """Equal for the trials of one configuration (a confirmation and the trial it confirms):
        its speculative configuration and engine knobs."""
        return candidate_key(self.spec, self.engine)

    @property
    def note(self) -> str:
        """What a person should know beside the trial's figures (``show``, the report)."""
        note = self.fail_reason or ("" if self.feasible else f"breaks {', '.join(self.broken) or 'the SLO'}")
        if ANSWERS in self.broken and (answers := self.answers) is not None:
            note += f" ({', '.join(filter(None, (answers.label, answers.kinds())))}; {answers.where()})"
        if self.bursty_delivery:
            burst = "tokens reached the client in bursts: its TTFT and TPOT are the delivery's"
            note = f"{note}; {burst}" if note else burst
        if self.imported is not None:
            note = f"imported from {Path(self.imported).name}" + (f"; {note}" if note else "")
        if self.duplicate_of is not None:
            return f"same candidate as #{self.duplicate_of}"
        if self.confirms is not None:
            why = f", {self.recheck_reason}" if self.recheck_reason else ", outside its predicted interval" if self.recheck else ""
            return f"again on a fresh engine, as #{self.confirms}{why}" + (f": {note}" if note else "")
        return note


@dataclass(frozen=True)
class Engines:
    """One configuration as measured on every engine that ran it: its first trial (``row``) and
    the first objective of each (more than one after ``confirm``)."""

    row: TrialRow
    values: list[float]
    numbers: list[int]
    """The trials, the first one (``row``) first."""
    noise: float
    """Relative noise: the windows' (mean over engines, :data:`NOISE_FLOOR` when unknown), or
    the spread between engines (standard deviation over mean) when that is larger; measured on
    one engine, at least the study's :func:`engine_spread` (:meth:`StudyView.engines`)."""
    feasible: bool

    @property
    def value(self) -> float:
        return statistics.fmean(self.values)

    @classmethod
    def of(cls, rows: list[TrialRow]) -> Engines:
        values = [(r.values or [math.nan])[0] for r in rows]
        window = statistics.fmean(r.noise if r.noise is not None else NOISE_FLOOR for r in rows)
        mean = statistics.fmean(values)
        spread = statistics.stdev(values) / abs(mean) if len(values) > 1 and mean else 0.0
        return cls(rows[0], values, [r.number for r in rows], max(window, spread), all(r.feasible for r in rows))



def trial_row(t: optuna.trial.FrozenTrial, trial_id: int | None) -> TrialRow:
    """An Optuna trial as a row, with its id in spectune's own table (None: nothing recorded)."""
    r = TrialRecord.of(t)
    return TrialRow(
        number=t.number, trial_id=trial_id, state=t.state.name, label=r.config or "?", spec=r.spec or {},
        values=list(t.values) if t.values is not None else None, speedup=r.speedup, noise=r.noise,
        acceptance_rate=r.acceptance_rate, mean_acceptance_length=r.mean_acceptance_length,
        feasible=r.feasible is not False, duplicate_of=r.duplicate_of, fail_reason=r.fail_reason,
        predicted=r.predicted, confirms=r.confirms, recheck=r.recheck is not None, recheck_reason=r.recheck,
        placement=r.placement.label() if r.placement is not None else None,
        engine=r.engine, imported=r.imported, broken=tuple(k for k, v in (r.constraints or {}).items() if v > 0),
        peak_memory_bytes=r.peak_memory_bytes, memory_kind=r.memory_kind, kv_cache_tokens=r.kv_cache_tokens,
        step_cost=r.step_cost, step_cost_seconds=r.step_cost_seconds,
        bursty_delivery=r.bursty_delivery is True, fidelity=r.fidelity,
    )


MACHINE_GROUPS_SECONDS = 60.0
"""How long :func:`machine_groups` keeps what it read: a worker builds a view of its study for each
decision, and the other studies of its storage change little meanwhile."""

_machine_cache: dict[tuple[str, str, str, str], tuple[float, list[list[float]]]] = {}


def machine_groups(store: MeasurementStore, url: str, key: str, objective: str, *, skip: str) -> list[list[float]]:
    """The first objective of each configuration that the other studies in the storage at ``url``
    (all but ``skip``) measured on two engines or more on the machine ``key``
    (:func:`spectune.noise.machine_key`), in studies of the same first ``objective``. Imported
    trials and copies of another trial count not. Read again after :data:`MACHINE_GROUPS_SECONDS`."""
    asked, now = (url, key, objective, skip), time.monotonic()
    if (kept := _machine_cache.get(asked)) is not None and now - kept[0] < MACHINE_GROUPS_SECONDS:
        return kept[1]
    out = _read_machine_groups(store, url, key, objective, skip)
    _machine_cache[asked] = (now, out)
    return out


def _read_machine_groups(store: MeasurementStore, url: str, key: str, objective: str, skip: str) -> list[list[float]]:
    import optuna

    rdb = open_optuna_storage(url)
    out: list[list[float]] = []
    for summary in optuna.get_all_study_summaries(rdb, include_best_trial=False):
        if summary.study_name == skip or (StudyRecord.of(summary).objectives or [None])[0] != objective:
            continue
        ids = store.trial_ids(summary.study_name)
        trials = rdb.get_all_trials(rdb.get_study_id_from_name(summary.study_name), deepcopy=False,
                                    states=(optuna.trial.TrialState.COMPLETE,))
        groups: dict[str, list[TrialRow]] = {}
        for r in (trial_row(t, ids.get(t.number)) for t in trials):
            if r.values and r.duplicate_of is None and r.imported is None and r.trial_id is not None:
                groups.setdefault(r.config_key, []).append(r)
        for rows in groups.values():
            here = [r.values[0] for r in rows if len(rows) > 1 and r.values
                    and (m := store.measurement(r.trial_id)) is not None and machine_key(m) == key]
            if len(here) > 1:
                out.append(here)
    return out


@dataclass(frozen=True)
class Choice:
    """The configuration to deploy, and why."""

    row: TrialRow
    baseline: TrialRow
    is_baseline: bool
    reason: str
    noise_band: float
    """Relative half-width of the band the decision rests on: :func:`paired_band` of the choice
    and the baseline where their requests pair up (``band_kind`` "paired band"), else the sum of
    their noises ("noise band")."""
    value: float = math.nan
    """The first objective the decision rests on: the mean over the configuration's engines."""
    speedup: float | None = None
    """``value`` against the baseline's mean (> 1 is better, :func:`speedup`)."""
    engines: list[float] = field(default_factory=list)
    """The first objective on each engine that measured the chosen configuration."""
    baseline_engines: list[float] = field(default_factory=list)
    band_kind: str = "noise band"
    within_band: bool = False
    """The baseline is chosen because the best speculative configuration's gain lies within the band."""
    spread: EngineSpread | None = None
    """The engine spread the band rests on, with where it came from."""

    @property
    def engine_spread(self) -> float | None:
        """How much engine starts of one configuration differ where measured (None on the prior
        alone): the least noise of a configuration measured once."""
        return self.spread.measured if self.spread is not None else None

    @property
    def interval(self) -> tuple[float, float] | None:
        """The gain's interval, ``noise_band`` a half-width on its log (None without a gain)."""
        return interval(self.speedup, self.noise_band) if self.speedup is not None else None

    @property
    def gain_text(self) -> str | None:
        """``1.57x, 1.27-1.94x``: the gain and its interval (None without a gain)."""
        return interval_text(self.speedup, self.noise_band) if self.speedup is not None else None


@dataclass(frozen=True)
class LevelRow:
    """One level of a load mix (:attr:`~spectune.config.WorkloadSpec.is_mix`): the choice there
    against the baseline there, and the configuration measured best at that level alone."""

    level: float
    """The level's key: its concurrency, or its request rate (:attr:`name` says which)."""
    name: str
    """The level as a user reads it: ``concurrency 4``, ``0.5 requests/s``."""
    weight: float
    value: float
    """The choice's first objective at this level, its mean over its engines."""
    baseline: float
    speedup: float
    best: str
    """The feasible configuration measured best at this level (the choice where it is)."""
    best_speedup: float
