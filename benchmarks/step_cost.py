"""The baseline's step-cost curve against what speculative engines measure, on this machine.

Starts the baseline (no speculation), which times its step-cost curve after its windows
(:mod:`spectune.stepcost`), then one engine per candidate, on the same prompts and load::

    python benchmarks/step_cost.py                 # SmolLM2-135M, code-edit prompts, 8 in flight
    python benchmarks/step_cost.py --tiny --concurrency 4
    python benchmarks/step_cost.py --markdown      # the table of the last run

For each engine: the time of one step its engine core implies (its TPOT times the tokens a step
yields, by vLLM's own counters and timing) against the curve's at the same tokens per forward
(``B (1 + d)``, ``B`` the sequences it kept in flight, ``d`` drafted tokens per step); and each
candidate's output throughput as predicted from the baseline alone (acceptance replayed from its
answers) with the curve (``step-cost``) and without it (the prior), against what it measured.
Writes ``benchmarks/results/step_cost.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench_common import tiny_models, workdir  # noqa: E402

from spectune._util import atomic_write_text  # noqa: E402

DEFAULT_OUTPUT = REPO / "benchmarks" / "results" / "step_cost.json"
CANDIDATES = ({"method": "ngram", "num_speculative_tokens": 1, "prompt_lookup_max": 4, "prompt_lookup_min": 2},
              {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2},
              {"method": "suffix"})


def run(args: argparse.Namespace) -> dict[str, Any]:
    from spectune.config import EngineArgs, SpecConfig, WorkloadSpec
    from spectune.predict import effective_k
    from spectune.provenance import hardware, versions
    from spectune.stepcost import probe_tokens
    from spectune.trial import measure
    from spectune.workloads import load_prompts

    specs = [SpecConfig.model_validate(c) for c in CANDIDATES]
    tokens = probe_tokens(max(effective_k(s) or 1 for s in specs))  # as a study of these candidates asks
    with workdir() as work:
        if args.tiny:
            target, _ = tiny_models(work / "tiny")
            engine = EngineArgs(model=target, dtype="float32", max_model_len=1024, enforce_eager=True, seed=0)
        else:
            from spectune.checkpoints import prepare_smollm2

            engine = EngineArgs(model=str(prepare_smollm2()), dtype=args.dtype)
        workload = WorkloadSpec.model_validate({
            "source": args.prompts, "num_prompts": args.num_prompts, "seed": 0, "concurrency": args.concurrency,
            "sampling": {"max_tokens": args.max_tokens, "temperature": 0.0}})
        prompts = load_prompts(workload)
        base = measure(engine, SpecConfig(), workload, prompts, log_dir=work, repeats=2, step_cost=tokens)
        runs = [measure(engine, s, workload, prompts, log_dir=work, repeats=2, answer_margins=False) for s in specs]
    return {"recorded_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "model": "tiny" if args.tiny else "SmolLM2-135M-Instruct", "dtype": engine.dtype or "bfloat16",
            "prompts": str(args.prompts), "num_prompts": args.num_prompts, "max_tokens": args.max_tokens,
            "concurrency": args.concurrency, "step_cost": base.step_cost.model_dump() if base.step_cost else None,
            "engines": [_compare(base, m) for m in [base, *runs]],
            "versions": versions().model_dump(), "hardware": hardware().model_dump()}


def _compare(base: Any, m: Any) -> dict[str, Any]:
    """One engine's implied step time against the curve's, and (a candidate) its throughput as
    predicted from the baseline with and without the curve."""
    from spectune.predict import StepCurve, measured_profile, predict_candidates

    curve = StepCurve.of(base.step_cost, base.workload.concurrency)
    profile = measured_profile(m)
    e = profile.tokens_per_step if profile else 1.0
    d = profile.drafted_per_step if profile else 0.0
    in_flight = m.mean_in_flight or float(m.workload.concurrency)
    out: dict[str, Any] = {"label": m.spec.label(), "output_throughput": round(m.output_throughput, 2),
                           "tokens_per_step": round(e, 3), "drafted_per_step": round(d, 3),
                           "mean_in_flight": round(in_flight, 2)}
    if m.engine_timing is not None and m.engine_timing.tpot_ms and curve is not None:
        implied = m.engine_timing.tpot_ms * e
        at = curve.ms(in_flight * (1.0 + d))
        out.update(step_ms=round(implied, 3), curve_ms=round(at, 3), error=round(implied / at - 1.0, 4))
    if not m.spec.is_baseline:
        for name, b in (("with_curve", base), ("prior", base.model_copy(update={"step_cost": None}))):
            (p,) = predict_candidates([m.spec], b, [])
            v = p.output_throughput
            out[name] = {"value": round(v.value, 2), "low": round(v.low, 2), "high": round(v.high, 2),
                         "inside": v.low <= m.output_throughput <= v.high, "cost_source": p.cost_source,
                         "error": round(v.value / m.output_throughput - 1.0, 4)}
    return out


def markdown(result: dict[str, Any]) -> str:
    hw = result["hardware"]
    rows = ["| engine | tok/s | E | d | step ms (engine) | curve ms | error | predicted, curve | predicted, prior |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in result["engines"]:
        def pred(key: str) -> str:
            p = r.get(key)
            return "" if p is None else f"{p['value']} ({p['low']}-{p['high']}){'' if p['inside'] else ' outside'}"
        err = f"{100 * r['error']:+.1f} %" if "error" in r else "-"
        rows.append(f"| {r['label']} | {r['output_throughput']} | {r['tokens_per_step']} | {r['drafted_per_step']} | "
                    f"{r.get('step_ms', '-')} | {r.get('curve_ms', '-')} | {err} | {pred('with_curve')} | {pred('prior')} |")
    curve = result["step_cost"] or {}
    return (f"{result['model']} ({result['dtype']}), {result['num_prompts']} prompts x {result['max_tokens']} tokens "
            f"at {result['concurrency']} in flight, {result['recorded_at'][:10]}, {hw['cpu']}"
            f" ({', '.join(hw.get('cpu_features') or []) or 'features unknown'}); the curve took "
            f"{curve.get('seconds', 0):.1f} s of engine time.\n\n" + "\n".join(rows) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="the project's tiny model (float32), not SmolLM2")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--prompts", default=str(REPO / "benchmarks" / "landscapes" / "code_edit.jsonl"))
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--markdown", action="store_true", help="print the last run's table, run nothing")
    args = parser.parse_args()
    if args.markdown:
        print(markdown(json.loads(args.out.read_text())))
        return
    result = run(args)
    atomic_write_text(args.out, json.dumps(result, indent=1) + "\n")
    print(markdown(result))


if __name__ == "__main__":
    main()
