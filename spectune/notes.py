"""The sentences ``show``, the export header and the reports say beside a study's decision: its
answers against the baseline's, why guided search stopped, how far its predictions missed, and
what it did at the edges of its space."""

from __future__ import annotations

from typing import TYPE_CHECKING

from spectune.answers import ANSWERS, AnswerRule
from spectune.records import StudyRecord

if TYPE_CHECKING:
    from spectune.results import Choice, StudyView

__all__ = ["answers_line", "edge_notes", "prediction_errors_note", "stop_note"]


def answers_line(view: StudyView, choice: Choice | None) -> str | None:
    """One line on the answers behind the decision: the choice's against the baseline's, and
    what the study's rule ruled out (None for a study that does not check answers)."""
    rule = view.answer_rule
    if rule is None or rule is AnswerRule.OFF:
        return None if rule is None else "answers: not checked (--answers off)"
    if (unchecked := view.answers_note()) is not None:
        return unchecked
    out = [r for r in view.complete() if ANSWERS in r.broken and r.duplicate_of is None]
    ruled = (f"; {len(out)} configuration{'s' if len(out) > 1 else ''} ruled out for answers that "
             f"{'changed beyond rounding' if rule is AnswerRule.ROUNDING else 'differ'}" if out else "")
    if choice is None or choice.is_baseline:
        return f"answers: the baseline's own (rule {rule.value}){ruled}"
    f = choice.row.answers
    if f is None:
        return f"answers: not compared with the baseline's (no output token ids){ruled}"
    where = f"; {f.where()}" if f.first is not None else ""
    return f"answers: {f.summary()} as the baseline's (rule {rule.value}{where}){ruled}"


def prediction_errors_note(view: StudyView) -> str | None:
    """How far guided search's predictions missed on the study's own measured configurations,
    each predicted from the others (leave-one-out, as it last planned), as one sentence; None
    for a study without guided predictions."""
    errors = (StudyRecord.of(view.study).guide or {}).get("errors")
    return f"Predictions: {errors['line']}." if isinstance(errors, dict) and errors.get("line") else None


def stop_note(view: StudyView) -> str | None:
    """Why guided search stopped, with the highest chance a candidate had left of beating the
    pick by more than the tolerance, as one sentence; None while it has not stopped (or for a
    study of another sampler)."""
    why = (StudyRecord.of(view.study).guide or {}).get("stop_reason")
    return f"Guided search stopped: {why}." if isinstance(why, str) and why else None


def edge_notes(view: StudyView) -> list[str]:
    """What guided search did at the edges of the space, a sentence each: the ranges it widened
    (and which configuration sat on the edge), and, for a study kept to its space, the best
    candidate predicted past an edge with its chance of beating the pick. Empty where the pick
    never sat on an edge."""
    record = StudyRecord.of(view.study)
    from spectune.space import range_text

    notes = [f"Guided search widened {e['param']} from {range_text(e.get('was') or {})} to {range_text(e['range'])}: "
             f"{e.get('because', '')}."
             for e in record.extensions or () if isinstance(e, dict) and "param" in e and isinstance(e.get("range"), dict)]
    beyond = (record.guide or {}).get("beyond_edge")
    if isinstance(beyond, dict) and beyond.get("best"):
        where = "; ".join(f"{e['at']} sits on the edge of {e['param']}" for e in beyond.get("edges") or ()
                          if isinstance(e, dict)) or "the pick sits on an edge of the space"
        notes.append(f"The study keeps to its space (extend: false), though {where}: past it, "
                     f"{beyond['candidates']} candidates are predicted, the best {beyond['best']} at "
                     f"{beyond['predicted']:.4g} with a {beyond['chance']:.0%} chance of beating the pick; not measured.")
    return notes
