"""Hostile prompt files, in every format spectune reads (JSONL, ShareGPT, vLLM bench custom,
Spec-Bench), through ``spectune optimize --create-only``: each ends with exit 0, or exit 2 with
one line and nothing written (``tests/hostile.py`` says what counts)."""

from __future__ import annotations

import gzip
import json

import pytest
from hostile import Case, Harness, run_property, workload_cases

EXAMPLES = 500



def optimize_on(name: str, content: bytes, fmt: str | None = None) -> Case:
    """``optimize --create-only`` on the prompt file ``name`` (format from the file, or ``fmt``)."""
    argv = ["optimize", "--create-only", "--target", "org/model", "--space", "ngram", "--storage", "@STORAGE@",
            "--study", "@STUDY@"]
    files = [(name, content)]
    if fmt is None:
        argv += ["--workload", f"@CASE@/{name}"]
    else:
        files.append(("study.yaml", f"workload: {{source: '@CASE@/{name}', format: {fmt}}}\n".encode()))
        argv += ["--config", "@CASE@/study.yaml"]
    return Case("workload", tuple(argv), tuple(files))


def test_hostile_prompt_files_end_in_exit_0_or_one_line_with_nothing_written(fresh_harness: Harness) -> None:
    seen = run_property(fresh_harness, workload_cases(), EXAMPLES)
    assert seen["exit 0"] >= EXAMPLES // 20 and seen["exit 2"] >= EXAMPLES // 4, seen  # both ends are reached


@pytest.mark.parametrize(("name", "content", "fmt", "error"), [
    ("deep.jsonl", b"[" * 100_000 + b"\n", None, "deep.jsonl:1: invalid JSON: nested too deeply"),
    ("deep.json", b"[" * 100_000, None, "deep.json: invalid JSON: nested too deeply"),
    ("long.jsonl", b'{"prompt": "x", "id": ' + b"9" * 5000 + b"}\n", None, "long.jsonl:1: invalid JSON: Exceeds the limit"),
    ("s.jsonl", b'{"prompt": "a\\ud800b"}\n', None, r"s.jsonl:1: text: a lone surrogate '\ud800' at character 1"),
    ("s.json", b'[{"conversations": [{"from": "human", "value": "\\udfff"}]}]', None,
     r"s.json: record 0: turn 0: content: a lone surrogate '\udfff' at character 0"),
    ("q.jsonl", b'{"turns": ["x"], "category": "\\ud800"}\n', "spec_bench", r"q.jsonl:1: category: a lone surrogate"),
    ("c.jsonl", b'{"prompt": "x", "output_tokens": 2}\n', "custom", None),
    ("k.jsonl", b'{"x\\ny": 1}\n', None, "k.jsonl:1: cannot tell the format from the first record (keys: 'x\\ny')"),
    ("bom.jsonl", b'\xef\xbb\xbf{"prompt": "with a byte-order mark"}\n', None, None),
    ("bom.json", b'\xef\xbb\xbf[{"conversations": [{"from": "human", "value": "hi"}]}]', None, None),
    ("cut.jsonl.gz", gzip.compress(b'{"prompt": "x"}\n' * 50)[:-12], None, "cut.jsonl.gz: cannot read"),
    ("bad.jsonl.gz", gzip.compress(b"x")[:10] + b"\xff" * 40, None, "bad.jsonl.gz: cannot read"),
])
def test_a_file_that_broke_a_loader_is_read_or_refused_in_one_line(harness: Harness, name: str, content: bytes,
                                                                    fmt: str | None, error: str | None) -> None:
    outcome = harness.run(optimize_on(name, content, fmt))
    assert outcome.problem is None, outcome
    if error is None:
        assert outcome.code == 0 and "created study" in outcome.stdout
    else:
        assert outcome.code == 2 and error in outcome.stderr, outcome.stderr


def test_no_traceback_reaches_a_terminal_from_a_prompt_file(harness: Harness) -> None:
    lines = "".join(json.dumps({"prompt": "x"}) + "\n" for _ in range(3)) + "[" * 50_000 + "\n"
    outcome = harness.run(optimize_on("deep.jsonl", lines.encode()), in_subprocess=True)
    assert outcome.problem is None and outcome.code == 2, outcome
    assert outcome.stderr.count("\n") == 1 and "deep.jsonl:4: invalid JSON: nested too deeply" in outcome.stderr
