"""The exported k-per-batch-size schedule against every static k, on real engines.

1. ``study``: a grid study of SmolLM2-135M-Instruct (float32) with n-gram lookup at k = 1, 2, 4
   and 8 and no speculation, each engine measuring ``--levels`` requests in flight (a load mix,
   1, 2, 4, 8 and 16 by default),
   then ``spectune export --schedule`` of its choice: ``num_speculative_tokens_per_batch_size``
   from each level's measured step cost and acceptance.
2. ``compare``: engines started with the exported schedule and with each static choice (none
   included), ``--starts`` times each in rotating order. Each measures every level (prompts of
   its own, the same for every engine) and then mixed loads: arrivals at each ``--rate`` per second
   with bursts (gamma gaps of shape ``--burstiness``, as vllm bench serve's), at most 16 in
   flight, so that the batch swings between quiet and busy. vLLM's counters give the k each run
   used (draft tokens per draft).

Writes ``benchmarks/results/schedule.json`` (each run as it ends) with the machine and its
processor's features::

    .venv/bin/python benchmarks/schedule.py              # study, then compare: about 70 min on 2 cores
    .venv/bin/python benchmarks/schedule.py compare      # again on the exported schedule
    .venv/bin/python benchmarks/schedule.py table        # the summary of results/schedule.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

OUTPUT = REPO / "benchmarks" / "results" / "schedule.json"
WORK = REPO / "storage" / "bench-schedule"
LEVELS = (1, 2, 4, 8, 16)
KS = (1, 2, 4, 8)
LOOKUP = {"prompt_lookup_min": 1, "prompt_lookup_max": 4}
PROMPTS = {1: 8, 2: 8, 4: 12, 8: 16, 16: 32}
"""Prompts of each level in the comparison (disjoint; each mixed load takes the next ``--mixed``)."""
MAX_TOKENS = 48


ENGINE = {"dtype": "float32", "max_model_len": 2048}


def study(target: str, work: Path, levels: tuple[int, ...]) -> Path:
    """The grid study over the load mix and its export with the schedule; the exported YAML."""
    from spectune.study import load_study_config
    from spectune.worker import run_study

    space = {"description": "schedule benchmark", "methods": {
        "none": {}, "ngram": {"num_speculative_tokens": list(KS), **LOOKUP}}}
    (work / "space.yaml").write_text(yaml.safe_dump(space, sort_keys=False))
    config = load_study_config(None, {
        "target": target, "space": str(work / "space.yaml"), "storage": f"sqlite:///{work / 'study.db'}",
        "study_name": "mix", "trials": 1 + len(KS), "sampler": "grid", "log_dir": str(work / "logs"),
        "workload": "humaneval", "engine": dict(ENGINE), "repeats": 1})
    config = config.model_copy(update={"workload": config.workload.model_copy(update={
        "num_prompts": max(16, max(levels)) * len(levels), "concurrency": levels[0], "concurrency_levels": list(levels),
        "sampling": config.workload.sampling.model_copy(update={"max_tokens": MAX_TOKENS})})})
    run_study(config, progress=lambda e: print(f"  {e.kind} {e.label} {e.state} {e.values or ''}", flush=True)
              if e.kind == "trial_end" else None)
    return export(work)


def export(work: Path) -> Path:
    """``spectune export --schedule`` of the study: its choice, or over a mix whose choice is the
    baseline, the best speculative proposer's schedule."""
    from spectune.export import export_best
    from spectune.results import open_study

    out = work / "best.yaml"
    export_best(open_study(f"sqlite:///{work / 'study.db'}", "mix"), out, schedule_max_batch=256)
    if "speculative-config" not in yaml.safe_load(out.read_text()):
        raise SystemExit("the study's export speculates at no batch size: nothing to compare")
    return out


def _spec_of(best: Path) -> dict[str, Any]:
    return yaml.safe_load(best.read_text())["speculative-config"]


CONTROL_K = 2
"""The control: a schedule of this one k at every batch size, against static k (what vLLM's
dynamic speculation costs by itself)."""


def _configs(best: Path) -> list[tuple[str, dict[str, Any]]]:
    schedule = _spec_of(best)
    return [("none", {"method": "none"}),
            *((f"ngram k={k}", {"method": "ngram", "num_speculative_tokens": k, **LOOKUP}) for k in KS),
            ("schedule", schedule),
            (f"schedule of k={CONTROL_K} only", {"method": "ngram", "num_speculative_tokens": CONTROL_K, **LOOKUP,
                                                 "num_speculative_tokens_per_batch_size": [[1, 256, CONTROL_K]]})]


def _stats(result: Any, before: Any, after: Any) -> dict[str, Any]:
    """One load's figures from the client's timestamps and vLLM's counters."""
    ok = result.succeeded
    tokens = sum(r.output_tokens or 0 for r in ok)
    c = after - before
    edges = sorted([(r.start, 1) for r in ok] + [(r.start + (r.e2el or 0.0), -1) for r in ok])
    inflight, last, area = 0, 0.0, 0.0
    for t, step in edges:  # time-averaged requests in flight, while any is
        area += inflight * (t - last)
        inflight, last = inflight + step, t
    return {
        "requests": len(result.records), "failed": len(result.records) - len(ok),
        "output_throughput": tokens / result.duration if result.duration > 0 else 0.0,
        "duration_s": result.duration,
        "e2el_mean_ms": 1000 * statistics.fmean(r.e2el for r in ok if r.e2el is not None) if ok else None,
        "tpot_median_ms": 1000 * statistics.median(t for r in ok if (t := r.tpot) is not None) if ok else None,
        "mean_in_flight": area / last if last > 0 else 0.0,
        "drafts": c.num_drafts, "draft_tokens": c.num_draft_tokens, "accepted": c.num_accepted_tokens,
        "k_used": c.num_draft_tokens / c.num_drafts if c.num_drafts > 0 else 0.0,
    }


def run_one(target: str, label: str, spec: dict[str, Any], prompts: dict[str, list[Any]], levels: tuple[int, ...],
            rates: list[float], burstiness: float, work: Path) -> dict[str, Any]:
    """One engine start: every closed-loop level, then each mixed load."""
    from spectune.config import EngineArgs, SpecConfig, WorkloadSpec
    from spectune.counters import fetch_counters
    from spectune.engines import VLLMServer
    from spectune.load import run_load
    from spectune.trial import warmup_prompts

    engine = EngineArgs.model_validate({"model": target, **ENGINE})
    server = VLLMServer(engine, SpecConfig.model_validate(spec), log_path=work / "logs" / f"{label.replace(' ', '_')}.log",
                        startup_timeout=900)
    base = {"source": "humaneval", "sampling": {"max_tokens": MAX_TOKENS, "temperature": 0.0}, "warmup_requests": 0}
    out: dict[str, Any] = {"config": label, "spec": spec, "started_at": dt.datetime.now(dt.timezone.utc).isoformat()}
    with server:
        out["startup_s"] = server.startup_seconds

        def load(name: str, workload: WorkloadSpec, concurrency: int) -> None:
            before = fetch_counters(server.base_url)
            res = run_load(server.base_url, server.served_model_name, prompts[name], workload,
                           concurrency=concurrency, timeout=900, api_key=server.api_key)
            out[name] = _stats(res, before, fetch_counters(server.base_url))
            print(f"    {label} {name}: {out[name]['output_throughput']:.1f} tok/s, "
                  f"E2E {out[name]['e2el_mean_ms']:.0f} ms, k used {out[name]['k_used']:.2f}, "
                  f"in flight {out[name]['mean_in_flight']:.1f}", flush=True)

        run_load(server.base_url, server.served_model_name, warmup_prompts(2), WorkloadSpec(**base),
                 concurrency=1, timeout=900, api_key=server.api_key)
        for c in levels:
            load(f"c{c}", WorkloadSpec(**base, concurrency=c), c)
        for rate in rates:
            load(_mixed(rate), WorkloadSpec(**base, concurrency=16, request_rate=rate, burstiness=burstiness), 16)
    return out


def _mixed(rate: float) -> str:
    """The name of a mixed load at ``rate`` requests per second."""
    return "mixed" if rate == 0.6 else f"mixed@{rate:g}"


def compare(target: str, best: Path, starts: int, levels: tuple[int, ...], rates: list[float], burstiness: float,
            mixed: int, work: Path, record: dict[str, Any], out: Path, only: list[str] | None = None, control: bool = True) -> None:
    from spectune.config import WorkloadSpec
    from spectune.workloads import load_prompts

    names = [f"c{c}" for c in levels] + [_mixed(r) for r in rates]
    counts = [PROMPTS[c] for c in levels] + [mixed] * len(rates)
    selected = load_prompts(WorkloadSpec(source="humaneval", num_prompts=sum(counts), seed=0))
    prompts, at = {}, 0
    for name, n in zip(names, counts, strict=True):
        prompts[name], at = selected[at:at + n], at + n
    configs = [c for c in _configs(best) if (only is None or c[0] in only) and (control or not c[0].endswith(" only"))]
    record.update({"schedule": _spec_of(best), "burstiness": burstiness,
                   "prompts": {**record.get("prompts", {}), **dict(zip(names, counts, strict=True))},
                   "runs": record.get("runs", [])})
    record.setdefault("rates", {"mixed": 0.6} if any("mixed" in r for r in record["runs"]) else {})
    record["rates"].update({_mixed(r): r for r in rates})
    for start in range(starts):
        order = configs[start % len(configs):] + configs[:start % len(configs)]  # rotating: no config always first
        for label, spec in order:
            print(f"  start {start + 1}/{starts}: {label}", flush=True)
            run = run_one(target, label, spec, prompts, levels, rates, burstiness, work)
            run["start"] = start
            run["load_average"] = os.getloadavg()
            record["runs"].append(run)
            _save(record, out)


def _levels(record: dict[str, Any]) -> list[int]:
    return list(record.get("levels", (1, 4, 16)))


def summary(record: dict[str, Any]) -> dict[str, Any]:
    """Per configuration and load: the mean over starts, and each start's."""
    out: dict[str, Any] = {}
    for run in record.get("runs", []):
        for name in [f"c{c}" for c in _levels(record)] + list(record.get("rates", {"mixed": 0.6})):
            if name in run:
                cell = out.setdefault(run["config"], {}).setdefault(name, {"throughput": [], "e2el_mean_ms": [],
                                                                             "k_used": []})
                cell["throughput"].append(run[name]["output_throughput"])
                cell["e2el_mean_ms"].append(run[name]["e2el_mean_ms"])
                cell["k_used"].append(run[name]["k_used"])
                out_tokens = run[name]["output_throughput"] * run[name]["duration_s"]
                cell.setdefault("drafted_per_token", []).append(run[name]["draft_tokens"] / out_tokens if out_tokens else 0.0)
    return out


def table(record: dict[str, Any]) -> str:
    """Mean over starts (each start's in brackets): throughput at each level, mean end-to-end
    latency of each mixed load, and the drafted tokens per output token at the lowest and
    highest level."""
    s = summary(record)
    names = [f"c{c}" for c in _levels(record)]
    mixes = list(record.get("rates", {"mixed": 0.6}))
    ends = (names[0], names[-1])
    lines = ["| config | " + " | ".join(f"{n[1:]} in flight, tok/s" for n in names)
             + "".join(f" | mixed {record.get('rates', {}).get(m, 0.6):g}/s, mean E2E ms" for m in mixes)
             + f" | drafted per output token at {ends[0][1:]} / {ends[1][1:]} |",
             "|---|" + "---|" * (len(names) + len(mixes) + 1)]

    def cell(cells: dict[str, Any], name: str, key: str, fmt: str) -> str:
        if name not in cells:
            return "-"
        values = cells[name][key]
        return f"{statistics.fmean(values):{fmt}} ({', '.join(f'{v:{fmt}}' for v in values)})"

    for config, cells in s.items():
        drafted = " / ".join(f"{statistics.fmean(cells[n]['drafted_per_token']):.2f}" if n in cells else "-"
                             for n in ends)
        lines.append(f"| {config} | " + " | ".join(cell(cells, n, "throughput", ".1f") for n in names)
                     + "".join(f" | {cell(cells, m, 'e2el_mean_ms', '.0f')}" for m in mixes) + f" | {drafted} |")
    return "\n".join(lines)


def ceiling(record: dict[str, Any]) -> dict[str, Any] | None:
    """What any schedule could gain over the best single static choice on the closed-loop levels:
    the best static configuration at each level (an oracle that knows the batch) against the
    static configuration best over all levels, each level weighted equally (geometric means of
    mean throughputs). The schedule's own figure beside it. None without two static
    configurations measured at every level."""
    s = summary(record)
    names = [f"c{c}" for c in _levels(record)]
    static = {cfg: [statistics.fmean(cells[n]["throughput"]) for n in names] for cfg, cells in s.items()
              if cfg != "schedule" and not cfg.endswith(" only") and all(n in cells for n in names)}
    static = {cfg: values for cfg, values in static.items() if min(values) > 0}  # a level that failed: no ratio
    if len(static) < 2:
        return None

    def whole(values: list[float]) -> float:
        return math.exp(statistics.fmean(math.log(v) for v in values))

    best = max(static, key=lambda cfg: whole(static[cfg]))
    oracle = whole([max(v[i] for v in static.values()) for i in range(len(names))])
    out = {"best_static": best, "oracle_over_best_static": oracle / whole(static[best]),
           "oracle_by_level": {n: max(static, key=lambda cfg, i=i: static[cfg][i]) for i, n in enumerate(names)}}
    if "schedule" in s and all(n in s["schedule"] and min(s["schedule"][n]["throughput"]) > 0 for n in names):
        out["schedule_over_best_static"] = whole([statistics.fmean(s["schedule"][n]["throughput"]) for n in names]) \
            / whole(static[best])
    return out


def _save(record: dict[str, Any], out: Path) -> None:
    record["summary"] = summary(record)
    record["ceiling"] = ceiling(record)
    out.write_text(json.dumps(record, indent=2, default=str) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase", nargs="?", default="all", choices=["all", "study", "compare", "table"])
    parser.add_argument("--starts", type=int, default=2, help="engine starts of each configuration")
    parser.add_argument("--levels", default=",".join(map(str, LEVELS)),
                        help="requests in flight of the study's load mix and of the closed-loop comparison")
    parser.add_argument("--rate", type=float, action="append",
                        help="a mixed load at this many requests per second (repeatable; default 0.6 and 1.2)")
    parser.add_argument("--burstiness", type=float, default=0.25, help="mixed load: gamma shape of the gaps")
    parser.add_argument("--mixed", type=int, default=40, help="mixed load: requests")
    parser.add_argument("--mixed-only", action="store_true",
                        help="compare: the mixed loads alone, added to the output's runs")
    parser.add_argument("--only", action="append", help="compare: this configuration alone (repeatable), "
                        "e.g. 'ngram k=2' or 'schedule of k=2 only'")
    parser.add_argument("--no-control", action="store_true",
                        help=f"compare: leave out the control (a schedule of k={CONTROL_K} at every batch size)")
    parser.add_argument("--out", type=Path, default=OUTPUT, help="the results file")
    args = parser.parse_args()
    if args.phase == "table":
        record = json.loads(args.out.read_text())
        print(table(record))
        print(json.dumps(ceiling(record), indent=1))
        return
    levels = tuple(int(c) for c in args.levels.split(","))
    unknown = sorted(set(levels) - set(PROMPTS))
    if unknown:
        raise SystemExit(f"--levels: no prompt count for {unknown}; choose from {sorted(PROMPTS)}")
    rates = args.rate or [0.6, 1.2]
    from spectune.checkpoints import prepare_smollm2
    from spectune.provenance import hardware, versions

    target = str(prepare_smollm2())
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / "logs").mkdir(exist_ok=True)
    earlier = json.loads(args.out.read_text()) if args.mixed_only and args.out.exists() else {}
    record: dict[str, Any] = {"date": dt.date.today().isoformat(), "hardware": hardware().model_dump(),
                              "versions": versions().model_dump(), "model": "SmolLM2-135M-Instruct",
                              "engine": dict(ENGINE), "levels": list(levels), "max_tokens": MAX_TOKENS}
    if earlier:  # runs added to earlier ones: what they were measured with is kept, and this machine too
        record = {**earlier, "added": [*earlier.get("added", []), {k: record[k] for k in ("date", "hardware", "versions")}]}
    best = WORK / "best.yaml"
    if args.phase in ("all", "study"):
        for stale in ("study.db", "best.yaml", "best.provenance.json"):
            (WORK / stale).unlink(missing_ok=True)
        print("study over the load mix", flush=True)
        best = study(target, WORK, levels)
        print(best.read_text(), flush=True)
    if args.phase in ("all", "compare"):
        best = export(WORK)  # the exported schedule as this checkout derives it
        record["study_export"] = yaml.safe_load(best.read_text())
        record["study_provenance"] = json.loads((WORK / "best.provenance.json").read_text())
        compare(target, best, args.starts, () if args.mixed_only else levels, rates, args.burstiness, args.mixed,
                WORK, record, args.out, only=args.only, control=not args.no_control)
        print(table(record))


if __name__ == "__main__":
    main()
