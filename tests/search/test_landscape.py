"""The recorded landscape the search tests replay: a real recording, its engine starts in turn, its errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from landscape_runs import slower

from spectune.config import Method, SpecConfig
from spectune.landscape import Landscape
from spectune.worker import run_study

REPO = Path(__file__).resolve().parents[2]


def test_the_landscape_is_a_real_recording_of_every_candidate(landscape: Landscape) -> None:
    from spectune.space import load_space

    config = landscape.config()
    space = load_space(config.space).resolve(config.target, draft=config.draft)
    assert len(landscape.points) == len(space.enumerate()) >= 30
    assert {p.key for p in landscape.points} == {landscape.point(s).key for s in space.enumerate()}  # type: ignore[union-attr]
    for p in landscape.points:
        m = p.measurement
        assert m is not None and m.versions.vllm and m.engine.model == config.target
        assert p.engine_seconds > m.startup_seconds > 0
        assert (m.acceptance is None) == (p.spec.get("method", "none") == "none")


def test_a_landscape_with_several_engine_starts_replays_them_in_turn_and_knows_their_spread(landscape: Landscape) -> None:
    from spectune.errors import ConfigError

    two = Landscape.combine([landscape, slower(landscape, 0.5)])
    assert len(two.points) == 2 * len(landscape.points)
    assert all(len(engines) == 2 for engines in two.engines().values())
    assert two.by_key() == landscape.by_key()  # the first start of each candidate
    spec = SpecConfig(method=Method.SUFFIX, num_speculative_tokens=8)
    first = landscape.value(landscape.point(spec), "output_throughput")  # type: ignore[arg-type]
    spent: list[tuple[str, float]] = []
    measure = two.measurer(spent)
    got = [measure(None, spec).output_throughput for _ in range(3)]
    assert got == pytest.approx([first, first * 0.5, first])
    assert [label for label, _ in spent] == ["suffix k=8"] * 3
    # each candidate's two starts lie a third either side of its mean: a band of twice that
    assert two.noise_band("output_throughput") == pytest.approx(2 / 3)
    assert landscape.noise_band("output_throughput") == 0.02  # one start each: the floor alone
    assert landscape.noise_band("output_throughput", floor=0.05) == 0.05
    # as a study pools its own: the standard deviation of (v, v/2) over their mean, sqrt(2)/3
    assert two.engine_spread("output_throughput") == pytest.approx(2**0.5 / 3)
    assert landscape.engine_spread("output_throughput") is None
    assert two.starts("output_throughput")[two.point(spec).key] == pytest.approx([first, first * 0.5])  # type: ignore[union-attr]
    other = landscape.model_copy(update={"study_config": {**landscape.study_config,
                                                          "workload": {"source": "mtbench"}}})
    with pytest.raises(ConfigError, match="their workload differ"):
        Landscape.combine([landscape, other])


def test_landscape_load_errors_name_the_file(tmp_path: Path) -> None:
    from spectune.errors import ConfigError

    bad = tmp_path / "bad.json"
    bad.write_text("{\n  nope")
    with pytest.raises(ConfigError, match=r"bad\.json: line 2: not JSON"):
        Landscape.load(bad)
    bad.write_text(json.dumps({"points": []}))
    with pytest.raises(ConfigError, match=r"bad\.json"):
        Landscape.load(bad)
    with pytest.raises(ConfigError, match="cannot read the landscape"):
        Landscape.load(tmp_path / "missing.json")


def test_a_spaces_engine_section_reaches_every_trial_and_the_study_overrides_it(
        landscape: Landscape, tmp_path: Path) -> None:
    space = yaml.safe_load(Path(landscape.config().space).read_text())
    space["methods"] = {"none": {}, "ngram": space["methods"]["ngram"]}
    space["engine"] = {"max_num_seqs": 8, "max_model_len": 384}
    space_file = tmp_path / "space.yaml"
    space_file.write_text(yaml.safe_dump(space))
    seen = []
    replay = landscape.measurer()

    def measure(engine, spec, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        seen.append(engine)
        return replay(engine, spec, *args, **kwargs)

    config = landscape.config(storage=f"sqlite:///{tmp_path / 'e.db'}", study_name="engine", space=str(space_file),
                              sampler="grid", trials=3, engine={"max_model_len": 256}, log_dir=str(tmp_path / "logs"))
    run_study(config, measure_fn=measure)
    assert len(seen) == 3
    for engine in seen:
        assert engine.max_num_seqs == 8  # from the space
        assert engine.max_model_len == 256  # the study's own value wins
        assert engine.model == config.target
    # the space's engine section changed under the same study: its trials would not compare
    from spectune.errors import ConfigError

    space["engine"]["max_num_seqs"] = 16
    space_file.write_text(yaml.safe_dump(space))
    with pytest.raises(ConfigError, match=r"another engine \(engine_args\.max_num_seqs 8 -> 16\)"):
        run_study(config.model_copy(update={"trials": 4}), measure_fn=measure)
    assert len(seen) == 3


def test_the_rival_rules_replayed_on_a_landscape_of_one_start_each() -> None:
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    import landscapes

    landscape = Landscape.load(REPO / "benchmarks" / "landscapes" / "tiny_one_start.json")
    means = landscape.means("output_throughput")
    best = max(means, key=means.__getitem__)
    rules = landscapes.rival_rules(landscape, 3)
    # one recorded start each: successive halving keeps the better half by exact values and ends on the best,
    # after every candidate once and the halves again (less than twice the grid)
    halving = rules["successive_halving"]
    assert halving["chosen"] == [best] * 3 and halving["regret_median"] == 0.0
    assert 1.0 < halving["stop_ratio"] < 2.0
    assert rules["grid_once"]["chosen"] == [best] * 3 and rules["grid_once"]["stop_ratio"] == pytest.approx(1.0)
    # vLLM's rule runs every candidate 3 times (no spread: the score is the value) and hands a score within
    # 1 % of the best to the smaller k: suffix k=8 (459.4 tok/s) over suffix k=16 (464.0)
    vllm = rules["vllm_tune_k"]
    assert vllm["stop_ratio"] == pytest.approx(3.0)
    k8 = "suffix k=8"
    assert best == "suffix k=16" and means[k8] >= 0.99 * means[best] and vllm["chosen"] == [k8] * 3
    assert vllm["regret_median"] == pytest.approx(1.0 - means[k8] / means[best])
    assert landscapes.band_holds(100.0, 95.0, 0.06) and not landscapes.band_holds(100.0, 90.0, 0.06)
