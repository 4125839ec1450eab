"""Reading a study back: trial rows, the baseline, and the best feasible configuration.

Export, ``show`` and reports read from storage through here, never from an engine.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from spectune.answers import ANSWERS, AnswerRule, compare
from spectune.errors import ConfigError, EngineError, StorageError
from spectune.measurement import Objective, speedup
from spectune.noise import (
    BAND_Z,
    PRIOR_ENGINE_SPREAD,
    EngineSpread,
    SpreadPrior,
    band_of,
    engine_spread,
    engine_spread_note,
    estimate,
    interval,
    interval_text,
    machine_key,
    paired_band,
    paired_gap_error,
    pooled_spread,
    prior_for,
)
from spectune.records import StudyRecord
from spectune.rows import Choice, Engines, LevelRow, TrialRow, machine_groups, trial_row
from spectune.storage import MeasurementStore, open_optuna_storage, resolve_storage_url, safe_url

if TYPE_CHECKING:
    import optuna

    from spectune.measurement import Measurement

__all__ = ["BAND_Z", "PRIOR_ENGINE_SPREAD", "Choice", "EngineSpread", "Engines", "LevelRow", "StudyView", "TrialRow",
           "engine_spread", "engine_spread_note", "machine_groups", "open_study", "paired_band", "paired_gap_error",
           "pooled_spread", "speedup"]

class StudyView:
    """A study's trials with spectune's attributes, read from storage."""

    def __init__(self, study: optuna.Study, store: MeasurementStore, url: str) -> None:
        self.study = study
        self.store = store
        self.url = url
        self.objectives: list[str] = list(StudyRecord.of(study).objectives or study.metric_names or ["value"])
        self.directions = [d.name.lower() for d in study.directions]
        ids = store.trial_ids(study.study_name)
        self._engines: dict[bool, list[Engines]] = {}  # engines(), by confirmations, over the rows as they are
        self._spreads: dict[bool, EngineSpread] = {}
        self._machine: tuple[list[list[float]], SpreadPrior] | None = None  # other studies' groups here, the prior
        self.rows = [trial_row(t, ids.get(t.number)) for t in study.get_trials(deepcopy=False)]
        self.rows = self._answers_compared()
        self.rows = self.speedups()
        self._engines.clear()  # the rows now carry their speedups
        self._spreads.clear()

    @property
    def answer_rule(self) -> AnswerRule | None:
        """The study's :class:`~spectune.answers.AnswerRule`; None for a study stored before
        answers were checked."""
        rule = (StudyRecord.of(self.study).spectune_config or {}).get("answers")
        return AnswerRule(rule) if rule in {r.value for r in AnswerRule} else None

    def answers_note(self) -> str | None:
        """Why no answer was compared, where the study checks them and none was: its sampling."""
        workload = (StudyRecord.of(self.study).spectune_config or {}).get("workload") or {}
        t = (workload.get("sampling") or {}).get("temperature") or 0
        if self.answer_rule not in (None, AnswerRule.OFF) and t > 0:
            return f"answers not checked against the baseline's: the workload samples at temperature {t:g}"
        return None

    def _answers_compared(self) -> list[TrialRow]:
        """:attr:`rows`, each completed trial that finished before the baseline (another slot's)
        compared with it now, and ruled out where its answers break the study's rule."""
        rule = self.answer_rule
        late = [r for r in self.complete() if r.fidelity is None and r.trial_id is not None
                and r.duplicate_of is None and r.imported is None]
        base = self.baseline()
        if rule in (None, AnswerRule.OFF) or not late or base is None or self.answers_note() is not None \
                or (base_m := self.store.measurement(base.trial_id)) is None:
            return self.rows
        out = []
        for r in self.rows:
            if r in late and r.number != base.number and (m := self.store.measurement(r.trial_id)) is not None \
                    and (f := compare(base_m, m)) is not None:
                broken = r.broken + ((ANSWERS,) if f.broken(rule) and not r.is_baseline else ())
                r = replace(r, fidelity=f.model_dump(mode="json"), broken=broken, feasible=r.feasible and ANSWERS not in broken)
            out.append(r)
        return out

    @property
    def maximize(self) -> bool:
        """Whether the first objective is maximised."""
        return self.directions[0] == "maximize"

    def speedups(self) -> list[TrialRow]:
        """:attr:`rows` with each completed trial's speedup against the baseline's mean over the
        engines that measured it (``confirm`` measures it again); the trial attribute
        ``speedup`` the dashboard shows is against the baseline known when the trial ran."""
        base = next((c.value for c in self.engines() if c.row.is_baseline), None)
        return [replace(r, speedup=None if base is None or not r.values else _finite(speedup(self.maximize, r.values[0], base)))
                for r in self.rows]

    @property
    def name(self) -> str:
        return self.study.study_name

    def record(self) -> dict[str, Any]:
        """The study as JSON-ready data (``spectune show --json``): its objectives, every trial
        row, how far engines differ, and the choice with its reason (None before a baseline)."""
        try:
            choice = self.best()
        except ConfigError:
            choice = None
        return {
            "study": self.name, "storage": safe_url(self.url), "objectives": self.objectives, "directions": self.directions,
            "trials": [{**asdict(r), "note": r.note} for r in self.sorted_rows()],
            "engine_spread": self.spread().record(),
            "answers": {"rule": rule.value if (rule := self.answer_rule) is not None else None,
                        "not_checked": self.answers_note()},
            "best": None if choice is None else {
                "trial": choice.row.number, "config": choice.row.label, "spec": choice.row.spec,
                "is_baseline": choice.is_baseline, "reason": choice.reason, "value": choice.value,
                "speedup": choice.speedup, "interval": list(choice.interval) if choice.interval else None,
                "noise_band": choice.noise_band, "band_kind": choice.band_kind,
                "engines": choice.engines,
                "baseline_engines": choice.baseline_engines, "fidelity": choice.row.fidelity,
                "levels": [asdict(lv) for lv in levels] if (levels := self.levels(choice)) else None},
        }

    @property
    def placed(self) -> bool:
        """Whether the trials ran in more than one place (hosts, GPU groups): worth a column."""
        return len({r.placement for r in self.rows if r.placement is not None}) > 1

    def complete(self) -> list[TrialRow]:
        return [r for r in self.rows if r.state == "COMPLETE" and r.values is not None]

    def measured_rows(self, *, confirmations: bool = True) -> list[TrialRow]:
        """The completed trials that measured on an engine, in trial order (a suggestion answered
        from an earlier trial measured nothing). ``confirmations=False`` leaves out ``confirm``'s
        trials, which run after the search (guided search's own re-measurements stay): what the
        search itself measured, so that a resumed search does not change course because of them."""
        return sorted((r for r in self.complete() if r.duplicate_of is None
                       and (confirmations or r.confirms is None or r.recheck)), key=lambda r: r.number)

    def speculative_measurements(self, *, confirmations: bool = True) -> list[Measurement]:
        """The stored Measurements of the completed speculative configurations, one per engine
        that measured each (:meth:`measured_rows`): fits over them average a configuration
        measured twice."""
        rows = [r for r in self.measured_rows(confirmations=confirmations) if not r.is_baseline]
        return [m for r in rows if (m := self.store.measurement(r.trial_id)) is not None]

    def baseline(self) -> TrialRow | None:
        """The first completed baseline trial, one that spectune measured before an imported one
        (predictions replay its outputs, which a result file does not hold)."""
        rows = sorted((r for r in self.complete() if r.is_baseline and r.duplicate_of is None),
                      key=lambda r: (r.imported is not None, r.number))
        return rows[0] if rows else None

    def sorted_rows(self) -> list[TrialRow]:
        """Completed trials best first by the first objective, then the others by number."""
        sign = -1.0 if self.maximize else 1.0
        done = sorted(self.complete(), key=lambda r: sign * (r.values or [math.inf])[0])
        rest = [r for r in self.rows if r not in done]
        return done + rest

    def engines(self, *, confirmations: bool = True) -> list[Engines]:
        """Every completed configuration with its measurements on each engine, in trial order
        (:meth:`measured_rows`). Once some configuration was measured on two engines, one
        measured on a single engine is as uncertain as engines differ: its noise is at least
        :func:`engine_spread`. Built once per view and ``confirmations``."""
        if (known := self._engines.get(confirmations)) is not None:
            return list(known)
        configs = self._configs(confirmations)
        spread = self.spread(confirmations=confirmations).measured or 0.0
        self._engines[confirmations] = [replace(c, noise=max(c.noise, spread)) if len(c.values) == 1 else c
                                        for c in configs]
        return list(self._engines[confirmations])

    def _configs(self, confirmations: bool) -> list[Engines]:
        groups: dict[str, list[TrialRow]] = {}
        for r in self.measured_rows(confirmations=confirmations):
            groups.setdefault(r.config_key, []).append(r)
        return [Engines.of(rows) for rows in groups.values()]

    def spread(self, *, confirmations: bool = True) -> EngineSpread:
        """How much engine starts of one configuration differ here (:func:`spectune.noise.estimate`):
        this study's configurations measured on two engines or more (``confirmations=False``:
        without ``confirm``'s, as guided search plans), pooled with those earlier studies in this
        storage measured on the same machine (:func:`spectune.noise.machine_key` of the
        baseline's measurement), over the platform's prior. Built once per view."""
        if (known := self._spreads.get(confirmations)) is not None:
            return known
        if self._machine is None:  # the machine's groups and prior, read once per view
            base = self.baseline() or next(iter(self.measured_rows()), None)
            first = self.store.measurement(base.trial_id) if base is not None and base.trial_id is not None else None
            self._machine = ([] if first is None else
                             machine_groups(self.store, self.url, machine_key(first), self.objectives[0], skip=self.name),
                             prior_for(first.hardware.platform if first is not None else None))
        groups, prior = self._machine
        found = estimate([c.values for c in self._configs(confirmations)], groups, prior)
        self._spreads[confirmations] = found
        return found

    def best(self) -> Choice:
        """The best feasible configuration, or the baseline when nothing beats it beyond noise.

        One objective: the best value. Two: among the feasible Pareto front, the best first
        objective (the front itself is in the Optuna dashboard and the report). A configuration
        measured on several engines (``confirm``) counts with its mean, its noise with the
        spread between the engines; once a study has confirmations, the speculative
        configurations compete only if measured on two engines or more (all of them when no
        confirmation completed: the reason then says so). A configuration guided search measured
        again (a surprise, or its best before it stopped) counts as confirmed, but that
        re-measurement alone does not make a study confirming. Once some configuration was
        measured on two engines, one measured on a single engine (the baseline included) is as
        noisy as engines differ (:meth:`engines`). The best beats the baseline when its gain
        exceeds the band: :func:`paired_band` of the two (the gap per prompt, with the engine
        starts), or the sum of their noises where their requests do not pair up. When nothing
        beat the baseline, the band is that of its gap to the best speculative configuration.
        """
        base, candidates, confirming = self.contenders()
        if base is None:
            raise ConfigError(f"study {self.name} has no completed baseline trial to compare with")
        sign = 1.0 if self.maximize else -1.0
        best = max(candidates, key=lambda c: sign * c.value) if candidates else base
        found_spread = self.spread()
        spread = found_spread.value
        # the band of the gap between the baseline and the best speculative configuration (the
        # choice, or the runner-up when the baseline is best)
        rival = best if best is not base else max((c for c in candidates if c is not base),
                                                  key=lambda c: sign * c.value, default=None)
        found = self.paired_band(rival, base, spread) if rival is not None else None
        paired = found[0] if found is not None else None
        band = paired or best.noise + base.noise
        what = "paired band" if paired else "noise band"
        if found is not None and self.is_mix():
            what = "paired band over the load mix" if found[1] else "paired band of the headline level"
        gain = _finite(speedup(self.maximize, best.value, base.value))
        engines = (f", mean of {len(best.values)} engines" if len(best.values) > 1
                   else ", on one engine: no speculative configuration was confirmed feasible on a second"
                   if confirming else "")

        def choice(c: Engines, is_baseline: bool, reason: str, within: bool = False) -> Choice:
            return Choice(c.row, base.row, is_baseline, reason, band, c.value, 1.0 if c is base else gain,
                          c.values, base.values, what, within, found_spread)

        if best is base:
            faster = [c for c in self.engines() if not c.feasible and not c.row.is_baseline
                      and sign * c.value > sign * base.value]
            if faster:
                broken = sorted({name for c in faster for name in c.row.broken}) or ["the SLO"]
                return choice(base, True, f"no speculative configuration that meets the limits measured better "
                                          f"than the baseline ({len(faster)} that did break {', '.join(broken)})")
            return choice(base, True, "no speculative configuration measured better than the baseline")
        if not base.feasible and best.feasible:
            return choice(best, False, "the baseline breaks the SLO; this configuration meets it")
        if gain is None or interval(gain, band)[0] <= 1.0:
            sp = interval_text(gain, band) if gain is not None else "unknown"
            return choice(base, True, f"the best speculative configuration ({best.row.label}, {sp}{engines}) is "
                                      f"within the {what} of the baseline", gain is not None)
        return choice(best, False, f"{interval_text(gain, band)} the baseline{engines} ({what})")

    def choice_of(self, number: int) -> Choice:
        """Trial ``number``'s configuration as if chosen, held against the baseline as :meth:`best`
        holds its choice (its mean over its engines, the paired band of the two): what a team
        that deploys another configuration than the study's choice exports and verifies.

        Raises:
            ConfigError: no completed trial ``number``, or no baseline.
        """
        best = self.best()
        config = next((c for c in self.engines() if number in c.numbers), None)
        if config is None:
            done = ", ".join(str(c.row.number) for c in self.engines())
            raise ConfigError(f"study {self.name}: trial {number} measured nothing to export (measured trials: {done})")
        base = next(c for c in self.engines() if c.row.is_baseline)
        found_spread = self.spread()
        found = self.paired_band(config, base, found_spread.value) if config is not base else None
        band = found[0] if found is not None else config.noise + base.noise
        gain = 1.0 if config is base else _finite(speedup(self.maximize, config.value, base.value))
        said = "" if gain is None else f"{gain:.2f}x the baseline, "
        why = (f"trial {number} as asked ({said}{'breaks ' + ', '.join(config.row.broken) + '; ' if config.row.broken else ''}"
               f"the study's choice: {best.row.label})")
        return Choice(config.row, base.row, config is base, why, band, config.value, gain, config.values, base.values,
                      "paired band" if found is not None else "noise band", spread=found_spread)

    def paired_band(self, a: Engines, b: Engines, spread: float | None) -> tuple[float, bool] | None:
        """:func:`paired_band` of two configurations as measured in this study, and whether it
        covers the load mix (:func:`paired_gap_error`); None where their requests do not pair up:
        imported trials, or fewer than 3 prompts."""
        try:
            objective = Objective(self.objectives[0])
        except ValueError:  # a study of another tool's objective
            return None
        ids = {r.number: r.trial_id for r in self.rows}

        def measured(c: Engines) -> list[Measurement]:
            return [m for n in c.numbers if (m := self.store.measurement(ids.get(n))) is not None]

        found = paired_gap_error(measured(a), measured(b), objective)
        return (band_of(found[0], len(a.values), len(b.values), spread), found[1]) if found is not None else None

    def levels(self, choice: Choice) -> list[LevelRow] | None:
        """The load mix level by level: ``choice`` and the best at each level against the
        baseline; None when the study measures no mix (or its baseline has no levels stored)."""
        if not self.is_mix():  # its stored configuration says: nothing to load
            return None
        try:
            objective = Objective(self.objectives[0])
        except ValueError:  # a study spectune did not make
            return None

        def per_level(c: Engines) -> dict[float, float] | None:
            ms = [m for n in c.numbers if (r := self._row(n)) is not None and r.trial_id is not None
                  and (m := self.store.measurement(r.trial_id)) is not None]
            try:
                each = [lv for m in ms if (lv := objective.of_levels(m)) is not None]
            except EngineError:
                return None
            return {b: statistics.fmean(lv[b] for lv in each) for b in each[0]} if each else None

        configs = self.engines()
        base_c = next((c for c in configs if c.row.is_baseline), None)
        chosen = next((c for c in configs if c.row.number == choice.row.number), None)
        if base_c is None or chosen is None or (base := per_level(base_c)) is None \
                or (mine := per_level(chosen)) is None:
            return None
        m = self.store.measurement(chosen.row.trial_id) if chosen.row.trial_id is not None else None
        weights = m.workload.weights() if m is not None else {}
        others = {c.row.label: lv for c in configs if c.feasible and (lv := per_level(c)) is not None}
        out = []
        for b, v in mine.items():
            def gain(x: float, b: float = b) -> float:
                return speedup(self.maximize, x, base[b])
            best, best_v = max(((label, lv[b]) for label, lv in others.items() if b in lv),
                               key=lambda item: gain(item[1]), default=(chosen.row.label, v))
            name = m.workload.level_name(b) if m is not None else f"{b:g}"
            out.append(LevelRow(b, name, weights.get(b, math.nan), v, base[b], gain(v), best, gain(best_v)))
        return out

    def is_mix(self) -> bool:
        """Whether the study measures a load mix (from its stored configuration)."""
        workload = (StudyRecord.of(self.study).spectune_config or {}).get("workload")
        if not isinstance(workload, dict):
            return False
        levels = workload.get("concurrency_levels") or workload.get("request_rate_levels")
        return isinstance(levels, list) and len(levels) >= 2

    def _row(self, number: int) -> TrialRow | None:
        return next((r for r in self.rows if r.number == number), None)

    def contenders(self, *, on_front: Collection[int] = ()) -> tuple[Engines | None, list[Engines], bool]:
        """What :meth:`best` chooses among: the baseline (None before it completed), the
        configurations that compete (see there: the baseline when feasible, then the feasible
        speculative ones), and whether the study confirms.
        ``on_front``: trials counted on the Pareto front of two objectives beside Optuna's (one
        finishing now, which Optuna does not count until it is COMPLETE)."""
        configs = self.engines()
        base = next((c for c in configs if c.row.is_baseline), None)
        speculative = [c for c in configs if c.feasible and not c.row.is_baseline]
        if len(self.directions) > 1:
            front = {t.number for t in self.study.best_trials} | set(on_front)
            speculative = [c for c in speculative if front.intersection(c.numbers)]
        # a study with confirm: whose rechecks left confirm nothing to run (the baseline measured twice
        # before the first pick, the best's second engine failed) confirms all the same
        confirming = any(r.confirms is not None and not r.recheck for r in self.rows) \
            or ((StudyRecord.of(self.study).spectune_config or {}).get("confirm") or 0) > 0
        if confirming:  # a confirmation that failed or has not run leaves its configuration out
            speculative = [c for c in speculative if len(c.values) > 1] or speculative
        return base, ([base] if base is not None and base.feasible else []) + speculative, confirming


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def open_study(storage: str | None, study_name: str | None) -> StudyView:
    """Open an existing study for reading; with no name, the only (or newest) study there.
    Writes nothing: a SQLite file that does not exist is refused (StorageError)."""
    import optuna

    url = resolve_storage_url(storage, create=False)
    rdb = open_optuna_storage(url)
    store = MeasurementStore(url)  # refuses a database of a newer spectune first
    names = [s.study_name for s in optuna.get_all_study_summaries(rdb, include_best_trial=False)]
    if study_name is None:
        if not names:
            raise StorageError(f"no study in {safe_url(url)}")
        study_name = names[-1]
    elif study_name not in names:
        known = ", ".join(names) or "none"
        raise ConfigError(f"no study named {study_name!r} in {safe_url(url)} (studies: {known})")
    study = optuna.load_study(study_name=study_name, storage=rdb)
    return StudyView(study, store, url)
