"""Parsing vLLM's Prometheus counters into acceptance figures."""

from __future__ import annotations

import pytest

from spectune.counters import SpecCounters, parse_counters


def _exposition(drafts: float, draft_tokens: float, accepted: float, per_pos: list[float]) -> str:
    lines = [
        "# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.",
        "# TYPE vllm:spec_decode_num_drafts counter",
    ]
    for engine in ("0", "1"):  # two engines (data parallel): values add up
        lines.append(f'vllm:spec_decode_num_drafts_total{{engine="{engine}",model_name="m"}} {drafts / 2}')
        lines.append(f'vllm:spec_decode_num_drafts_created{{engine="{engine}",model_name="m"}} 1.7e9')
    lines += [
        "# TYPE vllm:spec_decode_num_draft_tokens counter",
        f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {draft_tokens}',
        "# TYPE vllm:spec_decode_num_accepted_tokens counter",
        f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {accepted}',
        "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter",
    ]
    lines += [
        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="{i}"}} {v}'
        for i, v in reversed(list(enumerate(per_pos)))  # order in the text must not matter
    ]
    lines += ["# TYPE vllm:generation_tokens counter", 'vllm:generation_tokens_total{engine="0",model_name="m"} 999']
    return "\n".join(lines) + "\n"


def test_parse_sums_engines_orders_positions_and_ignores_created() -> None:
    c = parse_counters(_exposition(100, 300, 180, [80, 60, 40]))
    assert c.num_drafts == 100
    assert c.num_draft_tokens == 300
    assert c.num_accepted_tokens == 180
    assert c.accepted_per_pos == (80, 60, 40)
    assert c.generation_tokens == 999


def test_window_difference_gives_acceptance_of_the_window_only() -> None:
    before = parse_counters(_exposition(10, 30, 30, [10, 10, 10]))
    after = parse_counters(_exposition(110, 330, 210, [90, 70, 50]))
    acc = (after - before).acceptance()
    assert acc is not None
    assert acc.num_drafts == 100
    assert acc.acceptance_rate == pytest.approx(180 / 300)
    assert acc.mean_acceptance_length == pytest.approx(1 + 180 / 100)
    assert acc.per_position == pytest.approx([0.8, 0.6, 0.4])
    # the per-position shares add up to the accepted tokens per draft
    assert sum(acc.per_position) == pytest.approx(acc.mean_acceptance_length - 1)


def test_no_drafts_means_no_acceptance_figures() -> None:
    assert parse_counters("").acceptance() is None
    assert (SpecCounters(num_drafts=5) - SpecCounters(num_drafts=5)).acceptance() is None


def _cache_info(**labels: object) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in {"block_size": 16, "cache_dtype": "auto", **labels}.items())
    return ("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
            "# TYPE vllm:cache_config_info gauge\n"
            f'vllm:cache_config_info{{{inner},engine="0"}} 1.0\n'
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
            'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5\n')


def test_the_kv_cache_size_comes_from_the_cache_info_and_its_usage_from_the_gauge() -> None:
    from spectune.counters import parse_kv_cache

    kv = parse_kv_cache(_cache_info(num_gpu_blocks=1456, kv_cache_size_tokens=23296))
    assert kv.tokens == 23296 and kv.usage == 0.5  # the fullest engine
    older = parse_kv_cache(_cache_info(num_gpu_blocks=1456))  # before vLLM reported its size in tokens
    assert older.tokens == 1456 * 16
    assert parse_kv_cache(_cache_info(num_gpu_blocks="None")).tokens is None  # not profiled yet
    assert parse_kv_cache(_exposition(1, 1, 1, [1])).tokens is None


def _timing(prefill: tuple[float, float], tpot: tuple[float, float]) -> str:
    lines = []
    for name, (total, count) in (("request_prefill_time_seconds", prefill),
                                 ("request_time_per_output_token_seconds", tpot)):
        lines += [f"# TYPE vllm:{name} histogram",
                  f'vllm:{name}_bucket{{engine="0",le="0.05",model_name="m"}} {count / 2}',
                  f'vllm:{name}_bucket{{engine="0",le="+Inf",model_name="m"}} {count}',
                  f'vllm:{name}_count{{engine="0",model_name="m"}} {count}',
                  f'vllm:{name}_sum{{engine="0",model_name="m"}} {total}']
    return "\n".join(lines) + "\n"


def test_the_engine_cores_timing_is_its_histograms_means_over_the_window() -> None:
    before = parse_counters(_timing((0.4, 2), (0.05, 2)))  # the warm-up's requests
    after = parse_counters(_exposition(100, 300, 180, [80, 60, 40]) + _timing((1.6, 8), (0.29, 8)))
    assert after.num_drafts == 100  # the histograms do not disturb the counters
    timing = (after - before).timing()
    assert timing is not None and timing.requests == 6
    assert timing.prefill_ms == pytest.approx(200.0) and timing.tpot_ms == pytest.approx(40.0)
    # an engine without the histograms (or a window where none finished): no timing, not zeros
    assert parse_counters(_exposition(100, 300, 180, [80])).timing() is None
    assert (before - before).timing() is None
