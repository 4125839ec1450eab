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
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spectune._util import parse_yaml
from spectune.config import ENGINE_KNOBS, SpecConfig, candidate_label, parse_spec
from spectune.errors import ConfigError, EngineError, StorageError
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
                data = json.loads(f.read_text(encoding="utf-8-sig"))
            except OSError as e:
                raise ConfigError(f"{f}: cannot read: {e.strerror or e}") from e
            except UnicodeDecodeError as e:
                raise ConfigError(f"{f}: not UTF-8 text: {e.reason} at byte {e.start}") from e
            except json.JSONDecodeError as e:
                raise ConfigError(f"{f}: not JSON: {e.msg} at line {e.lineno} column {e.colno}") from e
            except RecursionError as e:
                raise ConfigError(f"{f}: not JSON: nested too deeply") from e
            except ValueError as e:  # a number of more than 4300 digits
                raise ConfigError(f"{f}: not JSON: {str(e).split(':')[0]}") from e
            if not isinstance(data, dict) or "output_throughput" not in data:
                raise ConfigError(f"{f}: not a vllm bench serve result (no output_throughput)")
            out.append((f, data))
    return out


def _value(raw: Any, where: str) -> Any:
    """A metadata value (``--metadata`` saves strings) as YAML reads it: 32, true, a JSON object.

    Raises:
        ConfigError: a string that is no YAML (one line naming ``where``).
    """
    return parse_yaml(raw, where) if isinstance(raw, str) else raw


def _number(data: Mapping[str, Any], key: str, path: Path, *, default: float | None = None,
            required: bool = False) -> float | None:
    """``data[key]`` as a finite number >= 0 (a count, a rate, a latency); ``default`` where the
    file has none.

    Raises:
        ConfigError: a value that is no such number, or a missing ``required`` one.
    """
    value = data.get(key)
    if value is None:
        if required:
            raise ConfigError(f"{path}: {key}: missing; not a complete vllm bench serve result")
        return default
    try:
        number = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan
    except OverflowError:  # an integer beyond any float
        number = math.nan
    if not math.isfinite(number) or number < 0:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise ConfigError(f"{path}: {key}: expected a finite number >= 0, got {shown}")
    return number


def _count(data: Mapping[str, Any], key: str, path: Path) -> int:
    """``data[key]`` as a whole count (0 where the file has none)."""
    value = _number(data, key, path, default=0.0)
    assert value is not None
    if value != int(value):
        raise ConfigError(f"{path}: {key}: expected a whole number, got {data[key]!r}")
    return int(value)


def _candidate(path: Path, data: Mapping[str, Any], ctx: StudyContext, spec: SpecConfig | None,
               knobs: Mapping[str, Any]) -> tuple[SpecConfig, dict[str, Any]]:
    raw = data.get("speculative_config", data.get("speculative-config"))
    if spec is None and raw not in (None, ""):
        try:
            text = raw if isinstance(raw, str) else json.dumps(raw, allow_nan=False)
        except ValueError:
            raise ConfigError(f"{path}: speculative_config: not JSON: it holds NaN or an infinity") from None
        try:
            spec = parse_spec(text)
        except ConfigError as e:
            raise ConfigError(f"{path}: speculative_config: {str(e).removeprefix('--spec: ')}") from None
    if spec is None:
        if data.get("spec_decode_num_drafts"):
            raise ConfigError(f"{path}: speculative_config: the file drafted tokens but does not say how "
                              "(vllm bench serve --metadata speculative_config='{...}'); give --spec")
        spec = SpecConfig()
    chosen: dict[str, Any] = {}
    for name in ctx.space.knobs:
        value = knobs.get(name, _value(data.get(name, data.get(name.replace("_", "-"))), f"{path}: {name}"))
        if value is None:
            raise ConfigError(f"{path}: {name}: the study tunes it and the file does not say it "
                              f"(--metadata {name}=VALUE); give --engine-arg {name}=VALUE")
        chosen[name] = value
    try:
        space = ctx.current_space()  # a result past an edge guided search widened is a candidate too
        space.params_of(spec)
        space.engine_params_of(chosen)
    except ConfigError as e:
        raise ConfigError(f"{path}: not a candidate of study {ctx.study.study_name}'s space: {e}") from None
    return spec, chosen


def _check_fits(path: Path, data: Mapping[str, Any], ctx: StudyContext, input_tokens: int | None) -> None:
    """Refuse a file that measured another model, workload or load than the study's."""
    wl = ctx.config.workload
    served = ctx.engine.served_model_name or ctx.config.target

    def refuse(field: str, theirs: Any, ours: Any) -> None:
        raise ConfigError(f"{path}: {field} {theirs!r} differs from the study's {ours!r}; nothing imported")

    if wl.is_mix:  # a result file measured one load; the study's objective weighs several
        raise ConfigError(f"{path}: the study measures a load mix ({', '.join(wl.level_name(k) for k in wl.levels)}); a vllm bench "
                          "result measured one load and cannot stand for it; nothing imported")
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
    rate = math.inf if rate in (None, "inf") else rate  # a number: _check_figures
    if rate != (wl.request_rate or math.inf):
        refuse("request_rate", data.get("request_rate"), wl.request_rate or "inf")
    named = data.get("workload", data.get("dataset"))
    if named is not None and named not in (wl.name, wl.source):
        refuse("workload", named, wl.name)
    if input_tokens is not None and data.get("total_input_tokens") not in (None, input_tokens):
        refuse("total_input_tokens (the prompts)", data.get("total_input_tokens"), input_tokens)


_COUNTS = ("completed", "failed", "max_concurrency", "total_input_tokens", "total_output_tokens",
           "spec_decode_num_drafts", "spec_decode_draft_tokens", "spec_decode_accepted_tokens")
_LATENCIES = ("ttft", "tpot", "itl", "e2el")


def _check_figures(path: Path, data: Mapping[str, Any]) -> None:
    """Refuse a file whose figures are not what vllm bench writes (a finite number >= 0 where it
    writes one, whole counts, a positive duration), in one line naming the key: checked for
    every file before the study's storage is opened."""
    for key in ("duration", "output_throughput"):
        _number(data, key, path, required=True)
    if data["duration"] <= 0:
        raise ConfigError(f"{path}: duration: expected a number > 0, got {data['duration']!r}")
    for key in _COUNTS:
        _count(data, key, path)
    for key in ("request_throughput", "total_token_throughput",
                *(f"{stat}_{name}_ms" for name in _LATENCIES for stat in ("mean", "median", "p90", "p99"))):
        _number(data, key, path)
    _per_position(path, data)
    rate = data.get("request_rate")
    if rate not in (None, "inf") and (isinstance(rate, bool) or not isinstance(rate, int | float) or math.isnan(rate)):
        raise ConfigError(f"{path}: request_rate: expected a number or 'inf', got {rate!r}")


def _latency(path: Path, data: Mapping[str, Any], name: str) -> LatencyStats:
    return LatencyStats(count=_count(data, "completed", path), mean=_number(data, f"mean_{name}_ms", path),
                        median=_number(data, f"median_{name}_ms", path), p90=_number(data, f"p90_{name}_ms", path),
                        p99=_number(data, f"p99_{name}_ms", path))


def _per_position(path: Path, data: Mapping[str, Any]) -> list[float]:
    key = "spec_decode_per_position_acceptance_rates"
    rates = data.get(key) or []
    if not isinstance(rates, list):
        raise ConfigError(f"{path}: {key}: expected a list of numbers, got {type(rates).__name__}")
    return [_number({key: r}, key, path) or 0.0 for r in rates]


def _measurement(path: Path, data: Mapping[str, Any], ctx: StudyContext, spec: SpecConfig,
                 knobs: dict[str, Any]) -> Measurement:
    """The file's figures (:func:`_check_figures`) as a Measurement of one window (it has no
    per-request records)."""
    drafts, drafted = _count(data, "spec_decode_num_drafts", path), _count(data, "spec_decode_draft_tokens", path)
    accepted = _count(data, "spec_decode_accepted_tokens", path)
    acceptance = AcceptanceStats(
        num_drafts=drafts, num_draft_tokens=drafted, num_accepted_tokens=accepted,
        acceptance_rate=accepted / drafted, mean_acceptance_length=1.0 + accepted / drafts,
        per_position=_per_position(path, data),
    ) if drafts > 0 and drafted > 0 else None
    ttft, tpot, itl, e2el = (_latency(path, data, n) for n in _LATENCIES)
    duration = _number(data, "duration", path, required=True)
    throughput = _number(data, "output_throughput", path, required=True)
    assert duration is not None and throughput is not None
    window = WindowStats(duration_seconds=duration, output_throughput=throughput,
                         tpot_median_ms=tpot.median, tpot_p99_ms=tpot.p99, ttft_median_ms=ttft.median,
                         ttft_p99_ms=ttft.p99, e2el_median_ms=e2el.median, e2el_p99_ms=e2el.p99)
    completed, failed = _count(data, "completed", path), _count(data, "failed", path)
    concurrency = _count(data, "max_concurrency", path) or completed
    try:
        started = dt.datetime.strptime(str(data.get("date")), "%Y%m%d-%H%M%S").replace(tzinfo=dt.timezone.utc)
    except ValueError:
        started = dt.datetime.fromtimestamp(path.stat().st_mtime, dt.timezone.utc)
    engine = ctx.engine.model_copy(update=knobs) if knobs else ctx.engine
    return Measurement(
        spec=spec, engine=engine, workload=ctx.config.workload, concurrency=concurrency,
        command=["vllm", "bench", "serve", f"(imported from {path.name})"], log_path=None, started_at=started,
        startup_seconds=0.0, duration_seconds=duration, num_requests=completed + failed,
        num_failed=failed, input_tokens=_count(data, "total_input_tokens", path),
        output_tokens=_count(data, "total_output_tokens", path), output_throughput=throughput,
        request_throughput=_number(data, "request_throughput", path, default=0.0),
        total_token_throughput=_number(data, "total_token_throughput", path, default=0.0), ttft_ms=ttft, tpot_ms=tpot,
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
    records = read_results(paths)
    for path, data in records:  # a file that is no result is refused before the storage is opened
        _check_figures(path, data)
    ctx = join_study(storage, study_name)
    tokens = _study_input_tokens(ctx)
    todo = []
    for path, data in records:
        _check_fits(path, data, ctx, tokens)
        chosen_spec, chosen_knobs = _candidate(path, data, ctx, spec, knobs)
        item = Imported(path, chosen_spec, chosen_knobs, _measurement(path, data, ctx, chosen_spec, chosen_knobs))
        for objective in ctx.config.objectives:  # what the trial is told, known before any trial is asked
            try:
                objective.of(item.measurement)
            except EngineError:
                raise ConfigError(f"{path}: the study's objective {objective.value}: the file has no value for it; "
                                  "nothing imported") from None
        todo.append(item)
    for item in todo:
        _write(ctx, item)
    return todo


def _write(ctx: StudyContext, item: Imported) -> None:
    """One imported result as a completed trial, with its measurement in spectune's table."""
    study, space = ctx.study, ctx.current_space()
    params = {**space.params_of(item.spec), **space.engine_params_of(item.knobs)}
    study.enqueue_trial(params, user_attrs=TrialRecord(imported=str(item.path)).attrs())
    with warnings.catch_warnings():  # heartbeats are for running trials; this one is told at once
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
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
