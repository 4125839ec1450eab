"""The ``spectune`` command: thin, each command builds one config object and makes one call.

Errors: bad input -> one line on stderr, exit 2; an engine failure -> its reason, exit 1.
Tracebacks only with ``--debug``. Heavy modules are imported inside the commands, so
``spectune --help`` stays fast.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from spectune.cli._args import (
    OUTAGE_HELP,
    STORAGE_HELP,
    _err_console,
    _one_line,
    _outage_limit,
    _parse_engine_arg,
    _parse_list,
    _print_best,
    _print_json,
)
from spectune.cli._models import models_app, workloads_app

if TYPE_CHECKING:
    from spectune.study import StudyContext
    from spectune.worker import Slot

app = typer.Typer(
    name="spectune",
    help="Find the speculative-decoding configuration that serves your model fastest on vLLM.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(models_app, name="models")
app.add_typer(workloads_app, name="workloads")

_state: dict[str, Any] = {"debug": False}

@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks and debug logs.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log progress details.")] = False,
) -> None:
    _state["debug"] = debug
    level = logging.DEBUG if debug else logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if not (debug or verbose):  # vLLM imported for the offline replay warns about its own build (Triton)
        logging.getLogger("vllm").setLevel(logging.ERROR)


@app.command()
def measure(
    model: Annotated[str, typer.Option(help="Target model: local path or hub name.")],
    prompts: Annotated[str, typer.Option(help="Prompt file (JSONL, ShareGPT JSON, Spec-Bench...) or a shipped set: humaneval, mtbench, sharegpt.")],
    spec: Annotated[str, typer.Option(help="Speculative config as vLLM's JSON, or 'none'.")] = "none",
    num_prompts: Annotated[Optional[int], typer.Option(min=1, help="Prompts to send (default: all).")] = None,
    max_tokens: Annotated[int, typer.Option(min=1)] = 128,
    concurrency: Annotated[int, typer.Option(min=1, help="Requests in flight (with --request-rate: at most).")] = 1,
    request_rate: Annotated[Optional[float], typer.Option(
        help="Requests per second as Poisson arrivals (as vllm bench serve); default: all at once, --concurrency at a time.")] = None,
    burstiness: Annotated[float, typer.Option(help="With --request-rate: gamma shape of the gaps between arrivals (1: Poisson; below 1: bursts), as vllm bench serve.")] = 1.0,
    temperature: Annotated[float, typer.Option(min=0.0)] = 0.0,
    api: Annotated[str, typer.Option(help="completions or chat")] = "completions",
    warmup: Annotated[int, typer.Option(min=0, help="Warm-up requests, excluded from the window.")] = 1,
    dtype: Annotated[Optional[str], typer.Option()] = None,
    max_model_len: Annotated[Optional[int], typer.Option()] = None,
    kv_cache_memory_bytes: Annotated[Optional[int], typer.Option()] = None,
    enforce_eager: Annotated[Optional[bool], typer.Option("--enforce-eager/--no-enforce-eager")] = None,
    tensor_parallel_size: Annotated[Optional[int], typer.Option()] = None,
    engine_arg: Annotated[list[str], typer.Option(help="Further vllm serve option KEY=VALUE (repeatable).")] = [],
    host: Annotated[str, typer.Option(help="Address the engine binds to.")] = "127.0.0.1",
    log_dir: Annotated[Path, typer.Option(help="Where engine logs are kept.")] = Path("storage/logs"),
    startup_timeout: Annotated[float, typer.Option(min=1.0, help="Seconds the engine may take to become healthy.")] = 1800.0,
    repeats: Annotated[int, typer.Option(min=1, help="Split the prompts into this many disjoint windows on one engine (for noise).")] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="Print the Measurement as JSON.")] = False,
) -> None:
    """Measure one speculative configuration on a real vLLM engine."""
    from spectune._util import validate
    from spectune.config import EngineArgs, WorkloadSpec, parse_spec
    from spectune.pairing import check_pairing
    from spectune.trial import measure as run_measure
    from spectune.workloads import load_prompts

    candidate = parse_spec(spec)
    check_pairing(model, candidate.model, candidate.method)
    engine = validate(EngineArgs, {
        "model": model, "dtype": dtype, "max_model_len": max_model_len,
        "kv_cache_memory_bytes": kv_cache_memory_bytes, "enforce_eager": enforce_eager,
        "tensor_parallel_size": tensor_parallel_size, "host": host,
        "extra_args": _parse_engine_arg(engine_arg),
    }, "engine")
    workload = validate(WorkloadSpec, {
        "source": prompts, "num_prompts": num_prompts, "api": api, "concurrency": concurrency,
        "request_rate": request_rate, "burstiness": burstiness, "warmup_requests": warmup, "sampling": {"max_tokens": max_tokens, "temperature": temperature},
    }, "workload")
    selected = load_prompts(workload)
    from spectune._progress import trial_progress

    with trial_progress(_err_console(), candidate.label(), startup_timeout=startup_timeout,
                        enabled=not _state["debug"]) as hook:
        m = run_measure(engine, candidate, workload, selected, log_dir=log_dir,  # one configuration: no answers to hold
                        startup_timeout=startup_timeout, progress=hook, repeats=repeats, answer_margins=False)
    if as_json:
        sys.stdout.write(m.model_dump_json(indent=2) + "\n")
    else:
        from spectune._progress import render_measurement

        render_measurement(m)


@app.command()
def optimize(
    config: Annotated[Optional[Path], typer.Option("--config", "-c", help="Study configuration (YAML).")] = None,
    target: Annotated[Optional[str], typer.Option(help="Target model: local path or hub name.")] = None,
    draft: Annotated[Optional[list[str]], typer.Option(help="Draft model or EAGLE-3 head for spaces that use ${draft} (each to the method it serves); repeat for several.")] = None,
    space: Annotated[Optional[str], typer.Option(help="Search space: a name in search_spaces/ or a YAML file.")] = None,
    workload: Annotated[Optional[str], typer.Option(help="Prompt file or shipped set (humaneval, mtbench, sharegpt).")] = None,
    objective: Annotated[Optional[list[str]], typer.Option(help="output_throughput, tpot_median_ms, tpot_p99_ms, ttft_p99_ms, e2el_median_ms, e2el_p99_ms; twice for a Pareto front.")] = None,
    trials: Annotated[Optional[int], typer.Option(min=1, help="Finished trials the study should have (over all its workers).")] = None,
    storage: Annotated[Optional[str], typer.Option(help=STORAGE_HELP)] = None,
    study: Annotated[Optional[str], typer.Option(help="Study name (default: from target and workload).")] = None,
    seed: Annotated[Optional[int], typer.Option()] = None,
    sampler: Annotated[Optional[str], typer.Option(help="guided (default: measure what the models predict best or know least, stop when the rest is clearly worse), tpe, random or grid.")] = None,
    confirm: Annotated[Optional[int], typer.Option(min=0, help="After the search, measure the baseline and this many best configurations again on fresh engines; choose on the means.")] = None,
    time_budget: Annotated[Optional[str], typer.Option(help="Engine time the study may spend over all its trials: seconds or 90s, 10m, 2h. No trial starts that would end past it.")] = None,
    tolerance: Annotated[Optional[float], typer.Option(min=0.0, max=0.99, help="Guided search stops once no candidate has more than a 5 % chance of beating the pick by more than this (0.05: 5 %). Default: the larger of 2 % and the measured spread between engine starts.")] = None,
    max_memory: Annotated[Optional[str], typer.Option(help="A configuration whose engine takes more memory is infeasible: 70GiB (on GPUs its weights, target and draft, as the engine accounts for them; its resident memory on a CPU).")] = None,
    min_kv_cache_tokens: Annotated[Optional[int], typer.Option(min=1, help="A configuration whose KV cache holds fewer tokens is infeasible.")] = None,
    gpus: Annotated[Optional[str], typer.Option(help="One engine per GPU group at once: 0,1,2,3 (one GPU each) or 0-1,2-3 (tensor parallel over each pair), numbered within the GPUs this process was given (CUDA_VISIBLE_DEVICES).")] = None,
    mixed_gpus: Annotated[bool, typer.Option("--mixed-gpus", help="Let slots on other GPU models share the study (their trials compare less well).")] = False,
    create_only: Annotated[bool, typer.Option("--create-only", help="Create the study in the storage and exit; spectune worker measures it.")] = False,
    storage_outage_limit: Annotated[Optional[str], typer.Option(help=OUTAGE_HELP)] = None,
    concurrency: Annotated[Optional[str], typer.Option(help="Requests in flight: 8, or a load mix 1,4,16 whose levels each trial measures on its engine (the objective weighs them). With --request-rate: the most in flight.")] = None,
    request_rate: Annotated[Optional[str], typer.Option(help="Requests per second as Poisson arrivals: 2, or a load mix 0.5,1,2 whose levels each trial measures on its engine (the objective weighs them).")] = None,
    level_weights: Annotated[Optional[str], typer.Option(help="How much each level of --concurrency or --request-rate counts: 3,1,1 (default: equal; e.g. the share of the day at each load).")] = None,
    no_extend: Annotated[bool, typer.Option("--no-extend", help="Keep to the space's ranges: where the pick sits on an edge, guided search predicts and reports what lies beyond but does not measure it.")] = False,
    answers: Annotated[Optional[str], typer.Option(help="Which answers, held against the baseline's at temperature 0, rule a configuration out: rounding (default: near-ties of the baseline may flip, no other answer may change), identical, or off.")] = None,
) -> None:
    """Run (or resume) an Optuna study over speculative configurations on real engines."""
    from spectune.errors import ConfigError
    from spectune.storage import safe_url, worker_claim
    from spectune.study import CLEAR, create_study, load_study_config, plan_study
    from spectune.worker import parse_gpus

    levels = _parse_list(concurrency, "--concurrency", int, "1,4,16") if concurrency is not None else None
    rates = _parse_list(request_rate, "--request-rate", float, "0.5,1,2") if request_rate is not None else None
    weights = _parse_list(level_weights, "--level-weights", float, "3,1,1") if level_weights is not None else None
    if rates and levels and len(levels) > 1:
        raise ConfigError("--concurrency: with --request-rate give one value, the most requests in flight")
    mix = levels is not None and len(levels) > 1
    cfg = load_study_config(config, {
        "target": target, "draft": draft[0] if draft and len(draft) == 1 else draft or None, "space": space,
        "workload": workload,
        # the options replace what the --config file says of the load: one concurrency is no mix
        # (or the rates' cap), several are a mix of concurrencies, rates are a rate or a mix of rates
        "workload.concurrency": levels[0] if levels else None,
        "workload.concurrency_levels": levels if mix else CLEAR if levels or rates else None,
        "workload.request_rate": rates[0] if rates else CLEAR if mix else None,
        "workload.request_rate_levels": rates if rates and len(rates) > 1 else CLEAR if rates or mix else None,
        "workload.level_weights": weights,
        "objectives": objective or None, "trials": trials, "storage": storage,
        "study_name": study, "seed": seed, "sampler": sampler, "confirm": confirm, "time_budget": time_budget,
        "tolerance": tolerance, "slo.max_memory": max_memory, "slo.min_kv_cache_tokens": min_kv_cache_tokens,
        "storage_outage_limit": storage_outage_limit, "extend": False if no_extend else None, "answers": answers,
    })
    slots = parse_gpus(gpus)
    plan = plan_study(cfg)  # every check of the input before the storage is claimed: nothing written on exit 2
    with worker_claim(plan.url):  # a second process on SQLite writes nothing
        ctx = create_study(cfg, plan)
        if create_only:
            typer.echo(f"created study {ctx.study.study_name} in {safe_url(ctx.url)}: {cfg.trials} trials; "
                       f"spectune worker --storage URL --study {ctx.study.study_name} measures it")
            return
        _work(ctx, slots, mixed_gpus)


@app.command()
def worker(
    study: Annotated[str, typer.Option(help="Name of the study to work on (created by optimize).")],
    storage: Annotated[Optional[str], typer.Option(help=STORAGE_HELP)] = None,
    gpus: Annotated[Optional[str], typer.Option(help="One engine per GPU group at once: 0,1,2,3 or 0-1,2-3, numbered within the GPUs this process was given (CUDA_VISIBLE_DEVICES).")] = None,
    mixed_gpus: Annotated[bool, typer.Option("--mixed-gpus", help="Let slots on other GPU models share the study.")] = False,
    storage_outage_limit: Annotated[Optional[str], typer.Option(help=OUTAGE_HELP)] = None,
) -> None:
    """Join a study from this machine and measure its trials until it needs no more."""
    from spectune.storage import worker_claim
    from spectune.study import join_study
    from spectune.worker import parse_gpus

    slots = parse_gpus(gpus)
    limit = _outage_limit(storage_outage_limit)
    ctx = join_study(storage, study)  # reads the study (its storage resolved there, once); writes nothing
    with worker_claim(ctx.url):
        if limit is not None:  # this worker's own, over the study's
            ctx.config = ctx.config.model_copy(update={"storage_outage_limit": limit})
        _work(ctx, slots, mixed_gpus)


def _work(ctx: StudyContext, slots: list[Slot], mixed_gpus: bool = False) -> None:
    """Run a worker on the study with rich progress, then say where the study stands. SIGTERM
    and Ctrl-C stop it politely: one line, exit 0."""
    import signal

    from spectune._progress import StudyProgress
    from spectune.errors import SpectuneError
    from spectune.report import annotate_study
    from spectune.results import open_study
    from spectune.storage import safe_url
    from spectune.worker import run_worker

    console = _err_console()
    with StudyProgress(console, ctx.config.trials, startup_timeout=ctx.config.startup_timeout) as progress:
        result = run_worker(ctx, slots=slots, progress=progress.on_event, trial_progress=progress.trial_hook,
                            stop_signals=(signal.SIGTERM, signal.SIGINT), mixed_gpus=mixed_gpus)
    if result.stopped:
        back = result.handed_back
        told = (f"trial{'s' if len(back) > 1 else ''} {', '.join(map(str, back))} handed back to the study"
                if back else "no trial was running")
        console.print(f"stopped by {result.stopped}: engines stopped, {told}; {result.measured} measured here",
                      soft_wrap=True)
        return
    console.print(f"study {result.study_name}: {result.measured} measured, {result.failed} failed, "
                  f"{result.reused} reused here; {result.finished} of {ctx.config.trials} trials finished; "
                  f"storage {safe_url(result.storage)}")
    view = open_study(result.storage, result.study_name)
    try:  # the dashboard's note and figures; a study that cannot be annotated is still a result
        annotate_study(view)
    except SpectuneError as e:
        console.print(f"study {view.name} not annotated for the dashboard: {e}")
    _print_best(view)


@app.command("import")
def import_(
    results: Annotated[list[Path], typer.Argument(help="vllm bench serve --save-result files, or vllm bench sweep result folders.")],
    study: Annotated[str, typer.Option(help="The study to import into (created by spectune optimize).")],
    storage: Annotated[Optional[str], typer.Option(help=STORAGE_HELP)] = None,
    spec: Annotated[Optional[str], typer.Option(help="The speculative config (vLLM's JSON, or none) where a file's metadata does not say it.")] = None,
    engine_arg: Annotated[list[str], typer.Option(help="An engine knob's value KEY=VALUE where a file does not say it (repeatable).")] = [],
) -> None:
    """Import results a team already has into a study as completed trials (a warm start)."""
    from spectune.config import parse_spec
    from spectune.imports import import_results

    done = import_results(storage, study, results, spec=parse_spec(spec) if spec is not None else None,
                          knobs=_parse_engine_arg(engine_arg))
    for item in done:
        typer.echo(f"imported {item.path}: {item.label}, {item.measurement.output_throughput:.4g} tok/s")
    typer.echo(f"study {study}: {len(done)} result{'s' if len(done) != 1 else ''} imported")


@app.command()
def show(
    storage: Annotated[Optional[str], typer.Option(help=STORAGE_HELP)] = None,
    study: Annotated[Optional[str], typer.Option(help="Study name (default: the newest).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the study's full record as JSON.")] = False,
) -> None:
    """The study's trials, best first, with speedup over the baseline, acceptance and state."""
    from spectune._tables import render_study
    from spectune.results import open_study

    view = open_study(storage, study)
    if as_json:
        _print_json(view.record())
        return
    render_study(view)
    _print_best(view)


@app.command()
def export(
    output: Annotated[Path, typer.Option("--output", "-o", help="YAML file for vllm serve --config.")] = Path("best.yaml"),
    storage: Annotated[Optional[str], typer.Option(help=STORAGE_HELP)] = None,
    study: Annotated[Optional[str], typer.Option(help="Study name (default: the newest).")] = None,
    schedule: Annotated[bool, typer.Option(help="Add num_speculative_tokens_per_batch_size, a k per batch size from the cost model.")] = False,
    max_batch: Annotated[int, typer.Option(min=1, help="Largest batch size the schedule covers (vLLM's max_num_seqs).")] = 256,
    trial: Annotated[Optional[int], typer.Option(min=0, help="Export this trial's configuration instead of the study's choice.")] = None,
    target: Annotated[Optional[str], typer.Option("--for", help="Where the file will be served: gpu or cpu (default: where it was measured). On another platform, the settings chosen for the measuring one alone are left out.")] = None,
) -> None:
    """Write the best feasible configuration as a vllm serve --config YAML, with provenance."""
    from spectune.export import export_best
    from spectune.results import open_study

    result = export_best(open_study(storage, study), output, schedule_max_batch=max_batch if schedule else None,
                         trial=trial, target=target)
    typer.echo(f"wrote {result.path} ({result.choice.row.label}): {result.choice.reason}")
    typer.echo(f"provenance: {result.provenance_path}")


@app.command()
def verify(
    file: Annotated[Path, typer.Argument(help="The exported file (spectune export), its provenance beside it.")],
    storage: Annotated[Optional[str], typer.Option(help="The study's storage (default: the one its provenance names).")] = None,
    study: Annotated[Optional[str], typer.Option(help="The study (default: the one its provenance names).")] = None,
    workload: Annotated[Optional[str], typer.Option(help="Prompts to verify on instead of the study's (a file or shipped set).")] = None,
    max_memory: Annotated[Optional[str], typer.Option(help="Fail when the engine takes more memory: 70GiB (on GPUs its weights, target and draft; its resident memory on a CPU).")] = None,
    startup_timeout: Annotated[float, typer.Option(min=1.0, help="Seconds an engine may take to become healthy.")] = 600.0,
    log_dir: Annotated[Path, typer.Option(help="Where the engines' logs go.")] = Path("storage/logs"),
    as_json: Annotated[bool, typer.Option("--json", help="The verdict as JSON: holds, speedup, claimed, band, fidelity, differences.")] = False,
) -> None:
    """Start FILE's configuration and the baseline here, and hold them to what the study claimed.

    Exit 0: the speedup is within the study's band of its claim (or above) and the answers keep
    the study's rule; 1: something regressed (one line says what); 2: bad input."""
    from spectune._util import validate
    from spectune.measurement import SLO
    from spectune.verify import verify as run_verify

    limit = validate(SLO, {"max_memory": max_memory}, "--max-memory").max_memory if max_memory is not None else None
    verdict = run_verify(file, storage=storage, study=study, workload=workload, max_memory=limit, log_dir=log_dir,
                         startup_timeout=startup_timeout)
    if as_json:
        _print_json(verdict.record())
    else:
        typer.echo(verdict.reason)
        for difference in verdict.differences:
            typer.echo(f"differs from the study's record: {difference}")
    if not verdict.holds:
        raise typer.Exit(1)


@app.command()
def dashboard(
    storage: Annotated[Optional[str], typer.Option(help=STORAGE_HELP)] = None,
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on.")] = 8080,
    host: Annotated[str, typer.Option(help="Address to listen on (loopback by default; the dashboard has no login).")] = "127.0.0.1",
) -> None:
    """Serve optuna-dashboard on the storage, with each study's best config and figures; Ctrl-C stops it."""
    from spectune.report import serve_dashboard

    serve_dashboard(storage, host=host, port=port,
                    ready=lambda url: _err_console().print(f"optuna-dashboard at {url} (Ctrl-C stops it)"))


@app.command()
def report(
    output: Annotated[Path, typer.Option("--output", "-o", help="Report file.")] = Path("report.html"),
    fmt: Annotated[Optional[str], typer.Option("--format", help="html (self-contained, with plots) or md (a summary for CI); default: from the file's suffix.")] = None,
    storage: Annotated[Optional[str], typer.Option(help=STORAGE_HELP)] = None,
    study: Annotated[Optional[str], typer.Option(help="Study name (default: the newest).")] = None,
) -> None:
    """Write a report of the study: figures, trials, workload and provenance (HTML or Markdown)."""
    from spectune.report import write_report
    from spectune.results import open_study

    chosen = fmt or ("md" if output.suffix.lower() in {".md", ".markdown"} else "html")
    path = write_report(open_study(storage, study), output, chosen)  # type: ignore[arg-type]
    typer.echo(f"wrote {path}")


@app.command()
def predict(
    storage: Annotated[Optional[str], typer.Option(help=STORAGE_HELP)] = None,
    study: Annotated[Optional[str], typer.Option(help="Study name (default: the newest).")] = None,
    top: Annotated[int, typer.Option(min=1, help="Show the best N predictions.")] = 10,
    concurrency: Annotated[Optional[str], typer.Option(
        help="Also predict throughput and TPOT at these concurrency levels, e.g. 1,8,32 "
             "(needs a study whose workload swept concurrency_levels).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print every prediction's full record as JSON.")] = False,
) -> None:
    """Rank the space's unmeasured candidates by predicted objective, with intervals and their source."""
    import dataclasses

    from rich.console import Console

    from spectune._tables import levels_table, predictions_table
    from spectune.results import open_study
    from spectune.search import study_inputs

    levels: list[int] = _parse_list(concurrency, "--concurrency", int, "1,8,32") if concurrency is not None else []
    view = open_study(storage, study)
    inputs = study_inputs(view)
    predictions = inputs.predict()
    errors = inputs.errors()
    workload = inputs.baseline.workload
    mix = workload.is_mix and inputs.concurrency_model() is not None
    record: dict[str, Any] = {"study": view.name, "predictions": [p.record() for p in predictions[:top]],
                              "errors": errors.record() if errors is not None else None,
                              "load_mix": workload.weights() if mix else None}
    console = Console()
    if not as_json:
        title = f"study {view.name}: {len(predictions)} candidates not measured, best {min(top, len(predictions))}"
        console.print(predictions_table(console, predictions[:top], title=title, mix=mix))
        console.print(errors.line() if errors is not None else
                      "no speculative configuration measured yet: these predictions rest on replay and priors alone")
    if levels or mix:  # a load mix: its own levels, unless told others
        model = inputs.concurrency_model()
        shown = [*inputs.measured_predictions(), *predictions[:top]]  # the measured ones too, moved elsewhere
        # refuses a study without a sweep
        scaled = inputs.at_concurrency(shown, levels, model) if levels else inputs.at_levels(shown, model)
        assert model is not None
        record["at_concurrency"] = [{"label": p.label, "levels": [dataclasses.asdict(lp) for lp in row]}
                                    for p, row in zip(shown, scaled, strict=True)]
        if not as_json:
            console.print(levels_table(console, shown, scaled, title=(
                f"at {'other concurrency' if levels else 'each level of the load mix'}: "
                f"step time {model.step.a:.3g} + {model.step.slope:.3g} b ms, "
                f"fitted on the baseline at {', '.join(f'{b:.3g}' for b in model.step.levels)} in flight")))
    if as_json:
        _print_json(record)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: spectune's errors become one line and an exit code.

    Usage errors (a missing or malformed option) exit 2, as do ConfigError and StorageError;
    EngineError exits 1; Ctrl-C exits 130 once every engine has been stopped, except in a worker
    (``optimize``, ``worker``), which SIGTERM and Ctrl-C stop politely with exit 0. Each is one
    line on stderr (an engine failure adds the path of the engine's log).
    """
    from rich.markup import escape

    from spectune.errors import EngineError, SpectuneError

    console = _err_console()
    try:
        code = app(args=argv, prog_name="spectune", standalone_mode=False)
    except typer.TyperException as e:  # typer's usage errors (click's), made one line like ours
        message = " ".join(e.format_message().split())  # type: ignore[attr-defined]
        if message:  # empty: a group called without a command, whose help typer has printed
            ctx = getattr(e, "ctx", None)
            where = f"{ctx.command_path}: " if ctx is not None else ""
            console.print(f"[red]error:[/red] {escape(where + message)}", soft_wrap=True)
        sys.exit(e.exit_code)  # type: ignore[attr-defined]
    except SpectuneError as e:
        if _state["debug"]:
            raise
        console.print(f"[red]error:[/red] {escape(_one_line(str(e)))}", soft_wrap=True)
        if isinstance(e, EngineError) and e.log_path:
            console.print(f"engine log: {escape(e.log_path)}", soft_wrap=True)
        sys.exit(e.exit_code)
    except (KeyboardInterrupt, typer.Abort):
        console.print("interrupted")
        sys.exit(130)
    if code == 130:  # typer turns Ctrl-C in a command into Exit(130), returned here
        console.print("interrupted")
    sys.exit(code if isinstance(code, int) else 0)


