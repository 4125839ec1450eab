"""A draft paired with its target: the same vocabulary, checked before any engine starts."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spectune.config import Method
from spectune.errors import ConfigError
from spectune.pairing import _check, check_pairing

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


def test_hub_names_out_of_reach_pass_with_a_warning(checkpoints: dict[str, Path], caplog: pytest.LogCaptureFixture,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither the hub (offline here) nor its cache has them: left to vLLM, in one warning each
    (tests/test_hub_names.py checks hub names against a stand-in hub)."""
    monkeypatch.setenv("HF_HUB_CACHE", str(checkpoints["target"].parent / "empty-hf-cache"))
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(checkpoints["target"].parent / "empty-hf-cache"))
    with caplog.at_level(logging.WARNING, logger="spectune.pairing"):
        check_pairing("org/target-model", str(checkpoints["other"]), Method.DRAFT_MODEL)
        check_pairing(str(checkpoints["target"]), "org/draft-model", "draft_model")
    assert caplog.text.count("the Hugging Face hub cannot be reached and its cache lacks") == 2
    assert "its cache lacks org/target-model" in caplog.text and "its cache lacks org/draft-model" in caplog.text


def test_missing_local_paths_are_errors(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^draft /no/such/draft: no such folder$"):
        check_pairing(str(checkpoints["target"]), "/no/such/draft", Method.DRAFT_MODEL)
    with pytest.raises(ConfigError, match=r"^target \./relative/target: no such folder$"):
        check_pairing("./relative/target", str(checkpoints["same"]), Method.DRAFT_MODEL)
    a_file = tmp_path / "weights.bin"
    a_file.write_bytes(b"")
    with pytest.raises(ConfigError, match="not a folder"):
        check_pairing(str(checkpoints["target"]), str(a_file), Method.DRAFT_MODEL)


# -- EAGLE heads against the target's shape ------------------------------------------------------

TARGET_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
                 "num_hidden_layers": 8, "vocab_size": 1024, "intermediate_size": 256, "num_attention_heads": 4}


def write_safetensors(path: Path, tensors: dict[str, list[int]]) -> None:
    """A safetensors file of int64 tensors of these shapes (zeros): only its header is read."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in tensors.items():
        size = 8 * math.prod(shape)
        header[name] = {"dtype": "I64", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(offset))


def eagle3_head(root: Path, name: str = "head", *, tensors: dict[str, list[int]] | None = None,
                **top: object) -> Path:
    """A speculators-format EAGLE-3 head (the layout of speculators' save_pretrained) for
    :data:`TARGET_CONFIG`'s target; ``top`` overrides top-level keys (None removes one)."""
    config: dict[str, object] = {
        "architectures": ["Eagle3DraftModel"], "speculators_model_type": "eagle3", "draft_vocab_size": 1024,
        "eagle_aux_hidden_state_layer_ids": [1, 4, 7], "target_hidden_size": None,
        "speculators_config": {"algorithm": "eagle3", "proposal_methods": [{"proposal_type": "greedy",
                               "speculative_tokens": 3}], "verifier": {"architectures": ["LlamaForCausalLM"],
                                                                       "name_or_path": str(root / "target")}},
        "transformer_layer_config": {**TARGET_CONFIG, "num_hidden_layers": 1},
    }
    for key, value in top.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    write_safetensors(folder / "model.safetensors", {"fc.weight": [128, 384], **(tensors or {})})
    return folder


@pytest.fixture
def heads(tmp_path: Path) -> Path:
    """A target folder (config.json only) under ``tmp_path``, where the tests put their heads."""
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(TARGET_CONFIG))
    _check.cache_clear()
    return tmp_path


def refusal(root: Path, head: Path, method: Method | str = Method.EAGLE3) -> str:
    with pytest.raises(ConfigError) as info:
        check_pairing(str(root / "target"), str(head), method)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_a_head_that_fits_its_target_passes(heads: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="spectune.pairing"):
        check_pairing(str(heads / "target"), str(eagle3_head(heads)), Method.EAGLE3)
        small = eagle3_head(heads, "small", draft_vocab_size=256, tensors={"d2t": [256], "t2d": [1024]})
        check_pairing(str(heads / "target"), str(small), Method.EAGLE3)
        check_pairing(str(heads / "target"), str(eagle3_head(heads, "no-t2d", draft_vocab_size=256,
                                                             tensors={"d2t": [256]})), Method.EAGLE3)
        under = eagle3_head(heads, "under", eagle_aux_hidden_state_layer_ids=None,
                            eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 8]})
        check_pairing(str(heads / "target"), str(under), Method.EAGLE3)
    assert caplog.text == ""


def test_a_head_for_other_hidden_states_is_refused(heads: Path) -> None:
    head = eagle3_head(heads, target_hidden_size=256)
    assert refusal(heads, head) == (f"head {head} does not fit target {heads / 'target'}: it takes hidden states of "
                                    "size 256 (target_hidden_size), the target's hidden_size is 128")
    eagle1 = heads / "eagle1"
    eagle1.mkdir()
    (eagle1 / "config.json").write_text(json.dumps({**TARGET_CONFIG, "hidden_size": 64, "num_hidden_layers": 1}))
    assert refusal(heads, eagle1, Method.EAGLE).endswith("it takes hidden states of size 64 (hidden_size), "
                                                         "the target's hidden_size is 128")


@pytest.mark.parametrize(("ids", "needle"), [
    ([1, 4, 4], "eagle_aux_hidden_state_layer_ids [1, 4, 4] repeats layer 4"),
    ([1, 4, 9], "eagle_aux_hidden_state_layer_ids [1, 4, 9] names layer 9, the target has layers 0..8"),
    ([-1, 2, 5], "names layer -1"),
    ("1,4,7", 'eagle_aux_hidden_state_layer_ids is "1,4,7", not a list of layer ids'),
    ([1, 4.0, 7], "not a list of layer ids"),
    ([True, 2, 3], "not a list of layer ids"),
])
def test_auxiliary_layers_are_distinct_layers_of_the_target(heads: Path, ids: object, needle: str) -> None:
    assert needle in refusal(heads, eagle3_head(heads, eagle_aux_hidden_state_layer_ids=ids))


@pytest.mark.parametrize(("layers", "refused"), [(3, False), (4, True), (5, True), (6, True), (7, False), (32, False),
                                                 (2, True)])
def test_without_layer_ids_vllms_default_must_be_three_distinct_layers(heads: Path, layers: int, refused: bool) -> None:
    (heads / "target" / "config.json").write_text(json.dumps({**TARGET_CONFIG, "num_hidden_layers": layers}))
    head = eagle3_head(heads, eagle_aux_hidden_state_layer_ids=None)
    if not refused:
        check_pairing(str(heads / "target"), str(head), Method.EAGLE3)
        return
    message = refusal(heads, head)
    default = (2, layers // 2, layers - 3)
    assert f"the head names no eagle_aux_hidden_state_layer_ids, and vLLM's default for a {layers}-layer target, {default}" in message
    assert "the engine would fail on the hidden states' shape" in message


def test_the_target_as_its_own_eagle3_head_is_refused_on_a_four_layer_target(heads: Path) -> None:
    """vLLM starts such an engine, then dies: shape '[-1, 384]' is invalid for input of size 4096."""
    (heads / "target" / "config.json").write_text(json.dumps({**TARGET_CONFIG, "num_hidden_layers": 4}))
    assert "(2, 2, 1), is not three distinct layers" in refusal(heads, heads / "target")


def test_a_smaller_draft_vocabulary_needs_its_maps(heads: Path) -> None:
    cases = [
        ({}, "its draft vocabulary (256 tokens) is smaller than the target's (1024), and its weights hold no d2t"),
        ({"d2t": [255], "t2d": [1024]}, "and its d2t has shape [255], not [256]"),
        ({"d2t": [256], "t2d": [512]}, "and its t2d has shape [512], not [1024]"),
    ]
    for i, (tensors, needle) in enumerate(cases):
        assert needle in refusal(heads, eagle3_head(heads, f"h{i}", draft_vocab_size=256, tensors=tensors))
    big = eagle3_head(heads, "big", draft_vocab_size=2048)
    assert refusal(heads, big).endswith("draft_vocab_size 2048 exceeds the target's vocab_size 1024")
    assert "draft_vocab_size is \"many\", not a whole number" in refusal(heads, eagle3_head(heads, "x", draft_vocab_size="many"))


def test_the_maps_are_found_in_a_sharded_checkpoint(heads: Path) -> None:
    head = eagle3_head(heads, draft_vocab_size=256)
    (head / "model.safetensors").unlink()
    write_safetensors(head / "model-00002-of-00002.safetensors", {"d2t": [200], "t2d": [1024]})
    (head / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"fc.weight": "model-00001-of-00002.safetensors", "d2t": "model-00002-of-00002.safetensors",
                        "t2d": "model-00002-of-00002.safetensors"}}))
    assert refusal(heads, head).endswith("and its d2t has shape [200], not [256]")
    (head / "model.safetensors.index.json").write_text("{not json")
    assert "model.safetensors.index.json: cannot read its weight_map" in refusal(heads, head)


def test_a_broken_safetensors_header_is_one_line(heads: Path) -> None:
    head = eagle3_head(heads, draft_vocab_size=256)
    (head / "model.safetensors").write_bytes((10**12).to_bytes(8, "little"))
    assert "not a safetensors file" in refusal(heads, head)
    (head / "model.safetensors").write_bytes((5).to_bytes(8, "little") + b"\xff\xfe{[")
    assert "not a safetensors file" in refusal(heads, head)


def test_the_verifier_is_compared_by_model_name(heads: Path, caplog: pytest.LogCaptureFixture) -> None:
    target = str(heads / "target")

    def verifier(name: str) -> Path:
        return eagle3_head(heads, f"h{abs(hash(name))}", speculators_config={"verifier": {"name_or_path": name}})

    with caplog.at_level(logging.WARNING, logger="spectune.pairing"):
        for same in ("org/target", "/elsewhere/target/", "~/.cache/huggingface/hub/models--org--TARGET/snapshots/0a1b2c"):
            check_pairing(target, str(verifier(same)), Method.EAGLE3)
        assert caplog.text == ""
        check_pairing(target, str(verifier("meta-llama/Llama-3.1-8B-Instruct")), Method.EAGLE3)
        check_pairing(target, str(verifier("no\x00such/folder")), Method.EAGLE3)  # no path at all: a name
    assert "was trained for meta-llama/Llama-3.1-8B-Instruct, not (by its name) for target" in caplog.text
    copy = heads / "copy-of-target"  # another folder, the same model: a warning only
    copy.mkdir()
    (copy / "config.json").write_text(json.dumps(TARGET_CONFIG))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="spectune.pairing"):
        check_pairing(target, str(verifier(str(copy))), Method.EAGLE3)
    assert "copy-of-target" in caplog.text
    other = heads / "other-model"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({**TARGET_CONFIG, "num_hidden_layers": 16}))
    head = verifier(str(other))
    assert refusal(heads, head) == (f"head {head} was trained for {other}, another model than target {target}: "
                                    "num_hidden_layers 16 there, 8 in the target")


JSON = st.recursive(st.none() | st.booleans() | st.integers(-5, 3000) | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)
HEAD_KEYS = ["eagle_aux_hidden_state_layer_ids", "target_hidden_size", "draft_vocab_size", "eagle_config",
             "transformer_layer_config", "speculators_config", "model", "text_config", "hidden_size", "vocab_size"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(head=st.dictionaries(st.sampled_from(HEAD_KEYS), JSON, max_size=6) | JSON,
       target=st.dictionaries(st.sampled_from(["hidden_size", "num_hidden_layers", "vocab_size", "text_config"]),
                              JSON, max_size=4),
       method=st.sampled_from([Method.EAGLE, Method.EAGLE3, Method.DRAFT_MODEL]))
def test_hostile_config_files_pass_or_are_refused_in_one_line(tmp_path_factory: pytest.TempPathFactory, head: object,
                                                              target: dict, method: Method) -> None:
    root = tmp_path_factory.mktemp("hostile")
    for name, config in (("target", target), ("head", head)):
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(config))
    write_safetensors(root / "head" / "model.safetensors", {"d2t": [3]})
    try:
        check_pairing(str(root / "target"), str(root / "head"), method)
    except ConfigError as e:
        assert "\n" not in str(e) and len(str(e)) < 1000
