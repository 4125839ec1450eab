"""Same answers: each trial's greedy outputs held against the baseline's, answer by answer.

Speculative decoding is lossless up to the hardware's rounding: a k-token verification step
rounds differently from k one-token steps, so where the baseline's own choice was a near-tie
the answer may flip without anything being wrong. Elsewhere a different answer is a changed
answer: a suspected engine or proposer defect. :func:`compare` tells the two apart with the
baseline's margins (:class:`~spectune.measurement.AnswerMargins`); :class:`AnswerRule` says which
differences rule a configuration out. Pure functions over stored measurements.
"""

from __future__ import annotations

import statistics
from enum import Enum
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel

if TYPE_CHECKING:
    from spectune.measurement import Measurement, PromptMargins

__all__ = ["ANSWERS", "ROUNDING_MARGIN", "AnswerRule", "Difference", "Fidelity", "compare", "rounding_margin"]

ANSWERS = "answers"
"""The constraint's name beside the SLOs: how many answers break the study's :class:`AnswerRule`."""

ROUNDING_MARGIN: dict[str, float] = {"bfloat16": 0.5, "float16": 0.06, "float32": 1e-5}
"""How far the dtype's rounding moves the log-probability margin between a position's two most
likely tokens: a difference where the baseline's margin was within it is rounding. bfloat16:
above the 99.9th percentile (0.43) of the margin's move between bfloat16 and float32 over the
same prefixes, measured by ``benchmarks/answers.py margins`` (``benchmarks/RESULTS.md``, "Same
answers"); float16 and float32 scaled from it by their mantissas (3 and 16 more bits)."""


def rounding_margin(*dtypes: str | None) -> float:
    """The rounding margin of the coarsest of ``dtypes`` (``auto`` or unknown: 16-bit, as GPUs
    serve most checkpoints)."""
    return max(ROUNDING_MARGIN.get(d or "auto", ROUNDING_MARGIN["bfloat16"]) for d in dtypes) if dtypes \
        else ROUNDING_MARGIN["bfloat16"]


class AnswerRule(str, Enum):
    """Which answers rule a configuration out (``--answers``)."""

    IDENTICAL = "identical"
    """Every answer as the baseline's, token for token."""
    ROUNDING = "rounding"
    """Differences where the baseline's choice was a near-tie are allowed; changed answers are not."""
    OFF = "off"
    """No check."""


Kind = Literal["rounding", "changed", "unclassified"]


class Difference(BaseModel):
    """Where one answer first left the baseline's."""

    prompt_id: str
    token: int
    """The output position (0: the first output token)."""
    kind: Kind
    margin: float | None = None
    """The baseline's margin there (None where it has none: ``unclassified``)."""


class Fidelity(BaseModel):
    """A configuration's answers against the baseline's, at temperature 0."""

    compared: int
    identical: int
    rounding: int = 0
    changed: int = 0
    unclassified: int = 0
    """Different, with no baseline margin to classify it (a baseline stored before margins were kept)."""
    first_difference_median: float | None = None
    """The median output position of the first difference, over the answers that differ."""
    first: Difference | None = None
    """The first changed answer (else the first that differs), in the prompts' order."""
    margin: float | None = None
    """The rounding margin the differences were classified with (:data:`ROUNDING_MARGIN`)."""

    @property
    def label(self) -> str:
        """For a table cell: ``same 6/8``."""
        return f"same {self.identical}/{self.compared}"

    def broken(self, rule: AnswerRule) -> int:
        """How many answers break ``rule``."""
        if rule is AnswerRule.OFF:
            return 0
        if rule is AnswerRule.IDENTICAL:
            return self.compared - self.identical
        return self.changed

    def kinds(self) -> str:
        """The differences by kind: ``2 rounding, 1 changed`` (empty where none)."""
        return ", ".join(f"{n} {k}" for k, n in (("rounding", self.rounding), ("changed", self.changed),
                                                 ("unclassified", self.unclassified)) if n)

    def summary(self) -> str:
        """For a line: ``same 6/8 (2 rounding)``."""
        return self.label + (f" ({kinds})" if (kinds := self.kinds()) else "")

    def where(self) -> str:
        """Where the first changed (else differing) answer left the baseline's, or ``""``."""
        d = self.first
        if d is None:
            return ""
        return (f"first {d.kind if d.kind != 'unclassified' else 'difference'}: prompt {d.prompt_id} at output token "
                f"{d.token}" + (f" (the baseline's margin there {d.margin:.3g} > {self.margin:.3g})"
                                if d.kind == "changed" and d.margin is not None and self.margin is not None else ""))

    def refusal(self, label: str, rule: AnswerRule) -> str | None:
        """The one line that rules ``label`` out under ``rule``; None where it keeps to it."""
        n = self.broken(rule)
        if not n:
            return None
        what = "changed beyond rounding" if rule is AnswerRule.ROUNDING else "differ from the baseline's"
        return f"{label}: {n} of {self.compared} answers {what}; {self.where()}"


def _first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _classify(pos: int, base: list[int], ref: PromptMargins | None, margin: float) -> tuple[Kind, float | None]:
    if ref is None:
        return "unclassified", None
    if ref.token_ids[: pos + 1] != base[: pos + 1]:  # the baseline left its own answer by then: not stable there
        return "rounding", None
    gap = ref.margins[pos] if pos < len(ref.margins) else None
    if gap is None:
        return "unclassified", None
    return ("rounding" if gap <= margin else "changed"), gap


def compare(baseline: Measurement, m: Measurement, margin: float | None = None) -> Fidelity | None:
    """``m``'s answers against ``baseline``'s, prompt by prompt, by output token ids; None where
    no answer can be compared: sampling above temperature 0, or no token ids (an imported
    result). ``margin``: the rounding margin (default: :func:`rounding_margin` of both engines'
    dtypes). The requests of a load mix's other levels keep no token ids: the headline's compare."""
    if m.workload.sampling.temperature > 0 or baseline.workload.sampling.temperature > 0:
        return None
    margin = rounding_margin(baseline.engine.dtype, m.engine.dtype) if margin is None else margin
    base = {r.prompt_id: r.token_ids for r in baseline.requests if r.ok and r.token_ids is not None}
    refs = baseline.answer_margins.requests if baseline.answer_margins is not None else {}
    compared = identical = 0
    diffs: list[Difference] = []
    for r in m.requests:
        if not r.ok or r.token_ids is None or (expected := base.get(r.prompt_id)) is None:
            continue
        compared += 1
        pos = _first_difference(expected, r.token_ids)
        if pos is None:
            identical += 1
            continue
        kind, gap = _classify(pos, expected, refs.get(r.prompt_id), margin)
        diffs.append(Difference(prompt_id=r.prompt_id, token=pos, kind=kind, margin=gap))
    if not compared:
        return None
    count = {k: sum(d.kind == k for d in diffs) for k in ("rounding", "changed", "unclassified")}
    first = next((d for d in diffs if d.kind == "changed"), diffs[0] if diffs else None)
    return Fidelity(compared=compared, identical=identical, **count, first=first, margin=margin,
                    first_difference_median=statistics.median(d.token for d in diffs) if diffs else None)
