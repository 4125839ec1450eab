"""``export --for``: a file for the platform it will be served on, and the engine's environment
written beside it. The study is the tiny landscape replayed, its measurements as a CPU engine
records them (the platform's own settings, an environment the configuration needs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from spectune.errors import ConfigError
from spectune.export import export_best
from spectune.landscape import Landscape
from spectune.results import open_study
from spectune.worker import run_study

CPU_ONLY = {"enforce_eager": "eager: the CPU build captures no graphs",
            "kv_cache_memory_bytes": "536870912: the CPU build's KV cache",
            "dtype": "float32: this processor has no native bfloat16"}
ENV = {"ARCTIC_INFERENCE_ENABLED": "1", "CUDA_VISIBLE_DEVICES": "3"}


@pytest.fixture(scope="module")
def cpu_study(landscape: Landscape, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    tmp = tmp_path_factory.mktemp("for")
    answer = landscape.measurer()

    def on_cpu(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        m = answer(*args, **kwargs)
        engine = m.engine.model_copy(update={"enforce_eager": True, "kv_cache_memory_bytes": 2**29,
                                             "dtype": "float32", "env": ENV})
        return m.model_copy(update={"engine": engine, "engine_defaults": CPU_ONLY,
                                    "hardware": m.hardware.model_copy(update={"platform": "cpu"})})

    config = landscape.config(storage=f"sqlite:///{tmp / 's.db'}", study_name="for", sampler="grid",
                              trials=len(landscape.points), log_dir=str(tmp / "logs"))
    run_study(config, measure_fn=on_cpu)
    return open_study(config.storage, "for")


def test_an_export_for_gpu_leaves_out_the_cpus_own_settings_and_says_so(cpu_study, tmp_path: Path) -> None:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    here = export_best(cpu_study, tmp_path / "cpu.yaml")  # where it was measured: as measured
    assert here.config["enforce-eager"] is True and here.config["kv-cache-memory-bytes"] == 2**29
    gpu = export_best(cpu_study, tmp_path / "gpu.yaml", target="gpu")
    dropped = ("enforce-eager", "kv-cache-memory-bytes", "dtype")
    assert gpu.config == {k: v for k, v in here.config.items() if k not in dropped}
    header = [line for line in (tmp_path / "gpu.yaml").read_text().splitlines() if line.startswith("#")]
    assert "# for gpu: left out enforce-eager, kv-cache-memory-bytes, dtype, set by spectune for the cpu it was " \
           "measured on" in header
    assert not any("set by spectune for this platform" in line for line in header)
    provenance = json.loads(gpu.provenance_path.read_text())
    assert provenance["for"] == "gpu" and provenance["left_out_for_target"] == list(dropped)
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--config", str(tmp_path / "gpu.yaml")])
    assert args.enforce_eager is False and args.kv_cache_memory_bytes is None and args.dtype == "auto"


def test_the_engines_environment_is_written_beside_the_export_without_where_it_ran(cpu_study, tmp_path: Path) -> None:
    result = export_best(cpu_study, tmp_path / "best.yaml", target="gpu")
    assert (tmp_path / "best.env").read_text() == "ARCTIC_INFERENCE_ENABLED=1\n"
    assert yaml.safe_load((tmp_path / "best.k8s-env.yaml").read_text()) == [{"name": "ARCTIC_INFERENCE_ENABLED",
                                                                               "value": "1"}]
    assert json.loads(result.provenance_path.read_text())["engine_env"] == {"ARCTIC_INFERENCE_ENABLED": "1"}
    assert any(line.startswith("# engine environment ARCTIC_INFERENCE_ENABLED=1: in best.env")
               for line in (tmp_path / "best.yaml").read_text().splitlines())


def test_an_unknown_platform_is_refused_in_one_line_before_anything_is_written(cpu_study, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^--for 'tpu': expected one of cpu, gpu$"):
        export_best(cpu_study, tmp_path / "best.yaml", target="tpu")
    assert not list(tmp_path.iterdir())
