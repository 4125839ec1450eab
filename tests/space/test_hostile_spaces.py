"""Hostile search spaces (YAML that is malformed, deep, recursive, exponential, of odd types),
through ``spectune optimize --create-only``: each ends with exit 0, or exit 2 with one line and
nothing written (``tests/hostile.py`` says what counts)."""

from __future__ import annotations

import time

import pytest
import yaml
from hostile import BOMB, Case, Harness, run_property, space_cases

from spectune._util import YAML_MAX_VALUES, parse_yaml
from spectune.errors import ConfigError

EXAMPLES = 400
DEEP = "exceeded maximum nesting depth" if yaml.__with_libyaml__ else "nested too deeply"
"""What a YAML document nested too deeply gets: libyaml's own limit, else Python's recursion."""



def optimize_with_space(text: bytes) -> Case:
    return Case("space", ("optimize", "--create-only", "--target", "org/model", "--workload", "@FIX@/w.jsonl",
                          "--space", "@CASE@/space.yaml", "--storage", "@STORAGE@", "--study", "@STUDY@"),
                (("space.yaml", text),))


def test_hostile_spaces_end_in_exit_0_or_one_line_with_nothing_written(fresh_harness: Harness) -> None:
    seen = run_property(fresh_harness, space_cases(), EXAMPLES)
    assert seen["exit 0"] >= EXAMPLES // 20 and seen["exit 2"] >= EXAMPLES // 4, seen  # both ends are reached


NGRAM = "methods:\n  none: {}\n  ngram: {num_speculative_tokens: [1, 2]}\n"
BOMB_TEXT = "\n".join(f"b{i}: {line}" for i, line in enumerate(BOMB)) + "\n"


@pytest.mark.parametrize(("text", "error"), [
    (NGRAM.encode(), None),
    (b"\xef\xbb\xbf" + NGRAM.encode(), None),
    (NGRAM.encode() + b"methods: {none: {}}\n", "line 4 invalid YAML: key 'methods' given twice in one mapping"),
    (b"methods:\n  none: {}\n  none: {}\n", "line 3 invalid YAML: key 'none' given twice in one mapping"),
    (b"base: &b {num_speculative_tokens: [1, 2]}\nmethods: {none: {}, ngram: {<<: *b, num_speculative_tokens: 3}}\n",
     "base: unknown key"),  # a merge key's values may be overridden: not a key given twice
    (BOMB_TEXT.encode() + b"methods: {none: {}}\nengine: {extra_args: {x: *b7}}\n",
     f"invalid YAML: more than {YAML_MAX_VALUES} values once its aliases are expanded"),
    (b"methods: &m {none: {}, ngram: *m}\n", "invalid YAML: an alias refers to a value that contains it"),
    (b"[" * 20_000, f"invalid YAML: {DEEP}"),
    ("".join(" " * i + "a:\n" for i in range(3000)).encode(), f"invalid YAML: {DEEP}"),
    (b"methods: {none: {}}\ndescription: 2001-02-30\n", "invalid YAML: day is out of range for month"),
    (b"methods: {none: {}}\ndescription: !!binary aGk=\n", "invalid YAML: b'hi' is a bytes, not text"),
    (b"methods: {none: {}}\ndescription: 2001-02-03\n", "invalid YAML: datetime.date(2001, 2, 3) is a date"),
    (b"methods: {none: {}}\n\xff\n", "not UTF-8 text: invalid start byte at byte 20"),
    (NGRAM.encode() + b"engine_knobs: true\n", "engine_knobs: Input should be a valid dictionary"),
    (b'methods: {none: {}, "ng\\nram": {}}\n', r"unknown method 'ng\nram'"),
])
def test_a_space_that_broke_the_reader_is_read_or_refused_in_one_line(harness: Harness, text: bytes,
                                                                      error: str | None) -> None:
    outcome = harness.run(optimize_with_space(text))
    assert outcome.problem is None, outcome
    if error is None:
        assert outcome.code == 0, outcome.stderr
    else:
        assert outcome.code == 2 and error in outcome.stderr, outcome.stderr


def test_an_alias_bomb_is_refused_at_once() -> None:
    start = time.perf_counter()
    with pytest.raises(ConfigError, match="more than .* values"):
        parse_yaml(BOMB_TEXT + "x: *b7\n", "bomb.yaml")
    assert time.perf_counter() - start < 5  # expanded, 10^8 values: minutes and gigabytes


def test_no_traceback_reaches_a_terminal_from_a_space(harness: Harness) -> None:
    outcome = harness.run(optimize_with_space(b"methods: {none: {}}\ndescription: " + b"[" * 30_000), in_subprocess=True)
    assert outcome.problem is None and outcome.code == 2, outcome
    assert outcome.stderr.count("\n") == 1 and f"invalid YAML: {DEEP}" in outcome.stderr
