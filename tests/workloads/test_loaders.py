"""Prompt files: JSONL, vLLM bench custom, Spec-Bench, ShareGPT; format detection and selection; errors naming file and line."""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from prompt_files import conv, write_jsonl

from spectune.config import WorkloadSpec
from spectune.errors import ConfigError
from spectune.workloads import (
    detect_format,
    load_custom,
    load_file,
    load_jsonl,
    load_prompts,
    load_sharegpt,
    load_spec_bench,
)


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


def test_chat_prompts_sent_as_plain_text_are_warned_of(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Prompts with chat messages on the completions API lose their chat template: the study says so."""
    from spectune.study import load_study_config, plan_study

    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"id": "a", "messages": [{"role": "user", "content": "Copy this: x = 1"}]}) + "\n"
                    + json.dumps({"id": "b", "messages": [{"role": "user", "content": "Copy this: y = 2"}]}) + "\n")
    for api, warned in (("completions", True), ("chat", False)):
        caplog.clear()
        config = load_study_config(None, {"target": str(tmp_path), "workload": str(path), "workload.api": api})
        with caplog.at_level(logging.WARNING, logger="spectune.study"):
            plan = plan_study(config)
        assert len(plan.prompts) == 2
        assert any("its prompts are chat messages, sent as plain text" in r.getMessage() for r in caplog.records) == warned
