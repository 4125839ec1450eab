"""Search spaces (YAML -> typed space -> Optuna suggestions) and draft/target pairing checks."""

from __future__ import annotations

import json
import logging
import textwrap
import warnings
from pathlib import Path

import optuna
import pytest
from optuna.trial import FixedTrial

from spectune._util import validate
from spectune.config import EngineArgs, Method, SpecConfig
from spectune.errors import ConfigError
from spectune.pairing import _check, check_pairing
from spectune.space import SearchSpace, list_spaces, load_space, spaces_dirs

REPO = Path(__file__).resolve().parent.parent
SHIPPED = sorted(p.stem for p in (REPO / "search_spaces").glob("*.yaml"))


def write_space(tmp_path: Path, text: str, name: str = "space.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def space_of(data: dict) -> SearchSpace:
    return validate(SearchSpace, data, "test")


def one_line_error(path_or_name: str | Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_space(path_or_name)
    message = str(info.value)
    assert "\n" not in message
    return message


# ---------------------------------------------------------------------------------------------
# Shipped spaces


def test_the_shipped_spaces_are_the_repositorys_data_package() -> None:
    assert spaces_dirs()[-1] == REPO / "search_spaces"  # spectune.search_spaces: this checkout, installed editable
    assert set(SHIPPED) >= {"default", "ngram", "draft", "eagle", "mlp_speculator", "suffix", "mtp"}
    assert set(list_spaces()) >= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_space_loads_resolves_and_enumerates(name: str) -> None:
    space = load_space(name)
    assert space.source == str(REPO / "search_spaces" / f"{name}.yaml")
    assert space.description
    assert (REPO / "search_spaces" / f"{name}.yaml").read_text().startswith("#")  # a header comment
    resolved = space.resolve("org/target", draft="org/draft")
    candidates = resolved.enumerate()
    assert candidates[0] == SpecConfig()  # the baseline first
    assert len(candidates) == len({c.model_dump_json() for c in candidates}) > 1
    for spec in candidates:
        assert spec.model in (None, "org/draft")
        assert spec.to_vllm() is None or spec.to_vllm()["method"] == spec.method.value


def test_default_space_without_a_draft_drops_the_draft_method(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="spectune.space"):
        resolved = load_space("default").resolve("org/target")
    assert Method.DRAFT_MODEL not in resolved.methods
    assert Method.NGRAM in resolved.methods
    assert "draft_model left out" in caplog.text


def test_a_draft_only_space_without_a_draft_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"draft\.yaml: no method but the baseline left: draft_model"):
        load_space("draft").resolve("org/target")


def test_dump_and_reload_give_the_same_candidates() -> None:
    space = load_space("default").resolve("t", draft="d")
    again = SearchSpace.model_validate(space.model_dump())
    assert again.enumerate() == space.enumerate()
    assert again.model_dump() == space.model_dump()


# ---------------------------------------------------------------------------------------------
# Errors: one line naming the file and the dotted key


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("methods:\n  ngram:\n    num_speculative_tokens: 2\n    k: 3\n", "methods.ngram.k: unknown key"),
        ("methods:\n  none: {}\nengine_args: {}\n", "engine_args: unknown key"),
        ("methods:\n  ngram:\n    num_speculative_tokens: {low: 1, high: 4, stepp: 1}\n",
         "methods.ngram.num_speculative_tokens.stepp: unknown key"),
        ("methods:\n  ngram:\n    num_speculative_tokens: []\n",
         "methods.ngram.num_speculative_tokens: empty list of choices"),
        ("methods:\n  ngram:\n    num_speculative_tokens: {low: 6, high: 1}\n",
         "methods.ngram.num_speculative_tokens: empty range: low (6) > high (1)"),
        ("methods:\n  ngram:\n    num_speculative_tokens: {low: 1, high: 6, step: 2}\n",
         "high (6) is not low (1) plus a multiple of step (2)"),
        ("methods:\n  ngram:\n    num_speculative_tokens: {low: 1}\n", "a range needs both low and high"),
        ("methods:\n  ngram:\n    num_speculative_tokens: [2, 2]\n", "repeated choice"),
        ("methods:\n  ngram:\n    num_speculative_tokens: 0\n",
         "methods.ngram.num_speculative_tokens: 0 is out of range"),
        ("methods:\n  ngram:\n    num_speculative_tokens: 2.5\n", "expected an integer"),
        ("methods:\n  ngram:\n    num_speculative_tokens: {low: 1, high: 4, log: true}\n",
         "methods.ngram.num_speculative_tokens.log: unknown key"),
        ("methods:\n  suffix:\n    suffix_decoding_min_token_prob: {low: 0.1, high: 1.5}\n",
         "methods.suffix.suffix_decoding_min_token_prob: 1.5 is out of range"),
        ("methods:\n  suffix:\n    suffix_decoding_max_spec_factor: {low: 0, high: 2, log: true}\n",
         "log range needs low > 0"),
        ("methods:\n  telepathy: {}\n", "methods: unknown method 'telepathy' (known: none, ngram, draft_model"),
        ("methods:\n  ngram:\n    num_speculative_tokens: 2\n    suffix_decoding_max_tree_depth: 8\n",
         "methods.ngram.suffix_decoding_max_tree_depth: does not apply to method ngram"),
        ("methods:\n  suffix:\n    prompt_lookup_max: 3\n",
         "methods.suffix.prompt_lookup_max: does not apply to method suffix"),
        ("methods:\n  ngram:\n    models: [x]\n    num_speculative_tokens: 2\n",
         "methods.ngram.models: does not apply to method ngram"),
        ("methods:\n  none:\n    num_speculative_tokens: 2\n",
         "methods.none.num_speculative_tokens: does not apply to method none (none takes no parameters)"),
        ("methods:\n  draft_model:\n    num_speculative_tokens: 2\n", "methods.draft_model: method draft_model needs models"),
        ("methods:\n  ngram:\n    prompt_lookup_max: 3\n", "methods.ngram: method ngram needs num_speculative_tokens"),
        ("methods:\n  draft_model:\n    models: ['${drafts}']\n    num_speculative_tokens: 2\n",
         "methods.draft_model.models: unknown placeholder ${drafts}"),
        ("methods:\n  draft_model:\n    models: []\n    num_speculative_tokens: 2\n", "methods.draft_model.models: empty list"),
        ("methods:\n  ngram:\n    num_speculative_tokens: 2\n    prompt_lookup_min: [3, 4]\n    prompt_lookup_max: [2, 5]\n",
         "methods.ngram: prompt_lookup_min can exceed prompt_lookup_max (4 > 2)"),
        ("methods:\n  ngram:\n    num_speculative_tokens: 2\n    prompt_lookup_min: {low: 5, high: 6}\n    prompt_lookup_max: [2, 3]\n",
         "prompt_lookup_min is never <= prompt_lookup_max"),
        ("methods:\n  none:\n    requires: [arctic-inference]\n", "did you mean arctic_inference?"),
        ("methods: {}\n", "methods: no methods"),
        ("methods:\n  none: {}\nengine:\n  model: org/target\n", "engine.model: the target model is not part of a search space"),
        ("methods:\n  none: {}\nengine:\n  max_num_seqs: 0\n", "engine.max_num_seqs:"),
        ("methods:\n  none: {}\nengine:\n  extra_args: {speculative-config: x}\n", "engine: extra_args: speculative-config is set by spectune"),
        ("- methods\n", "expected a mapping with 'methods'"),
        ("", "empty search space"),
        ("methods: [unclosed\n", "invalid YAML"),
    ],
)
def test_invalid_spaces_are_one_line_naming_file_and_key(tmp_path: Path, body: str, needle: str) -> None:
    path = write_space(tmp_path, body)
    message = one_line_error(path)
    assert message.startswith(str(path)), message
    assert needle in message, message


def test_unknown_name_lists_the_known_ones() -> None:
    message = one_line_error("no-such-space")
    assert "no search space named 'no-such-space'" in message
    assert "default" in message and "ngram" in message


def test_named_spaces_are_also_looked_up_in_the_env_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_space(tmp_path, "methods:\n  none: {}\n", "mine.yaml")
    write_space(tmp_path, "description: shadow\nmethods:\n  none: {}\n", "ngram.yaml")
    monkeypatch.setenv("SPECTUNE_SPACES", str(tmp_path))
    assert list(load_space("mine").methods) == [Method.NONE]
    assert load_space("ngram").description == "shadow"  # the user's folder wins a name
    assert load_space("default").source == str(REPO / "search_spaces" / "default.yaml")


def test_a_method_whose_module_is_missing_is_dropped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write_space(tmp_path, """\
        methods:
          ngram:
            num_speculative_tokens: 2
          suffix:
            requires: [spectune_no_such_module.sub]
            num_speculative_tokens: 8
          none:
            requires: [json]
    """)
    with caplog.at_level(logging.WARNING, logger="spectune.space"):
        space = load_space(path)
    assert list(space.methods) == [Method.NONE, Method.NGRAM]  # baseline first, suffix dropped
    assert "method suffix left out: module spectune_no_such_module.sub is not importable" in caplog.text


def test_only_missing_modules_leave_nothing(tmp_path: Path) -> None:
    path = write_space(tmp_path, "methods:\n  suffix:\n    requires: [spectune_no_such_module]\n")
    assert "no method left" in one_line_error(path)


# ---------------------------------------------------------------------------------------------
# Placeholders


def test_placeholders_are_substituted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECTUNE_TEST_HEAD", "org/head")
    space = space_of({"methods": {
        "draft_model": {"models": ["${target}", "${draft}", "/m/${draft}-copy", "/m/other"], "num_speculative_tokens": 2},
        "eagle3": {"models": "${env:SPECTUNE_TEST_HEAD}", "num_speculative_tokens": 2},
        "mtp": {"models": ["${draft}"], "num_speculative_tokens": 1},
    }})
    resolved = space.resolve("org/target", draft=["d1", "d2", "org/target"])
    assert resolved.methods[Method.DRAFT_MODEL].models == ["org/target", "d1", "d2", "/m/d1-copy", "/m/d2-copy",
                                                           "/m/org/target-copy", "/m/other"]
    assert resolved.methods[Method.EAGLE3].models == ["org/head"]
    no_draft = space.resolve("org/target")
    assert no_draft.methods[Method.DRAFT_MODEL].models == ["org/target", "/m/other"]
    assert no_draft.methods[Method.MTP].models is None  # MTP needs no model: kept without one
    assert space.methods[Method.DRAFT_MODEL].models[1] == "${draft}"  # resolve returns a copy


def test_unset_env_placeholder_and_unresolved_use_are_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECTUNE_TEST_UNSET", raising=False)
    space = space_of({"methods": {"eagle": {"models": ["${env:SPECTUNE_TEST_UNSET}"], "num_speculative_tokens": 2}}})
    with pytest.raises(ConfigError, match=r"methods.eagle.models: \$\{env:SPECTUNE_TEST_UNSET\} is used but"):
        space.resolve("t")
    with pytest.raises(ConfigError, match="call resolve"):
        space.enumerate()
    with pytest.raises(ConfigError, match="call resolve"):
        space.suggest(FixedTrial({}))


# ---------------------------------------------------------------------------------------------
# Optuna: suggest, params_of, enumerate agree


ROUND_TRIP = {
    "methods": {
        "none": {},
        "ngram": {  # min is a choice list, max a stepped range: max gets the dynamic range
            "num_speculative_tokens": [1, 3],
            "prompt_lookup_min": [1, 3, 5],
            "prompt_lookup_max": {"low": 2, "high": 6, "step": 2},
        },
        "draft_model": {"models": ["${target}", "${draft}"], "num_speculative_tokens": {"low": 1, "high": 3},
                        "draft_tensor_parallel_size": 1},
        "suffix": {
            "num_speculative_tokens": 16,
            "suffix_decoding_max_spec_factor": {"low": 0.5, "high": 2.0, "step": 0.25},
            "suffix_decoding_min_token_prob": [0.05, 0.1],
            "suffix_decoding_max_tree_depth": {"low": 8, "high": 8},
        },
        "mtp": {"num_speculative_tokens": {"low": 1, "high": 2}},
    },
}


def round_trip_spaces() -> list[tuple[str, SearchSpace]]:
    spaces = [(name, load_space(name).resolve("org/target", draft="org/draft")) for name in SHIPPED]
    spaces.append(("hand-made", space_of(ROUND_TRIP).resolve("org/target", draft="org/draft")))
    return spaces


@pytest.mark.parametrize(("name", "space"), round_trip_spaces(), ids=lambda v: v if isinstance(v, str) else "")
def test_params_of_round_trips_through_suggest(name: str, space: SearchSpace) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a FixedTrial value outside its distribution warns
        for spec in space.enumerate():
            params = space.params_of(spec)
            trial = FixedTrial(params)
            assert space.suggest(trial) == spec
            assert trial.params == params  # exactly the parameters suggest draws, no more
            assert all(key == "method" or key.startswith(f"{spec.method.value}.") for key in params)


def test_enumerate_keeps_the_ngram_window_ordered_and_complete() -> None:
    space = space_of(ROUND_TRIP).resolve("org/target", draft="org/draft")
    ngram = [s for s in space.enumerate() if s.method is Method.NGRAM]
    pairs = {(s.prompt_lookup_min, s.prompt_lookup_max) for s in ngram}
    assert pairs == {(lo, hi) for lo in (1, 3, 5) for hi in (2, 4, 6) if lo <= hi}
    assert len(ngram) == 2 * len(pairs)
    suffix = [s for s in space.enumerate() if s.method is Method.SUFFIX]
    # a stepped float range gives low, its midpoint on the grid, high
    assert sorted({s.suffix_decoding_max_spec_factor for s in suffix}) == [0.5, 1.25, 2.0]
    assert {s.suffix_decoding_max_tree_depth for s in suffix} == {8}


def test_fixed_values_are_no_optuna_parameters() -> None:
    space = space_of(ROUND_TRIP).resolve("org/target", draft="org/draft")
    spec = SpecConfig(method=Method.SUFFIX, num_speculative_tokens=16, suffix_decoding_max_spec_factor=1.25,
                      suffix_decoding_min_token_prob=0.1, suffix_decoding_max_tree_depth=8)
    assert space.params_of(spec) == {"method": "suffix", "suffix.suffix_decoding_max_spec_factor": 1.25,
                                     "suffix.suffix_decoding_min_token_prob": 0.1}
    single = space_of({"methods": {"ngram": {"num_speculative_tokens": [2, 4]}}})
    assert single.params_of(SpecConfig(method=Method.NGRAM, num_speculative_tokens=4)) == {"ngram.num_speculative_tokens": 4}


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        (SpecConfig(method=Method.EAGLE, model="h", num_speculative_tokens=2), "method eagle is not in this space"),
        (SpecConfig(method=Method.NGRAM, num_speculative_tokens=2, prompt_lookup_min=1, prompt_lookup_max=2),
         "num_speculative_tokens=2 is not in methods.ngram"),
        (SpecConfig(method=Method.DRAFT_MODEL, model="other", num_speculative_tokens=2, draft_tensor_parallel_size=1),
         "model='other' is not in"),
        (SpecConfig(method=Method.DRAFT_MODEL, model="org/draft", num_speculative_tokens=2), "draft_tensor_parallel_size=None"),
        (SpecConfig(method=Method.MTP, num_speculative_tokens=1, model="m"), "model is set but methods.mtp has no model"),
    ],
)
def test_params_of_refuses_a_spec_outside_the_space(spec: SpecConfig, needle: str) -> None:
    space = space_of(ROUND_TRIP).resolve("org/target", draft="org/draft")
    with pytest.raises(ConfigError, match=None) as info:
        space.params_of(spec)
    assert needle in str(info.value)


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_a_real_study_over_the_ngram_space_only_draws_valid_candidates(sampler: str) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = load_space("ngram").resolve("org/target")
    seen: list[SpecConfig] = []

    def objective(trial: optuna.Trial) -> float:
        spec = space.suggest(trial)
        seen.append(spec)
        if spec.method is Method.NGRAM:
            assert 1 <= spec.prompt_lookup_min <= spec.prompt_lookup_max <= 6
            assert spec.prompt_lookup_min <= 4
            assert 1 <= spec.num_speculative_tokens <= 8
        return float(spec.num_speculative_tokens or 0)

    if sampler == "random":
        chosen: optuna.samplers.BaseSampler = optuna.samplers.RandomSampler(seed=0)
    else:  # as spectune.study configures it: conditional parameters in groups
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            chosen = optuna.samplers.TPESampler(seed=0, n_startup_trials=4, multivariate=True, group=True)
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage(), sampler=chosen)
    baseline = SpecConfig()
    study.enqueue_trial(space.params_of(baseline))
    study.optimize(objective, n_trials=30)
    assert seen[0] == baseline
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    assert {s.method for s in seen} == {Method.NONE, Method.NGRAM}
    assert len({(s.prompt_lookup_min, s.prompt_lookup_max) for s in seen if s.method is Method.NGRAM}) > 3
    assert all(k == "method" or k.startswith("ngram.") for t in study.trials for k in t.params)


def test_proposers_lists_each_method_and_model_once() -> None:
    space = space_of(ROUND_TRIP).resolve("org/target", draft=["d1", "d2"])
    assert space.proposers() == [(Method.DRAFT_MODEL, "org/target"), (Method.DRAFT_MODEL, "d1"),
                                 (Method.DRAFT_MODEL, "d2")]
    pairs = {(s.method, s.model) for s in space.enumerate() if s.model}
    assert pairs == set(space.proposers())


def test_enumerate_refuses_a_huge_space() -> None:
    space = space_of({"methods": {"suffix": {"suffix_decoding_max_cached_requests": {"low": 0, "high": 200000}}}})
    with pytest.raises(ConfigError, match="more than 10000 candidates"):
        space.enumerate()
    small = space_of({"methods": {"suffix": {"suffix_decoding_max_cached_requests": {"low": 0, "high": 300}}}})
    with pytest.raises(ConfigError, match="more than 100 candidates"):
        small.enumerate(limit=100)
    assert len(small.enumerate(limit=None)) == 301


def test_engine_section_becomes_engine_args(tmp_path: Path) -> None:
    path = write_space(tmp_path, """\
        methods:
          none: {}
        engine:
          max_num_seqs: 32
          extra_args: {enable-prefix-caching: true}
    """)
    args = load_space(path).engine_args("org/target")
    assert isinstance(args, EngineArgs)
    assert args.model == "org/target"
    assert args.max_num_seqs == 32
    assert args.to_vllm_options() == {"max-num-seqs": 32, "enable-prefix-caching": True}


# ---------------------------------------------------------------------------------------------
# Pairing


CORPUS_A = [
    "def add(a, b):\n    return a + b\n", "the quick brown fox jumps over the lazy dog",
    "speculative decoding proposes tokens that the target verifies", "for i in range(10): print(i)",
] * 4
CORPUS_B = ["zebra yak xylophone wombat vulture", "quartz pyramid onyx nebula meteor", "lorem ipsum dolor sit amet"] * 4


def tiny_checkpoint(root: Path, name: str, corpus: list[str], vocab_size: int) -> Path:
    """A folder with a tiny trained BPE tokenizer and a config.json stating vocab_size."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    folder = root / name
    fast.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps({"vocab_size": vocab_size}))
    return folder


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pairing")
    out = {
        "target": tiny_checkpoint(root, "target", CORPUS_A, 1024),
        "same": tiny_checkpoint(root, "same", CORPUS_A, 1024),
        "bigger": tiny_checkpoint(root, "bigger", CORPUS_A, 2048),
        "other": tiny_checkpoint(root, "other", CORPUS_B, 1024),
    }
    # Same vocabulary, different bytes: forces the tokenizer comparison past the byte check.
    reformatted = root / "reformatted"
    reformatted.mkdir()
    for f in out["target"].iterdir():
        (reformatted / f.name).write_bytes(f.read_bytes())
    data = json.loads((reformatted / "tokenizer.json").read_text())
    (reformatted / "tokenizer.json").write_text(json.dumps(data, indent=1))
    out["reformatted"] = reformatted
    _check.cache_clear()
    return out


def test_a_draft_with_the_same_vocabulary_passes(checkpoints: dict[str, Path]) -> None:
    target = str(checkpoints["target"])
    for name in ("same", "reformatted", "target"):
        check_pairing(target, str(checkpoints[name]), Method.DRAFT_MODEL)
    check_pairing(target, str(checkpoints["same"]), "eagle3")


def test_a_draft_with_another_vocab_size_is_refused(checkpoints: dict[str, Path]) -> None:
    draft = str(checkpoints["bigger"])
    with pytest.raises(ConfigError) as info:
        check_pairing(str(checkpoints["target"]), draft, Method.DRAFT_MODEL)
    assert str(info.value) == f"draft {draft} does not share the target's vocabulary: target vocab_size 1024, draft 2048"


def test_a_draft_with_other_tokens_is_refused_with_an_example(checkpoints: dict[str, Path]) -> None:
    with pytest.raises(ConfigError) as info:
        check_pairing(str(checkpoints["target"]), str(checkpoints["other"]), Method.EAGLE)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"head {checkpoints['other']} does not share the target's vocabulary: target ")
    assert "token " in message and ("in the target" in message or "missing from the head" in message)


def test_model_free_methods_and_missing_proposers_are_not_checked(checkpoints: dict[str, Path]) -> None:
    check_pairing(str(checkpoints["target"]), str(checkpoints["other"]), Method.NGRAM)
    check_pairing(str(checkpoints["target"]), None, Method.MTP)


def test_hub_names_pass_with_a_warning(checkpoints: dict[str, Path], caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="spectune.pairing"):
        check_pairing("org/target-model", str(checkpoints["other"]), Method.DRAFT_MODEL)
        check_pairing(str(checkpoints["target"]), "org/draft-model", "draft_model")
    assert caplog.text.count("cannot check offline") == 2
    assert "org/target-model is a hub name" in caplog.text


def test_missing_local_paths_are_errors(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^draft /no/such/draft: no such folder$"):
        check_pairing(str(checkpoints["target"]), "/no/such/draft", Method.DRAFT_MODEL)
    with pytest.raises(ConfigError, match=r"^target \./relative/target: no such folder$"):
        check_pairing("./relative/target", str(checkpoints["same"]), Method.DRAFT_MODEL)
    a_file = tmp_path / "weights.bin"
    a_file.write_bytes(b"")
    with pytest.raises(ConfigError, match="not a folder"):
        check_pairing(str(checkpoints["target"]), str(a_file), Method.DRAFT_MODEL)
