"""Search spaces from YAML: the shipped ones, errors of one line naming file and key, names, missing modules,
placeholders."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from conftest import REPO
from optuna.trial import FixedTrial
from space_files import SHIPPED, one_line_error, space_of, write_space

from spectune.config import Method, SpecConfig
from spectune.errors import ConfigError
from spectune.space import SearchSpace, list_spaces, load_space, spaces_dirs


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


@pytest.mark.parametrize("name", ["default", "ngram", "serving"])
def test_gpu_engines_search_ngram_on_the_gpu_too_and_cpu_engines_leave_it_out(name: str,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    space = load_space(name)
    on_gpu = space.for_platform("gpu").resolve("t", draft="d")
    assert {Method.NGRAM, Method("ngram_gpu")} <= set(on_gpu.methods)
    gpu_lookups = [s for s in on_gpu.enumerate() if s.method == Method("ngram_gpu")]
    assert gpu_lookups and all(s.num_speculative_tokens and s.prompt_lookup_max for s in gpu_lookups)
    with caplog.at_level(logging.INFO, logger="spectune.space"):
        on_cpu = space.for_platform("cpu")
    assert Method("ngram_gpu") not in on_cpu.methods and Method.NGRAM in on_cpu.methods
    assert "method ngram_gpu left out: it runs on gpu engines, and this one is cpu" in caplog.text
    assert space.for_platform("gpu") is space  # nothing to leave out: the same space


def test_a_draft_only_space_without_a_draft_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"draft\.yaml: no method but the baseline left: draft_model"):
        load_space("draft").resolve("org/target")


def test_dump_and_reload_give_the_same_candidates() -> None:
    space = load_space("default").resolve("t", draft="d")
    again = SearchSpace.model_validate(space.model_dump())
    assert again.enumerate() == space.enumerate()
    assert again.model_dump() == space.model_dump()


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
        ("methods:\n  telepathy: {}\n", "methods: unknown method 'telepathy': "),
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
