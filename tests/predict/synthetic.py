"""Synthetic measurements and stored studies the prediction tests rank, and recorded requests to replay."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from spectune.config import EngineArgs, Method, SpecConfig, WorkloadSpec
from spectune.measurement import (
    AcceptanceStats,
    Hardware,
    LatencyStats,
    Measurement,
    RequestSample,
    Versions,
    WindowStats,
)


def request_sample(prompt: list[int], output: list[int]) -> RequestSample:
    return RequestSample(prompt_id="p", ok=True, token_ids=output, prompt_token_ids=prompt,
                         output_tokens=len(output), prompt_tokens=len(prompt))

VERSIONS = Versions(spectune="test", vllm=None, torch=None, python="3")

HARDWARE = Hardware(platform="cpu", cpu="test", cpu_count=2, memory_bytes=None, gpus=[])

T0, BASE_THROUGHPUT = 10.0, 100.0

def latency_stats(value: float | None) -> LatencyStats:
    return LatencyStats(count=1, mean=value, median=value, p90=value, p99=value)

def synthetic_measurement(spec: SpecConfig, tpot_ms: float, per_position: list[float] | None = None,
                 requests: list[RequestSample] | None = None, drafts: int = 100) -> Measurement:
    """A consistent Measurement: throughput ~ 1 / TPOT, every decode step drafted."""
    throughput = BASE_THROUGHPUT * T0 / tpot_ms
    acceptance = None
    if per_position is not None:
        accepted = round(drafts * sum(per_position))
        acceptance = AcceptanceStats(
            num_drafts=drafts, num_draft_tokens=drafts * len(per_position), num_accepted_tokens=accepted,
            acceptance_rate=accepted / (drafts * len(per_position)), mean_acceptance_length=1 + accepted / drafts,
            per_position=per_position)
        out = drafts + accepted + 1  # one request: the prefill's token, then `drafts` steps
        requests = [RequestSample(prompt_id="p0", ok=True, output_tokens=out, tpot_ms=tpot_ms)]
    requests = requests or [RequestSample(prompt_id="p0", ok=True, output_tokens=101, tpot_ms=tpot_ms)]
    out_tokens = sum(r.output_tokens or 0 for r in requests)
    window = WindowStats(duration_seconds=out_tokens / throughput, output_throughput=throughput,
                         tpot_median_ms=tpot_ms, tpot_p99_ms=tpot_ms * 1.2, ttft_median_ms=50.0, ttft_p99_ms=60.0,
                         e2el_median_ms=50.0 + 100 * tpot_ms, e2el_p99_ms=60.0 + 120 * tpot_ms)
    return Measurement(
        spec=spec, engine=EngineArgs(model="tgt", max_model_len=512),
        workload=WorkloadSpec(source="synthetic.jsonl"), concurrency=1, command=["vllm"], log_path=None,
        started_at=dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc), startup_seconds=1.0,
        duration_seconds=window.duration_seconds, num_requests=len(requests), num_failed=0, input_tokens=10,
        output_tokens=out_tokens, output_throughput=throughput, request_throughput=1.0,
        total_token_throughput=throughput, ttft_ms=latency_stats(50.0), tpot_ms=latency_stats(tpot_ms), itl_ms=latency_stats(tpot_ms),
        e2el_ms=latency_stats(window.e2el_median_ms), acceptance=acceptance, peak_memory_bytes=None,
        versions=VERSIONS, hardware=HARDWARE, windows=[window], requests=requests,
    )

def modelled_tpot(c: float, k: int, per_position: list[float]) -> float:
    return T0 * (1 + c * k) / (1 + sum(per_position))

GOOD = [0.9, 0.8, 0.5, 0.2]  # a draft that agrees with the target over the first tokens

POOR = [0.2, 0.05, 0.01, 0.0]  # n-gram lookup on text that does not repeat itself

def synthetic_study() -> tuple[Measurement, list[Measurement]]:
    baseline = synthetic_measurement(SpecConfig(), T0)
    good = SpecConfig(method=Method.DRAFT_MODEL, model="good-draft", num_speculative_tokens=4)
    ngram = SpecConfig(method=Method.NGRAM, num_speculative_tokens=4, prompt_lookup_min=1, prompt_lookup_max=3)
    return baseline, [synthetic_measurement(good, modelled_tpot(0.1, 4, GOOD), GOOD), synthetic_measurement(ngram, modelled_tpot(0.05, 4, POOR), POOR)]

SPACE = """
methods:
  none: {}
  ngram:
    num_speculative_tokens: {low: 1, high: 4}
    prompt_lookup_max: 3
    prompt_lookup_min: 1
  draft_model:
    models: ["${draft}"]
    num_speculative_tokens: [2, 4]
"""

def store_study(url: str, name: str, space: Path, measurements: list[Measurement], draft: str | None,
                 objective: str = "output_throughput") -> None:
    """A study as run_study leaves it: its config, trials with spec attributes, measurements."""
    import optuna

    from spectune.measurement import spec_key
    from spectune.storage import MeasurementStore, open_optuna_storage

    s = optuna.create_study(study_name=name, storage=open_optuna_storage(url),
                            directions=["maximize" if objective == "output_throughput" else "minimize"])
    s.set_user_attr("objectives", [objective])
    s.set_user_attr("spectune_config", {"target": "tgt", "draft": draft, "space": str(space),
                                        "workload": {"source": "synthetic.jsonl"}, "objectives": [objective]})
    store = MeasurementStore(url)
    for m in measurements:
        value = getattr(m, objective) if objective == "output_throughput" else m.tpot_ms.median
        spec = m.spec.to_vllm() or {"method": "none"}
        s.add_trial(optuna.trial.create_trial(value=value, user_attrs={
            "config": m.spec.label(), "spec": spec, "spec_key": spec_key(m.spec.to_vllm()), "feasible": True}))
        t = s.get_trials(deepcopy=False)[-1]
        store.record(study_name=name, trial_id=t._trial_id, trial_number=t.number,
                     spec_key=spec_key(m.spec.to_vllm()), measurement=m)
