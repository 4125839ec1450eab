"""``spectune verify best.yaml``: a deployment pipeline's gate on an exported configuration.

It starts the file's configuration exactly as the file says (the options ``vllm serve --config``
would read) and the same file without speculation, on the study's workload, and holds the two
against each other and against what the study claimed: the speedup within the study's band of
its claim (or above), the answers keeping the study's rule, the engine starting, its memory
under a limit. It names what differs from the study's record (vLLM, torch, spectune, the
processor or GPU), since that is why a pipeline verifies: a new version, a new machine.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spectune._util import load_yaml_file, validate
from spectune.answers import AnswerRule, compare
from spectune.config import EngineArgs, SpecConfig
from spectune.errors import ConfigError, EngineError, StorageError
from spectune.export import vllm_config
from spectune.measurement import Objective, speedup

if TYPE_CHECKING:
    from spectune.config import Prompt, WorkloadSpec
    from spectune.measurement import Measurement

__all__ = ["Verdict", "read_export", "verify"]

_logger = logging.getLogger(__name__)


@dataclass
class Verdict:
    """What ``verify`` found: whether the file holds, and the one line that says why."""

    holds: bool
    reason: str
    config: str
    speedup: float | None = None
    claimed: float | None = None
    band: list[float] | None = None
    """The study's interval on the gain, [low, high]: its claim widened by its band both ways."""
    fidelity: dict[str, Any] | None = None
    differences: list[str] = field(default_factory=list)
    measured: dict[str, Any] = field(default_factory=dict)
    """The objective on each engine, its peak memory, and the engine seconds spent."""

    def record(self) -> dict[str, Any]:
        return asdict(self)


def read_export(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The file's ``vllm serve --config`` mapping and the provenance written beside it.

    Raises:
        ConfigError: either file is missing or is not what ``spectune export`` writes.
    """
    config = load_yaml_file(path)
    if not isinstance(config, dict) or not isinstance(config.get("model"), str):
        raise ConfigError(f"{path}: not a vllm serve --config file with a model (spectune export writes one)")
    prov_path = path.with_name(path.stem + ".provenance.json")
    try:
        provenance = json.loads(prov_path.read_text())
    except OSError as e:
        raise ConfigError(f"{prov_path}: no provenance beside {path.name} ({e.strerror or e}); spectune export "
                          "writes both, and verify holds the file to what the study claimed there") from e
    except json.JSONDecodeError as e:
        raise ConfigError(f"{prov_path}: not JSON: {e.msg} at line {e.lineno}") from e
    if not isinstance(provenance, dict) or not isinstance(provenance.get("vllm_config"), dict):
        raise ConfigError(f"{prov_path}: not a spectune provenance record (no vllm_config)")
    return config, provenance


def _engine_and_spec(config: dict[str, Any], source: str) -> tuple[EngineArgs, SpecConfig]:
    """The file as spectune's engine arguments and speculative configuration, refused where the
    two would not start the engine with exactly the file's options."""
    options = {k: v for k, v in config.items() if k not in {"model", "speculative-config"}}
    fields = set(EngineArgs.model_fields) - {"model", "host", "extra_args", "env"}
    known = {k.replace("-", "_"): v for k, v in options.items() if k.replace("-", "_") in fields}
    extra = {k: v for k, v in options.items() if k.replace("-", "_") not in fields}
    engine = validate(EngineArgs, {**known, "model": config["model"], "extra_args": extra}, source)
    spec_data = config.get("speculative-config")
    if spec_data is None:
        spec = SpecConfig()
    elif not isinstance(spec_data, dict):
        raise ConfigError(f"{source}: speculative-config: expected a mapping")
    else:
        spec = validate(SpecConfig, {"method": "draft_model", **spec_data} if "method" not in spec_data and spec_data.get("model")
                        else spec_data, f"{source}: speculative-config")
    again = vllm_config(engine.model_dump(exclude={"host", "env"}), engine.model, spec.to_vllm() if not spec.is_baseline else None)
    if again != config:
        keys = sorted(k for k in config.keys() | again.keys() if config.get(k) != again.get(k))
        raise ConfigError(f"{source}: cannot start the engine with exactly the file's options ({', '.join(keys)})")
    return engine, spec


def _file_differences(config: dict[str, Any], measured: dict[str, Any]) -> list[str]:
    """The file's options that are not those the study measured, each as ``key: file X, measured Y``."""
    return [f"{k}: the file says {config.get(k)!r}, the study measured {measured.get(k)!r}"
            for k in sorted(config.keys() | measured.keys()) if config.get(k) != measured.get(k)]


def _record_differences(provenance: dict[str, Any]) -> list[str]:
    """What differs here from the study's record: versions, processor, GPUs."""
    from spectune.provenance import hardware, versions

    out = []
    now_v, then_v = versions().model_dump(), provenance.get("versions") or {}
    for key in ("vllm", "torch", "spectune"):
        if now_v.get(key) != then_v.get(key):
            out.append(f"{key} {now_v.get(key)} (the study: {then_v.get(key)})")
    now_h, then_h = hardware().model_dump(), provenance.get("hardware") or {}
    if now_h.get("cpu") != then_h.get("cpu"):
        out.append(f"processor {now_h.get('cpu')} (the study: {then_h.get('cpu')})")
    if set(now_h.get("cpu_features") or []) != set(then_h.get("cpu_features") or []):
        out.append(f"processor features {','.join(now_h.get('cpu_features') or []) or 'none'} "
                   f"(the study: {','.join(then_h.get('cpu_features') or []) or 'none'})")
    if (now_h.get("gpus") or []) != (then_h.get("gpus") or []):
        out.append(f"GPUs {', '.join(now_h.get('gpus') or []) or 'none'} "
                   f"(the study: {', '.join(then_h.get('gpus') or []) or 'none'})")
    return out


def _workload(provenance: dict[str, Any], storage: str | None, study: str | None,
              workload_file: str | None) -> tuple[WorkloadSpec, list[Prompt], int, AnswerRule]:
    """The study's workload and prompts (its stored definition; else the provenance's workload,
    read again, in one window), its repeats and its answer rule. ``workload_file`` replaces the
    prompts' source."""
    from spectune.config import Prompt, WorkloadSpec
    from spectune.storage import MeasurementStore, resolve_storage_url
    from spectune.workloads import load_prompts

    name = study or provenance.get("study")
    rule = AnswerRule((provenance.get("answers") or {}).get("rule") or AnswerRule.ROUNDING.value)
    workload = validate(WorkloadSpec, provenance.get("workload") or {}, "the provenance's workload")
    definition = None
    if workload_file is None and name:
        try:
            definition = MeasurementStore(resolve_storage_url(storage or provenance.get("storage"), create=False)).definition(name)
        except (StorageError, ConfigError) as e:
            _logger.info("the study's stored prompts cannot be read (%s): the provenance's workload is read again", e)
    if definition is not None:
        cfg = definition["config"]
        prompts = [validate(Prompt, p, f"study {name}") for p in definition["prompts"]]
        return validate(WorkloadSpec, cfg["workload"], f"study {name}"), prompts, int(cfg.get("repeats") or 1), rule
    if workload_file is not None:
        workload = workload.model_copy(update={"source": workload_file})
    return workload, load_prompts(workload), 1, rule


def verify(path: Path | str, *, storage: str | None = None, study: str | None = None, workload: str | None = None,
           max_memory: int | None = None, log_dir: Path = Path("storage/logs"), startup_timeout: float = 600.0,
           measure_fn: Callable[..., Measurement] | None = None) -> Verdict:
    """Verify the exported file at ``path`` here (:mod:`spectune.verify`).

    Raises:
        ConfigError: bad input: the file or its provenance, the workload, an option the engine
            could not be started with exactly.
    """
    from spectune.trial import measure

    path = Path(path)
    config, provenance = read_export(path)
    engine, spec = _engine_and_spec(config, str(path))
    label = spec.label()
    differences = _record_differences(provenance)
    if changed := _file_differences(config, provenance["vllm_config"]):
        return Verdict(False, f"{path.name} is not what the study measured: {changed[0]}", label,
                       differences=changed + differences)
    wl, prompts, repeats, rule = _workload(provenance, storage, study, workload)
    objective = Objective(next(iter(provenance.get("objectives") or {"output_throughput": 0})))
    claimed = provenance.get("speedup")
    band = provenance.get("noise_band")
    interval = [claimed * math.exp(-band), claimed * math.exp(band)] if claimed and band is not None else None
    run = measure_fn or measure
    t0 = time.perf_counter()
    try:
        base = run(engine, SpecConfig(), wl, prompts, log_dir=log_dir, startup_timeout=startup_timeout, repeats=repeats)
        m = base if spec.is_baseline else run(engine, spec, wl, prompts, log_dir=log_dir,
                                              startup_timeout=startup_timeout, repeats=repeats)
    except EngineError as e:
        return Verdict(False, f"an engine of {path.name} failed: {e.reason}", label, claimed=claimed, band=interval,
                       differences=differences)
    measured = {"objective": objective.value, "value": objective.of(m), "baseline": objective.of(base),
                "peak_memory_bytes": m.peak_memory_bytes, "memory_kind": m.memory_kind,
                "engine_seconds": round(time.perf_counter() - t0, 1)}
    if max_memory is not None and m.peak_memory_bytes is not None and m.peak_memory_bytes > max_memory:
        return Verdict(False, f"memory over the limit: {label} took {m.peak_memory_bytes / 2**30:.2f} GiB, the limit is "
                       f"{max_memory / 2**30:.2f} GiB", label, claimed=claimed, band=interval, differences=differences,
                       measured=measured)
    if spec.is_baseline:
        return Verdict(True, f"holds: {path.name} serves without speculation, as the study chose; its engine started",
                       label, speedup=1.0, claimed=claimed, band=interval, differences=differences, measured=measured)
    gain = speedup(objective.maximize, measured["value"], measured["baseline"])
    fidelity = compare(base, m)
    verdict = Verdict(True, "", label, speedup=gain, claimed=claimed, band=interval,
                      fidelity=fidelity.model_dump(mode="json") if fidelity else None, differences=differences,
                      measured=measured)
    said = f"{label} serves {gain:.3f}x the baseline" + (
        f" (the study: {claimed:.3f}x, {interval[0]:.2f}-{interval[1]:.2f}x)" if interval else "")
    answers = f"; answers {fidelity.summary()}" if fidelity is not None else ""
    if interval is not None and gain < interval[0]:
        verdict.holds, verdict.reason = False, f"speedup regressed: {said}"
    elif fidelity is not None and (line := fidelity.refusal(label, rule)) is not None:
        verdict.holds, verdict.reason = False, f"answers changed: {line} (rule {rule.value})"
    else:
        verdict.reason = f"holds: {said}{answers}"
    return verdict
