"""A warm start from results a team already has: the JSON that ``vllm bench serve --save-result``
writes, and the result folders of ``vllm bench sweep serve``, as completed trials of a study.

Each file must describe the study's measurement: the same model (``model_id``), the same load
(``max_concurrency``, ``request_rate``), the same number of prompts, and, where the file says
(``--metadata workload=NAME``) or the study has measured trials of its own, the same prompts (the
prompts' total tokens are compared). Its speculative configuration comes from the file
(``--metadata speculative_config='{...}'``, or a sweep's ``speculative_config`` parameter) or the
command line, its engine knobs likewise; the candidate must be one of the study's space. Every
file is checked before anything is written: one that does not fit is refused in one line naming
the field, and nothing is imported.

An imported trial is a completed trial like any other, marked ``imported`` with its file (shown
by ``spectune show``, the report and the dashboard). Guided search plans with it: a candidate
imported is not measured again, and its measurement moves the models' predictions.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from spectune.config import ENGINE_KNOBS, SpecConfig, candidate_label, parse_spec
from spectune.errors import ConfigError, StorageError
from spectune.measurement import (
    AcceptanceStats,
    Hardware,
    LatencyStats,
    Measurement,
    Versions,
    WindowStats,
    candidate_key,
    relative_noise,
)
from spectune.objective import headline, trial_id
from spectune.records import RECORD_VERSION, TrialRecord, write_fields
from spectune.study import StudyContext, join_study

__all__ = ["Imported", "import_results", "read_results"]


@dataclass(frozen=True)
class Imported:
    """One result file as a candidate of the study, ready to be written."""

    path: Path
    spec: SpecConfig
    knobs: dict[str, Any]
    measurement: Measurement

    @property
    def label(self) -> str:
        return candidate_label(self.spec, self.knobs)


def read_results(paths: Sequence[Path]) -> list[tuple[Path, dict[str, Any]]]:
    """The result records of ``paths``: a ``vllm bench serve`` result file each, or a ``vllm
    bench sweep`` result folder (its ``run=N.json`` files, the parameters it swept in each).

    Raises:
        ConfigError: a path that does not exist, holds no result, or is not a JSON object.
    """
    out: list[tuple[Path, dict[str, Any]]] = []
    for path in paths:
        files = sorted(path.rglob("run=*.json")) if path.is_dir() else [path]
        if path.is_dir() and not files:
            raise ConfigError(f"{path}: no vllm bench sweep results (run=N.json) in this folder")
        for f in files:
            try:
                data = json.loads(f.read_text(encoding="utf-8"))
            except OSError as e:
                raise ConfigError(f"{f}: cannot read: {e.strerror or e}") from e
            except ValueError as e:
                raise ConfigError(f"{f}: not JSON: {e}") from e
            if not isinstance(data, dict) or "output_throughput" not in data:
                raise ConfigError(f"{f}: not a vllm bench serve result (no output_throughput)")
            out.append((f, data))
    return out


def _value(raw: Any) -> Any:
    """A metadata value (``--metadata`` saves strings) as YAML reads it: 32, true, a JSON object."""
    return yaml.safe_load(raw) if isinstance(raw, str) else raw


def _candidate(path: Path, data: Mapping[str, Any], ctx: StudyContext, spec: SpecConfig | None,
               knobs: Mapping[str, Any]) -> tuple[SpecConfig, dict[str, Any]]:
    raw = data.get("speculative_config", data.get("speculative-config"))
    if spec is None and raw not in (None, ""):
        spec = parse_spec(json.dumps(_value(raw)) if not isinstance(raw, str) else raw)
    if spec is None:
        if data.get("spec_decode_num_drafts"):
            raise ConfigError(f"{path}: speculative_config: the file drafted tokens but does not say how "
                              "(vllm bench serve --metadata speculative_config='{...}'); give --spec")
        spec = SpecConfig()
    chosen: dict[str, Any] = {}
    for name in ctx.space.knobs:
        value = knobs.get(name, _value(data.get(name, data.get(name.replace("_", "-")))))
        if value is None:
            raise ConfigError(f"{path}: {name}: the study tunes it and the file does not say it "
                              f"(--metadata {name}=VALUE); give --engine-arg {name}=VALUE")
        chosen[name] = value
    try:
        ctx.space.params_of(spec)
        ctx.space.engine_params_of(chosen)
    except ConfigError as e:
        raise ConfigError(f"{path}: not a candidate of study {ctx.study.study_name}'s space: {e}") from None
    return spec, chosen


def _check_fits(path: Path, data: Mapping[str, Any], ctx: StudyContext, input_tokens: int | None) -> None:
    """Refuse a file that measured another model, workload or load than the study's."""
    wl = ctx.config.workload
    served = ctx.engine.served_model_name or ctx.config.target

    def refuse(field: str, theirs: Any, ours: Any) -> None:
        raise ConfigError(f"{path}: {field} {theirs!r} differs from the study's {ours!r}; nothing imported")

    if data.get("model_id") not in (ctx.config.target, served):
        refuse("model_id", data.get("model_id"), served)
    if data.get("num_prompts") is not None and data["num_prompts"] != len(ctx.prompts):
        refuse("num_prompts", data["num_prompts"], len(ctx.prompts))
    concurrency = data.get("max_concurrency")
    if concurrency is None and wl.concurrency < len(ctx.prompts):  # all at once: only the study's if it sends all
        refuse("max_concurrency", None, wl.concurrency)
    if concurrency is not None and concurrency != wl.concurrency:
        refuse("max_concurrency", concurrency, wl.concurrency)
    rate = data.get("request_rate")
    rate = math.inf if rate in (None, "inf") else float(rate)
    if rate != (wl.request_rate or math.inf):
        refuse("request_rate", data.get("request_rate"), wl.request_rate or "inf")
    named = data.get("workload", data.get("dataset"))
    if named is not None and named not in (wl.name, wl.source):
        refuse("workload", named, wl.name)
    if input_tokens is not None and data.get("total_input_tokens") not in (None, input_tokens):
        refuse("total_input_tokens (the prompts)", data.get("total_input_tokens"), input_tokens)


def _latency(data: Mapping[str, Any], name: str) -> LatencyStats:
    return LatencyStats(count=int(data.get("completed") or 0), mean=data.get(f"mean_{name}_ms"),
                        median=data.get(f"median_{name}_ms"), p90=data.get(f"p90_{name}_ms"),
                        p99=data.get(f"p99_{name}_ms"))


def _measurement(path: Path, data: Mapping[str, Any], ctx: StudyContext, spec: SpecConfig,
                 knobs: dict[str, Any]) -> Measurement:
    """The file's figures as a Measurement of one window (it has no per-request records)."""
    drafts, drafted = int(data.get("spec_decode_num_drafts") or 0), int(data.get("spec_decode_draft_tokens") or 0)
    accepted = int(data.get("spec_decode_accepted_tokens") or 0)
    acceptance = AcceptanceStats(
        num_drafts=drafts, num_draft_tokens=drafted, num_accepted_tokens=accepted,
        acceptance_rate=accepted / drafted, mean_acceptance_length=1.0 + accepted / drafts,
        per_position=list(data.get("spec_decode_per_position_acceptance_rates") or []),
    ) if drafts > 0 and drafted > 0 else None
    ttft, tpot, itl, e2el = (_latency(data, n) for n in ("ttft", "tpot", "itl", "e2el"))
    window = WindowStats(duration_seconds=float(data["duration"]), output_throughput=float(data["output_throughput"]),
                         tpot_median_ms=tpot.median, tpot_p99_ms=tpot.p99, ttft_median_ms=ttft.median,
                         ttft_p99_ms=ttft.p99, e2el_median_ms=e2el.median, e2el_p99_ms=e2el.p99)
    completed, failed = int(data.get("completed") or 0), int(data.get("failed") or 0)
    try:
        started = dt.datetime.strptime(str(data.get("date")), "%Y%m%d-%H%M%S").replace(tzinfo=dt.timezone.utc)
    except ValueError:
        started = dt.datetime.fromtimestamp(path.stat().st_mtime, dt.timezone.utc)
    engine = ctx.engine.model_copy(update=knobs) if knobs else ctx.engine
    return Measurement(
        spec=spec, engine=engine, workload=ctx.config.workload, concurrency=int(data.get("max_concurrency") or completed),
        command=["vllm", "bench", "serve", f"(imported from {path.name})"], log_path=None, started_at=started,
        startup_seconds=0.0, duration_seconds=float(data["duration"]), num_requests=completed + failed,
        num_failed=failed, input_tokens=int(data.get("total_input_tokens") or 0),
        output_tokens=int(data.get("total_output_tokens") or 0), output_throughput=float(data["output_throughput"]),
        request_throughput=float(data.get("request_throughput") or 0.0),
        total_token_throughput=float(data.get("total_token_throughput") or 0.0), ttft_ms=ttft, tpot_ms=tpot,
        itl_ms=itl, e2el_ms=e2el, acceptance=acceptance, peak_memory_bytes=None,
        versions=Versions(spectune="imported", vllm=str(data["version"]) if data.get("version") else None,
                          torch=None, python="unknown"),
        hardware=Hardware(platform="imported", cpu=str(data.get("hardware") or "unknown"), cpu_count=0,
                          memory_bytes=None, gpus=[]),
        windows=[window], requests=[],
    )


def _study_input_tokens(ctx: StudyContext) -> int | None:
    """The prompts' total tokens as a trial of the study measured them (None before one did)."""
    for t in ctx.store.trials(ctx.study.study_name):
        m = t.measurement()
        if m is not None and m.num_failed == 0 and m.input_tokens and m.hardware.platform != "imported":
            return m.input_tokens
    return None


def import_results(storage: str | None, study_name: str, paths: Sequence[Path], *, spec: SpecConfig | None = None,
                   knobs: Mapping[str, Any] | None = None) -> list[Imported]:
    """Import every result of ``paths`` into study ``study_name`` as a completed trial; what was
    imported, in order. ``spec`` and ``knobs`` give the candidate where the files do not.

    Raises:
        ConfigError: a file that does not fit the study (model, workload, load, a candidate not in
            its space), or a knob that is not an engine knob; nothing is written then.
        StorageError: no such study, or one made before spectune stored its definition.
    """
    knobs = dict(knobs or {})
    if unknown := [k for k in knobs if k not in ENGINE_KNOBS]:
        raise ConfigError(f"--engine-arg {unknown[0]}: not an engine knob spectune tunes ({', '.join(ENGINE_KNOBS)})")
    ctx = join_study(storage, study_name)
    tokens = _study_input_tokens(ctx)
    todo = []
    for path, data in read_results(paths):
        _check_fits(path, data, ctx, tokens)
        chosen_spec, chosen_knobs = _candidate(path, data, ctx, spec, knobs)
        todo.append(Imported(path, chosen_spec, chosen_knobs, _measurement(path, data, ctx, chosen_spec, chosen_knobs)))
    for item in todo:
        _write(ctx, item)
    return todo


def _write(ctx: StudyContext, item: Imported) -> None:
    """One imported result as a completed trial, with its measurement in spectune's table."""
    study, space = ctx.study, ctx.space
    params = {**space.params_of(item.spec), **space.engine_params_of(item.knobs)}
    study.enqueue_trial(params, user_attrs=TrialRecord(imported=str(item.path)).attrs())
    trial = study.ask()
    space.suggest(trial)
    space.suggest_engine(trial)
    key = candidate_key(item.spec.to_vllm(), item.knobs)
    m = item.measurement
    objectives = ctx.config.objectives
    values = [o.of(m) for o in objectives]
    constraints = ctx.config.slo.violations(m)
    for name, value in constraints.items():
        trial.set_constraint(name, value)
    write_fields(trial, record_version=RECORD_VERSION, config=item.label, spec=item.spec.to_vllm() or {"method": "none"},
                 spec_key=key, engine=item.knobs or None)
    headline(m).model_copy(update={"noise": relative_noise(objectives[0], m), "constraints": constraints,
                                   "feasible": all(c <= 0 for c in constraints.values())}).write(trial)
    tid = trial_id(ctx.storage, study.study_name, trial.number)
    try:
        ctx.store.record(study_name=study.study_name, trial_id=tid, trial_number=trial.number, spec_key=key,
                         measurement=m)
    except StorageError:
        import optuna

        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        raise
    study.tell(trial, values if len(values) > 1 else values[0])
