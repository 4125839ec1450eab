"""Export the chosen configuration as a file ``vllm serve --config FILE`` accepts unchanged.

Top-level keys are vLLM's CLI option names; ``speculative-config`` is a nested mapping (vLLM
turns nested mappings into JSON arguments). A comment header summarises how it was measured;
the full record (study, trial, metrics, speedup, versions, hardware, workload, resolved
engine command) goes to a sibling ``<name>.provenance.json``. Both files are written
atomically: a failed export leaves an earlier file intact.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from spectune._util import atomic_write_text
from spectune.errors import ConfigError, StorageError
from spectune.notes import answers_line, edge_notes
from spectune.results import Choice, StudyView, TrialRow
from spectune.storage import safe_url

if TYPE_CHECKING:
    from spectune.measurement import Measurement

__all__ = ["PLATFORMS", "ExportResult", "batch_schedule", "export_best", "serve_env", "vllm_config"]


@dataclass(frozen=True)
class ExportResult:
    path: Path
    provenance_path: Path
    choice: Choice
    config: dict[str, Any]


def vllm_config(engine: dict[str, Any], model: str, spec: dict[str, Any] | None) -> dict[str, Any]:
    """The mapping for ``vllm serve --config``: model, engine options, speculative-config."""
    from spectune.config import EngineArgs

    args = EngineArgs.model_validate(engine)
    out: dict[str, Any] = {"model": model}
    out.update(args.to_vllm_options())
    if spec and spec.get("method", "none") != "none":
        out["speculative-config"] = dict(spec)
    return out


def _provenance_path(path: Path) -> Path:
    return path.with_name(path.stem + ".provenance.json")


def batch_schedule(view: StudyView, m: Measurement, baseline: Measurement, max_batch: int) -> dict[str, Any]:
    """The ``num_speculative_tokens_per_batch_size`` schedule of the measured candidate ``m``, with
    what it rests on.

    A study that swept concurrency levels measured each level's step cost and acceptance: the
    schedule comes from those (:func:`spectune.predict._schedule.measured_schedule`, over every
    ``k`` the study measured of ``m``'s proposer). Without a sweep, from its per-position
    acceptance and the proposer's cost ``c`` at the study's one concurrency, moved to other batch
    sizes by the roofline's shape (:func:`spectune.predict.derive_schedule`).

    Raises:
        ConfigError: ``m`` has no acceptance counters or baseline TPOT to derive it from.
    """
    from spectune.predict import (
        CostPoint,
        derive_schedule,
        fit_concurrency,
        fit_cost_model,
    )
    from spectune.predict._measured import effective_k, measured_profile, proposer_of
    from spectune.predict._schedule import level_costs, measured_schedule

    profile = measured_profile(m)
    t0 = baseline.tpot_ms.median
    k = effective_k(m.spec)
    if profile is None or not profile.per_position or not t0 or not k:
        raise ConfigError(f"{m.spec.label()}: no acceptance counters or baseline TPOT to derive a batch schedule from")
    measured = view.speculative_measurements()
    sweep = fit_concurrency(baseline, measured)
    same = [other for other in measured if proposer_of(other.spec) == proposer_of(m.spec)
            and other.engine.model_dump(exclude={"host", "env"}) == m.engine.model_dump(exclude={"host", "env"})]
    on = "throughput" if view.objectives[0] == "output_throughput" else "tpot"  # what the study optimises
    costs = level_costs(baseline, same, basis=on) if sweep is not None else []
    if len(costs) >= 2:  # up to the largest k measured of the proposer at every level, the choice's or not
        max_k = min(lc.profile.k for lc in costs)
        schedule = measured_schedule(costs, max_k=max_k, max_batch=max_batch,
                                     scale=lambda b: sweep.scale(m.spec.method, b, "throughput" if on == "throughput" else "tpot")[0])
        return {"num_speculative_tokens_per_batch_size": schedule.to_vllm(), "max_batch": max_batch,
                "levels": [lc.record() for lc in costs],
                "model": "measured at each level: t(b,k)/t(b,0) = 1 + overhead(b) + c(b) d, fitted over the "
                         f"proposer's k = {', '.join(map(str, sorted({x for lc in costs for x in lc.ks})))} "
                         f"on its {'output throughput' if on == 'throughput' else 'time per output token'}; "
                         "k(b) maximises tokens per step over step time (spectune.predict._schedule); between "
                         "levels each k's gain interpolated in log b, beyond them the cost moved by the sweep "
                         "model's growth"}
    points = [p for other in measured if (p := CostPoint.from_measurement(other)) is not None]
    cost = fit_cost_model(t0, baseline.output_throughput, points).proposers[(m.spec.method, m.spec.model)]
    cost_at = None
    if sweep is not None:
        def cost_at(b: float) -> float:
            return cost.c * sweep.scale(m.spec.method, b)[0]
    head = m.level_at(m.headline)  # at a request rate: the batch the engine ran
    b1 = head.batch if head is not None else m.concurrency
    schedule = derive_schedule(profile, c1=cost.c, measured_concurrency=b1,
                               max_batch=max_batch, max_k=min(k, len(profile.per_position)), cost_at=cost_at)
    if sweep is None:
        basis = ("t(b,k)/t(b,0) = 1 + c(b) k, c(b) = B b / (A + B b) fitted at the measured "
                 "concurrency; k(b) maximises E(k) / (1 + c(b) k) (spectune.predict._schedule)")
    else:
        basis = (f"t(b,k)/t(b,0) = 1 + c(b) k, c(b) = c g(b) with g from the sweep at concurrency "
                 f"{', '.join(f'{b:.3g}' for b in sweep.step.levels)} ({sweep.scale(m.spec.method, 1)[1]}); "
                 "k(b) maximises E(k) / (1 + c(b) k) (spectune.predict._concurrency)")
    return {"num_speculative_tokens_per_batch_size": schedule.to_vllm(), "c": cost.c,
            "c_from_trials": cost.n, "measured_concurrency": b1, "max_batch": max_batch,
            "model": basis}


def _engine_records(view: StudyView, row: TrialRow) -> list[dict[str, Any]]:
    """What each engine that measured ``row``'s configuration measured (more than one after
    ``confirm`` or a re-measurement), ``row``'s first."""
    group = next(e for e in view.engines() if e.row.number == row.number)
    by_number = {r.number: r for r in view.rows}
    out = []
    for number in group.numbers:
        r = by_number[number]
        m = view.store.measurement(r.trial_id)
        if m is None:
            raise StorageError(f"study {view.name}: trial {number} has no stored measurement in spectune_trials")
        out.append({
            "trial": number, "started_at": m.started_at.isoformat(),
            "objectives": dict(zip(view.objectives, r.values or [], strict=False)),
            "output_throughput": m.output_throughput,
            "acceptance": m.acceptance.model_dump() if m.acceptance else None,
            "latency_ms": {"ttft": m.ttft_ms.model_dump(), "tpot": m.tpot_ms.model_dump(),
                           "e2el": m.e2el_ms.model_dump()},
            "windows": [w.model_dump() for w in m.windows],
            "log_path": m.log_path,
        })
    return out


def _mean_objectives(names: list[str], records: list[dict[str, Any]]) -> dict[str, float]:
    """Each objective's mean over the engines of ``records`` (what the decision rests on)."""
    return {name: statistics.fmean(r["objectives"][name] for r in records) for name in names
            if all(name in r["objectives"] for r in records)}


def _mix_proposer(view: StudyView, m: Measurement) -> TrialRow | None:
    """Over a load mix whose choice is the baseline, the best feasible speculative configuration
    (its schedule may still speculate at the levels where it gains); None otherwise."""
    if not m.workload.is_mix:
        return None
    speculative = [c for c in view.engines() if c.feasible and not c.row.is_baseline and c.row.trial_id is not None]
    sign = 1.0 if view.maximize else -1.0
    return max(speculative, key=lambda c: sign * c.value).row if speculative else None


PLATFORMS = ("cpu", "gpu")
"""What ``export --for`` takes: the platform the exported file will be served on."""


def export_best(view: StudyView, path: Path | str, *, schedule_max_batch: int | None = None,
                trial: int | None = None, target: str | None = None) -> ExportResult:
    """Write the best feasible configuration of ``view`` (or the baseline, saying why) to ``path``.

    With ``schedule_max_batch``, a speculative choice also gets vLLM's
    ``num_speculative_tokens_per_batch_size`` for batch sizes 1..``schedule_max_batch``
    (:func:`batch_schedule`; vLLM reads it from 0.24). Over a load mix whose choice is the
    baseline, the best speculative configuration's schedule is exported where it speculates at
    some batch size: no static ``k`` pays at every level, yet one may at the quiet ones.

    ``trial``: that trial's configuration instead of the study's choice (:meth:`StudyView.choice_of`),
    its decision line saying so. ``target``: the platform the file is for (``cpu``, ``gpu``;
    default: the one measured on); on another, the settings spectune chose for the measuring
    platform alone (``enforce-eager``, ``kv-cache-memory-bytes``, a CPU's dtype) are left out.
    The engine's environment, where the configuration needs one, is written beside the file
    (:func:`_write_env`).

    Raises:
        ConfigError: no configuration to choose, an unknown ``target``, or ``path`` is a folder or
            cannot be written (an earlier export there is left as it was).
    """
    path = Path(path)
    if not path.name or path.is_dir():
        raise ConfigError(f"{path}: is a folder; give the file to write, e.g. best.yaml")
    if target is not None and target not in PLATFORMS:
        raise ConfigError(f"--for {target!r}: expected one of {', '.join(PLATFORMS)}")
    choice = view.best() if trial is None else view.choice_of(trial)
    row = choice.row
    m = view.store.measurement(row.trial_id)
    base_m = view.store.measurement(choice.baseline.trial_id)
    if m is None or base_m is None:
        raise StorageError(f"study {view.name}: trial {row.number} has no stored measurement in spectune_trials")
    config, schedule = _configured(view, choice, m, base_m, schedule_max_batch)
    measured_on = m.hardware.platform
    target = target or measured_on
    left_out = [] if target == measured_on else _measuring_platform_only(config, m)
    env = serve_env(m)
    header = _header(view, choice, m, path, schedule, target, left_out, env)
    text = "".join(f"# {line}\n" for line in header) + yaml.safe_dump(config, sort_keys=False)
    provenance = {**_provenance(view, choice, m, config, schedule), "for": target,
                  "left_out_for_target": left_out or None, "engine_env": env or None}
    _write_pair(path, text, provenance)
    if env:
        _write_env(path, env)
    return ExportResult(path=path, provenance_path=_provenance_path(path), choice=choice, config=config)


def _configured(view: StudyView, choice: Choice, m: Measurement, base_m: Measurement,
                schedule_max_batch: int | None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The vLLM mapping of ``choice`` and its batch schedule (None: not asked for, or none pays)."""
    row = choice.row
    config = vllm_config(m.engine.model_dump(exclude={"host", "env"}), m.engine.model, row.spec)
    schedule = None
    source = None if schedule_max_batch is None else row if not choice.is_baseline else _mix_proposer(view, m)
    if schedule_max_batch is not None and source is not None:
        m_source = m if source is row else view.store.measurement(source.trial_id)  # type: ignore[arg-type]
        if m_source is None:
            raise StorageError(f"study {view.name}: trial {source.number} has no stored measurement in spectune_trials")
        if source is row:
            schedule = batch_schedule(view, m_source, base_m, schedule_max_batch)
        else:  # the baseline chosen over a mix: speculation only at the batch sizes that gain, if any
            try:
                schedule = batch_schedule(view, m_source, base_m, schedule_max_batch)
            except ConfigError:  # no counters to derive one from: the baseline as chosen
                schedule = None
            if schedule is not None and any(k for _, _, k in schedule["num_speculative_tokens_per_batch_size"]):
                schedule["over_baseline_from_trial"] = source.number
                config = vllm_config(m_source.engine.model_dump(exclude={"host", "env"}), m.engine.model, source.spec)
            else:
                schedule = None
    if schedule is not None:
        ranges = schedule["num_speculative_tokens_per_batch_size"]
        spec_cfg = config["speculative-config"]
        spec_cfg["num_speculative_tokens_per_batch_size"] = ranges
        if "num_speculative_tokens" in spec_cfg and (top := max(k for _, _, k in ranges)) > 0:
            spec_cfg["num_speculative_tokens"] = top  # vLLM's upper limit: the schedule's largest k
    return config, schedule


def _measuring_platform_only(config: dict[str, Any], m: Measurement) -> list[str]:
    """Remove from ``config`` the options spectune set for the platform ``m`` was measured on
    (:attr:`Measurement.engine_defaults`: not the user's, not tuned); their option names."""
    names = [key.replace("_", "-") for key in m.engine_defaults]
    return [name for name in names if config.pop(name, None) is not None]


def serve_env(m: Measurement) -> dict[str, str]:
    """The environment the measured engine had from its configuration (the space's or study's
    ``engine: env:``), less where it ran (``CUDA_VISIBLE_DEVICES``): what serving it needs too."""
    from spectune.study import PLACEMENT_ENV

    return {k: v for k, v in m.engine.env.items() if k not in PLACEMENT_ENV}


def _env_paths(path: Path) -> tuple[Path, Path]:
    return path.with_name(path.stem + ".env"), path.with_name(path.stem + ".k8s-env.yaml")


def _write_env(path: Path, env: dict[str, str]) -> None:
    """``<name>.env`` (``KEY=VALUE`` lines, for ``env $(cat best.env) vllm serve --config best.yaml``
    or a systemd ``EnvironmentFile``) and ``<name>.k8s-env.yaml`` (a container's ``env:`` list)."""
    import shlex

    plain, k8s = _env_paths(path)
    try:
        atomic_write_text(plain, "".join(f"{k}={shlex.quote(v)}\n" for k, v in env.items()))
        atomic_write_text(k8s, yaml.safe_dump([{"name": k, "value": v} for k, v in env.items()], sort_keys=False))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{plain}: cannot write the engine's environment: {getattr(e, 'strerror', None) or e}") from e


def _header(view: StudyView, choice: Choice, m: Measurement, path: Path, schedule: dict[str, Any] | None,
            target: str, left_out: list[str], env: dict[str, str]) -> list[str]:
    """The comment lines above the YAML: what was chosen, why, and how it was measured."""
    row, objective = choice.row, view.objectives[0]
    plain, k8s = _env_paths(path)
    return [
        f"vllm serve --config {path.name}   (written by spectune)",
        f"study {view.name!r}, trial {row.number}: {row.label}",
        f"{objective} = {choice.value:.4g}" + (f", {choice.gain_text} the baseline ({choice.band_kind})"
                                               if choice.gain_text and not choice.is_baseline else "")
        + (f" (mean of {len(choice.engines)} engines)" if len(choice.engines) > 1 else ""),
        f"decision: {choice.reason}",
        *([choice.spread.note()] if choice.spread is not None else []),
        *([answers] if (answers := answers_line(view, choice)) is not None else []),
        f"workload {m.workload.source}: {m.num_requests} requests, max_tokens {m.workload.sampling.max_tokens}, "
        f"temperature {m.workload.sampling.temperature}, "
        + (f"a load mix of {', '.join(f'{m.workload.level_name(k)} ({w:.0%})' for k, w in m.workload.weights().items())}"
           if m.workload.is_mix else f"concurrency {m.concurrency}"),
        f"measured with vLLM {m.versions.vllm}, torch {m.versions.torch}, spectune {m.versions.spectune} "
        f"on {m.hardware.platform}: {m.hardware.cpu}" + (f", {', '.join(m.hardware.gpus)}" if m.hardware.gpus else ""),
        *([f"for {target}: left out {', '.join(left_out)}, set by spectune for the {m.hardware.platform} it was "
           f"measured on"] if left_out else
          (f"{key} set by spectune for this platform, {why}" for key, why in m.engine_defaults.items())),
        *([f"engine environment {' '.join(f'{k}={v}' for k, v in env.items())}: in {plain.name} "
           f"(env $(cat {plain.name}) vllm serve --config {path.name}) and {k8s.name} (a container's env:)"]
          if env else []),
        *([f"no static configuration beats the baseline over the mix; the schedule of trial "
           f"{schedule['over_baseline_from_trial']}'s proposer speculates where its levels measured a gain"]
          if schedule and "over_baseline_from_trial" in schedule else []),
        *([f"num_speculative_tokens_per_batch_size: k by batch size, "
           f"{'measured at concurrency ' + ', '.join(str(lv['batch']) for lv in schedule['levels']) if 'levels' in schedule else 'from the cost model'}"
           f"; num_speculative_tokens is its largest k"] if schedule else []),
        f"full record: {_provenance_path(path).name}",
    ]


def _provenance(view: StudyView, choice: Choice, m: Measurement, config: dict[str, Any],
                schedule: dict[str, Any] | None) -> dict[str, Any]:
    """The full record written beside the export (``<name>.provenance.json``)."""
    row = choice.row
    chosen, baseline = _engine_records(view, row), _engine_records(view, choice.baseline)
    return {
        "study": view.name,
        "storage": safe_url(view.url),
        "trial": row.number,
        "config": row.label,
        "is_baseline": choice.is_baseline,
        "decision": choice.reason,
        "noise_band": choice.noise_band,
        "band_kind": choice.band_kind,
        "engine_spread": choice.spread.record() if choice.spread is not None else None,
        "answers": {"rule": rule.value if (rule := view.answer_rule) is not None else None,
                    "line": answers_line(view, choice), "fidelity": row.fidelity},
        "objectives": _mean_objectives(view.objectives, chosen),
        "speedup": choice.speedup,
        "interval": list(choice.interval) if choice.interval else None,
        "engines": {"value": choice.value, "each": choice.engines, "baseline_each": choice.baseline_engines},
        "measurements": chosen,
        "baseline": {"trial": choice.baseline.number,
                     "objectives": _mean_objectives(view.objectives, baseline),
                     "measurements": baseline},
        "workload": m.workload.model_dump(mode="json"),
        "engine_command": m.command,
        "engine_defaults": m.engine_defaults,
        "versions": m.versions.model_dump(),
        "hardware": m.hardware.model_dump(),
        "vllm_config": config,
        "batch_schedule": schedule,
        "levels": [dataclasses.asdict(lv) for lv in levels] if (levels := view.levels(choice)) else None,
        "space_edges": edge_notes(view) or None,  # ranges widened past an edge, or what lies past one
    }


def _write_pair(path: Path, text: str, provenance: dict[str, Any]) -> None:
    """Write the provenance, then the file: a failure leaves the earlier pair, or neither."""
    prov = _provenance_path(path)
    try:
        earlier = prov.read_text() if prov.is_file() else None  # put back should best.yaml fail
        atomic_write_text(prov, json.dumps(provenance, indent=2, default=str) + "\n")
    except (OSError, ValueError) as e:  # ValueError: a NUL in the path
        raise ConfigError(f"{prov}: cannot write the export: {getattr(e, 'strerror', None) or e}") from e
    try:
        atomic_write_text(path, text)
    except (OSError, ValueError) as e:  # the earlier pair, or neither file
        if earlier is None:
            prov.unlink(missing_ok=True)
        else:
            try:
                atomic_write_text(prov, earlier)
            except OSError:
                prov.unlink(missing_ok=True)
        raise ConfigError(f"{path}: cannot write the export: {getattr(e, 'strerror', None) or e}") from e
