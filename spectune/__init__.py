"""spectune: find the speculative-decoding configuration that serves your model fastest on vLLM.

The Python API, beside the ``spectune`` command::

    import spectune

    config = spectune.load_study_config(None, {"target": "meta-llama/Llama-3.1-8B-Instruct",
                                               "workload": "humaneval", "trials": 12})
    result = spectune.optimize(config)                    # a study on real engines
    view = spectune.open_study(result.storage, result.study_name)
    print(view.best().reason)
    spectune.export_best(view, "best.yaml")               # for vllm serve --config best.yaml

    m = spectune.measure(engine, spec, workload, prompts, log_dir="logs")   # one configuration

Names are imported when first used, so ``import spectune`` stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spectune.config import EngineArgs, Prompt, SpecConfig, WorkloadSpec
    from spectune.errors import ConfigError, EngineError, SpectuneError, StorageError
    from spectune.export import export_best
    from spectune.measurement import SLO, Measurement, Objective
    from spectune.records import TrialRecord
    from spectune.results import Choice, StudyView, open_study
    from spectune.space import SearchSpace, load_space
    from spectune.study import StudyConfig, create_study, join_study, load_study_config
    from spectune.trial import measure
    from spectune.verify import Verdict, verify
    from spectune.worker import run_study, run_worker
    from spectune.workloads import load_prompts

    optimize = run_study

_PUBLIC = {
    "measure": ("spectune.trial", "measure"),
    "optimize": ("spectune.worker", "run_study"),
    "run_study": ("spectune.worker", "run_study"),
    "run_worker": ("spectune.worker", "run_worker"),
    "create_study": ("spectune.study", "create_study"),
    "join_study": ("spectune.study", "join_study"),
    "load_study_config": ("spectune.study", "load_study_config"),
    "StudyConfig": ("spectune.study", "StudyConfig"),
    "open_study": ("spectune.results", "open_study"),
    "StudyView": ("spectune.results", "StudyView"),
    "Choice": ("spectune.results", "Choice"),
    "export_best": ("spectune.export", "export_best"),
    "verify": ("spectune.verify", "verify"),
    "Verdict": ("spectune.verify", "Verdict"),
    "EngineArgs": ("spectune.config", "EngineArgs"),
    "SpecConfig": ("spectune.config", "SpecConfig"),
    "WorkloadSpec": ("spectune.config", "WorkloadSpec"),
    "Prompt": ("spectune.config", "Prompt"),
    "load_prompts": ("spectune.workloads", "load_prompts"),
    "SearchSpace": ("spectune.space", "SearchSpace"),
    "load_space": ("spectune.space", "load_space"),
    "Measurement": ("spectune.measurement", "Measurement"),
    "Objective": ("spectune.measurement", "Objective"),
    "SLO": ("spectune.measurement", "SLO"),
    "TrialRecord": ("spectune.records", "TrialRecord"),
    "SpectuneError": ("spectune.errors", "SpectuneError"),
    "ConfigError": ("spectune.errors", "ConfigError"),
    "EngineError": ("spectune.errors", "EngineError"),
    "StorageError": ("spectune.errors", "StorageError"),
}

__all__ = [
    "Choice",
    "ConfigError",
    "EngineArgs",
    "EngineError",
    "Measurement",
    "Objective",
    "Prompt",
    "SLO",
    "SearchSpace",
    "SpecConfig",
    "SpectuneError",
    "StorageError",
    "StudyConfig",
    "StudyView",
    "TrialRecord",
    "Verdict",
    "WorkloadSpec",
    "create_study",
    "export_best",
    "join_study",
    "load_prompts",
    "load_space",
    "load_study_config",
    "measure",
    "open_study",
    "optimize",
    "run_study",
    "run_worker",
    "verify",
]
assert set(__all__) == set(_PUBLIC)


def __getattr__(name: str) -> Any:
    try:
        module, attr = _PUBLIC[name]
    except KeyError:
        raise AttributeError(f"module 'spectune' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value  # once
    return value


def __dir__() -> list[str]:
    return [*globals(), *__all__]
