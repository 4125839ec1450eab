"""A draft paired with its target: the same vocabulary, checked before any engine starts."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

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
