"""Figures, the study note for the Optuna dashboard, and reports (HTML, Markdown) of a study.

Everything here reads a :class:`~spectune.results.StudyView` (Optuna's trials with spectune's
user attributes) and, where a figure or a table needs more, the stored Measurements; never an
engine. The figure functions are pure: a view in, a plotly ``Figure`` out.

- :func:`annotate_study` saves into the study what a person needs in optuna-dashboard: a note
  with the best configuration (its ``vllm serve --config`` YAML and speedup) and the figures
  as the dashboard's plotly graph objects (shown on the study's page). Saving again replaces
  them (the graph objects have fixed ids).
- :func:`write_report` writes a self-contained HTML report (plotly's JavaScript inline: the
  machines that read it are often offline) or a Markdown summary a CI job can post.
- :func:`serve_dashboard` annotates the studies of a storage and serves optuna-dashboard on it,
  on loopback unless told otherwise, until Ctrl-C.
"""


from spectune.report._dashboard import (
    NOTE_MARK,
    annotate_storage,
    annotate_study,
    serve_dashboard,
)
from spectune.report._figures import (
    FIGURE_IDS,
    fig_acceptance_per_position,
    fig_predicted_vs_measured,
    fig_speedup_vs_k,
    fig_throughput_vs_latency,
    figures,
)
from spectune.report._pages import render_html, render_markdown, write_report
from spectune.report._text import best_config_yaml, level_rows

__all__ = [
    "FIGURE_IDS",
    "NOTE_MARK",
    "annotate_storage",
    "annotate_study",
    "best_config_yaml",
    "fig_acceptance_per_position",
    "fig_predicted_vs_measured",
    "fig_speedup_vs_k",
    "fig_throughput_vs_latency",
    "figures",
    "level_rows",
    "render_html",
    "render_markdown",
    "serve_dashboard",
    "write_report",
]
