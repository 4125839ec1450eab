"""The decision of a study as text: its best configuration's YAML and a note for the dashboard."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

import yaml

from spectune.errors import ConfigError
from spectune.notes import answers_line
from spectune.results import engine_spread_note

if TYPE_CHECKING:

    from spectune.results import Choice, StudyView


__all__ = ["best_config_yaml", "best_line", "decide", "fmt", "level_rows", "study_note"]

_logger = logging.getLogger(__name__)

# -- the decision, as text ----------------------------------------------------------------------


def decide(view: StudyView) -> tuple[Choice | None, str]:
    try:
        return view.best(), ""
    except ConfigError as e:
        return None, str(e)


def best_config_yaml(view: StudyView, choice: Choice) -> str | None:
    """The chosen configuration as ``vllm serve --config`` YAML (None without its measurement)."""
    from spectune.export import vllm_config

    m = view.store.measurement(choice.row.trial_id)
    if m is None:
        return None
    config = vllm_config(m.engine.model_dump(exclude={"host", "env"}), m.engine.model, choice.row.spec)
    return yaml.safe_dump(config, sort_keys=False)


def fmt(x: float | None, spec: str = ".4g", suffix: str = "") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{format(x, spec)}{suffix}"


def best_line(choice: Choice) -> str:
    row = choice.row
    if choice.is_baseline:
        return f"no speculation (`{row.label}`, trial {row.number}): {choice.reason}"
    return f"`{row.label}` (trial {row.number}): {choice.reason}"


def study_note(view: StudyView) -> str:
    choice, why = decide(view)
    lines = [f"## spectune: {view.name}", ""]
    objectives = ", ".join(f"{o} ({d})" for o, d in zip(view.objectives, view.directions, strict=False))
    done = len(view.complete())
    lines += [f"Objectives: {objectives}. {done} of {len(view.rows)} trials completed.", ""]
    if choice is None:
        lines += [f"No best configuration yet: {why}."]
        return "\n".join(lines) + "\n"
    lines += [f"**Best configuration:** {best_line(choice)}", ""]
    values = ", ".join(f"{o} = {fmt(v)}" for o, v in zip(view.objectives, choice.row.values or [], strict=False))
    base = ", ".join(f"{o} = {fmt(v)}" for o, v in zip(view.objectives, choice.baseline.values or [], strict=False))
    several = len(choice.engines) > 1 or len(choice.baseline_engines) > 1
    first = " (first engine)" if several else ""
    whole = " over the load mix" if view.is_mix() else ""
    lines += [f"- measured{first}: {values}{whole}", f"- baseline (trial {choice.baseline.number}){first}: {base}"]
    if several:
        lines.append(f"- {view.objectives[0]} on each engine: {', '.join(fmt(v) for v in choice.engines)} "
                     f"(baseline: {', '.join(fmt(v) for v in choice.baseline_engines)})")
    gain = f"{choice.gain_text} the baseline, " if choice.gain_text and not choice.is_baseline else ""
    lines.append(f"- {gain}{choice.band_kind} +-{choice.noise_band:.1%} on the log of the gain" + (
        " (95 % interval on the gap to the baseline, paired per prompt, engine starts included)"
        if choice.band_kind.startswith("paired band") else ""))
    if (spread := engine_spread_note(choice.spread)) is not None:
        lines.append(f"- {spread}")
    if (answers := answers_line(view, choice)) is not None:
        lines.append(f"- {answers}")
    lines += ["", *level_markdown(view, choice)]
    text = best_config_yaml(view, choice)
    if text is not None:
        lines += ["`vllm serve --config best.yaml` with this `best.yaml` "
                  "(`spectune export -o best.yaml` writes it, with its provenance):", "",
                  "```yaml", text.rstrip(), "```", ""]
    lines += ["Figures: speedup against k, acceptance per draft position, throughput against "
              "latency with the Pareto front, and predicted against measured when the study "
              "has predictions. `spectune report` writes them into one HTML file."]
    return "\n".join(lines) + "\n"


def level_markdown(view: StudyView, choice: Choice | None = None) -> list[str]:
    """The load mix level by level as a Markdown table, with its title and a blank line after
    (the report's Markdown and the dashboard's note); empty when the study measures no mix.
    ``choice``: the study's, where the caller has decided it already."""
    mix = level_rows(view, choice)
    if mix is None:
        return []
    header, rows = mix
    return [f"At each level of the load mix ({view.objectives[0]}):", "", "| " + " | ".join(header) + " |",
            "|" + "---|" * len(header), *("| " + " | ".join(md_cell(c) for c in row) + " |" for row in rows), ""]


def md_cell(text: str) -> str:
    """``text`` as one cell of a Markdown table."""
    return text.replace("|", "\\|").replace("\n", " ")


def level_rows(view: StudyView, choice: Choice | None = None) -> tuple[list[str], list[list[str]]] | None:
    """The load mix level by level (:meth:`StudyView.levels`) as a header and rows of text, for
    ``show`` and the report (the first objective's values); None when the study measures no mix
    or has no choice yet. ``choice``: the study's, where the caller has decided it already."""
    try:
        levels = view.levels(choice or view.best())
    except ConfigError:
        return None
    if not levels:
        return None
    header = ["level", "weight", "chosen", "baseline", "speedup", "best at this level", "its speedup"]
    return header, [[lv.name, f"{lv.weight:.2f}", f"{lv.value:.4g}", f"{lv.baseline:.4g}",
                     f"{lv.speedup:.3f}x", lv.best, f"{lv.best_speedup:.3f}x"] for lv in levels]
