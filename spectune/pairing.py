"""Does a draft or head fit its target? Checked on local files before any engine starts.

A draft model proposes token ids; the target verifies them as ids of its own vocabulary. A
draft trained with another tokenizer proposes nonsense (acceptance near zero), and with another
``vocab_size`` vLLM refuses to start. Both are cheaper to catch here, in one line, than in an
engine's start-up log:

- ``vocab_size`` from each ``config.json`` (top level, or ``text_config`` /
  ``transformer_layer_config`` as in multimodal models and speculators-format heads);
- when both folders carry tokenizer files: the tokenizers' vocabularies (token -> id, added
  tokens included), equal byte-for-byte ``tokenizer.json`` files being accepted without
  loading anything.

An EAGLE head reads the target's hidden states, so it is checked against the target's shape
too (:func:`check_pairing` lists what; each mismatch is one line that vLLM would otherwise
report as a tensor shape error after loading both models, or not at all).

A hub name is checked on its config and tokenizer files, fetched from the hub (or read from
its cache where ``HF_HUB_OFFLINE`` is set), never its weights; a gated model this machine may
not read, or a name the hub does not know, is one line before any engine. Where the hub cannot
be reached and the cache lacks them: a warning, and vLLM checks at start-up. Results are cached
per (target, proposer, method) for the life of the process.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from spectune._hf import hub_files
from spectune.config import Method
from spectune.errors import ConfigError

__all__ = ["check_model_access", "check_pairing", "vllm_default_aux_layers"]

logger = logging.getLogger(__name__)

# Methods whose proposer is a checkpoint over the target's vocabulary, and what to call it.
_ROLE = {
    Method.DRAFT_MODEL: "draft",
    Method.EAGLE: "head",
    Method.EAGLE3: "head",
    Method.MLP_SPECULATOR: "head",
}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model")
_HEADS = (Method.EAGLE, Method.EAGLE3)
_MAX_HEADER = 100 * 2**20  # a safetensors header larger than this is no header


def check_pairing(target: str, proposer: str | None, method: Method | str) -> None:
    """Refuse a draft or head that does not fit the target.

    Only ``draft_model``, ``eagle``, ``eagle3`` and ``mlp_speculator`` are checked; other methods
    (and a missing ``proposer``) pass. Local folders are compared; a name that is no existing
    folder and looks like a hub id (``org/name``) is logged as uncheckable and passes. Safe to
    call from several threads.

    Every proposer: the same vocabulary (see the module docstring). An ``eagle`` or ``eagle3``
    head, read as vLLM reads it (a speculators-format ``config.json``, whose model is its
    ``transformer_layer_config``, or a plain one):

    - hidden size: the size of the target's hidden states the head takes (an EAGLE-3 head's
      ``target_hidden_size``, else its model's ``hidden_size``) is the target's ``hidden_size``;
    - ``eagle3``, auxiliary layers: the ids of the target layers whose hidden states the head
      reads (``eagle_aux_hidden_state_layer_ids`` at the top of its config, else under
      ``eagle_config``) are distinct integers in 0..num_hidden_layers (id i is the residual
      stream entering the target's layer i; vLLM merges repeated ids, and the head then gets
      fewer states than it was trained on). A head that names none gets vLLM's default,
      (2, n // 2, n - 3) for an n-layer target, which must be three distinct ids as well: on a
      4-layer target it is (2, 2, 1), and the engine would start, then fail on a tensor's shape;
    - ``eagle3``, vocabulary maps: a ``draft_vocab_size`` above the target's ``vocab_size`` is
      refused; below it, the head's ``model.safetensors`` (or its shards) must hold ``d2t``, the
      draft -> target id map vLLM loads, with ``draft_vocab_size`` entries, and ``t2d``, where
      present, must have one entry per target token;
    - verifier: a speculators head names the model it was trained with
      (``speculators_config.verifier.name_or_path``). Names are compared by their model name
      (the last path component, or ``name`` of a hub cache folder ``models--org--name``), so a
      hub name and a local copy of the same model match. Where they differ and the verifier is
      a local folder too, the two models' ``config.json`` are compared: different architectures
      or shapes mean a head trained for another model, refused; otherwise (same shape: perhaps a
      base model and its fine-tune, or a renamed folder) a warning, as for a verifier that is
      no folder here.

    Raises:
        ConfigError: a local path that does not exist or is not a folder, an unreadable
            ``config.json`` or safetensors header, different vocabularies (one line, with the
            sizes or one token that differs), or a head that does not fit (one line naming the
            key and both values).
    """
    method = Method(method)
    if method not in _ROLE or not proposer:
        return
    _check(target, proposer, method)


@functools.lru_cache(maxsize=256)
def check_model_access(name: str, role: str = "target") -> Path | None:
    """The folder of ``name``'s config and tokenizer: the folder itself, or for a hub name its
    files from the hub or its cache (:func:`spectune._hf.hub_files`); None where neither can be
    reached. Raises ConfigError, in one line, for a missing folder, a gated model this machine
    may not read, or no such model on the hub: before any engine starts."""
    local = _local_dir(name, role)
    return local if local is not None else hub_files(name, role)


@functools.lru_cache(maxsize=256)
def _check(target: str, proposer: str, method: Method) -> None:
    role = _ROLE[method]
    on_hub = _local_dir(target, "target") is None or _local_dir(proposer, role) is None
    target_dir, proposer_dir = check_model_access(target, "target"), check_model_access(proposer, role)
    if target_dir is None or proposer_dir is None:
        hub = target if target_dir is None else proposer
        logger.warning(
            "cannot check that %s %s shares the vocabulary of target %s: the Hugging Face hub cannot be reached "
            "and its cache lacks %s; vLLM checks when the engine starts",
            role, proposer, target, hub,
        )
        return
    if target_dir != proposer_dir:
        _check_vocabulary(target_dir, proposer_dir, proposer, role)
    if method in _HEADS and not on_hub:  # a hub head's weights (its vocabulary maps) are not fetched
        _check_head(target, target_dir, proposer, proposer_dir, method)


def _check_vocabulary(target_dir: Path, proposer_dir: Path, proposer: str, role: str) -> None:
    prefix = f"{role} {proposer} does not share the target's vocabulary"
    target_size, proposer_size = _vocab_size(target_dir), _vocab_size(proposer_dir)
    if target_size is not None and proposer_size is not None and target_size != proposer_size:
        raise ConfigError(f"{prefix}: target vocab_size {target_size}, {role} {proposer_size}")
    if not (_has_tokenizer(target_dir) and _has_tokenizer(proposer_dir)):
        logger.debug("pairing: %s or %s has no tokenizer files; compared vocab_size only", target_dir, proposer_dir)
        return
    if _same_bytes(target_dir / "tokenizer.json", proposer_dir / "tokenizer.json"):
        return
    target_vocab, proposer_vocab = _vocab(str(target_dir)), _vocab(str(proposer_dir))
    if target_vocab is None or proposer_vocab is None or target_vocab == proposer_vocab:
        return
    raise ConfigError(f"{prefix}: {_difference(target_vocab, proposer_vocab, role)}")


def _looks_like_path(name: str) -> bool:
    """A hub id is ``name`` or ``org/name``; anything else with a path shape is a path."""
    return name.startswith(("/", ".", "~")) or "\\" in name or name.count("/") > 1 or name.endswith("/")


def _local_dir(name: str, role: str) -> Path | None:
    """The folder ``name`` names, or None for a hub name."""
    path = Path(name).expanduser()
    if path.is_dir():
        return path.resolve()
    if path.exists():
        raise ConfigError(f"{role} {name}: not a folder (a checkpoint is a folder with config.json)")
    if _looks_like_path(name):
        raise ConfigError(f"{role} {name}: no such folder")
    return None


def _config(folder: Path) -> dict[str, Any] | None:
    """The folder's ``config.json`` (None where it has none, or holds no JSON object)."""
    path = folder / "config.json"
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read: {e}") from e
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: invalid JSON: {e.msg} at line {e.lineno}") from e
    except RecursionError as e:
        raise ConfigError(f"{path}: invalid JSON: nested too deeply") from e
    return config if isinstance(config, dict) else None


def _vocab_size(folder: Path) -> int | None:
    config = _config(folder)
    if config is None:
        return None
    for section in (config, config.get("text_config"), config.get("transformer_layer_config")):
        if isinstance(section, dict) and _is_int(section.get("vocab_size")):
            return section["vocab_size"]
    return None


def _has_tokenizer(folder: Path) -> bool:
    return any((folder / name).is_file() for name in _TOKENIZER_FILES)


def _same_bytes(a: Path, b: Path) -> bool:
    if not (a.is_file() and b.is_file()):
        return False
    if a.stat().st_size != b.stat().st_size:
        return False
    return _digest(a) == _digest(b)


def _digest(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@functools.lru_cache(maxsize=8)
def _vocab(folder: str) -> dict[str, int] | None:
    """Token -> id of the folder's tokenizer (added tokens included); None if it cannot load.

    A ``tokenizer.json`` is read with the ``tokenizers`` library (milliseconds); other formats
    (SentencePiece ``tokenizer.model``, ``vocab.json``) through ``transformers.AutoTokenizer``,
    whose import alone takes seconds.
    """
    try:
        if (Path(folder) / "tokenizer.json").is_file():
            from tokenizers import Tokenizer

            return Tokenizer.from_file(str(Path(folder) / "tokenizer.json")).get_vocab(with_added_tokens=True)
        from transformers import AutoTokenizer

        tokenizer: Any = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)  # a folder's code never runs here
        return dict(tokenizer.get_vocab())
    except Exception as e:  # noqa: BLE001 - any failure means "cannot compare", not "differs"
        logger.warning("pairing: cannot load the tokenizer in %s (%s); compared vocab_size only", folder, e)
        return None


def _difference(target: dict[str, int], proposer: dict[str, int], role: str) -> str:
    """One example of how two vocabularies differ."""
    sizes = f"target {len(target)} tokens, {role} {len(proposer)}"
    for token, tid in sorted(target.items(), key=lambda item: item[1]):
        pid = proposer.get(token)
        if pid is None:
            return f"{sizes}; token {token!r} (target id {tid}) is missing from the {role}"
        if pid != tid:
            return f"{sizes}; token {token!r} is id {tid} in the target, {pid} in the {role}"
    extra = sorted(set(proposer) - set(target), key=proposer.__getitem__)
    return f"{sizes}; the {role} has {len(extra)} tokens the target lacks, e.g. {extra[0]!r} (id {proposer[extra[0]]})"


# -- heads -------------------------------------------------------------------------------------

def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(config: dict[str, Any], key: str, where: str) -> int | None:
    """``config[key]`` as an int; None when absent or null; an error when it is something else."""
    value = config.get(key)
    if value is None:
        return None
    if not _is_int(value) or value < 0:
        raise ConfigError(f"{where}: {key} is {_show(value)}, not a whole number")
    return int(value)


def _show(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, str | int | float | bool | list | dict) or value is None else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a model's config (a multimodal model's ``text_config``)."""
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def _head_model(config: dict[str, Any]) -> dict[str, Any]:
    """A head's own model config: a speculators head's ``transformer_layer_config``, vLLM's
    EAGLE config's ``model``, else the config itself."""
    for key in ("transformer_layer_config", "model"):
        if isinstance(config.get(key), dict):
            return config[key]
    return config


def _check_head(target: str, target_dir: Path, head: str, head_dir: Path, method: Method) -> None:
    target_config, head_config = _config(target_dir), _config(head_dir)
    if target_config is None or head_config is None:
        logger.debug("pairing: %s or %s has no config.json; the head is not checked against the target", target_dir, head_dir)
        return
    text, model = _text_config(target_config), _head_model(head_config)
    prefix = f"head {head} does not fit target {target}"
    where = f"head {head}: config.json"
    target_hidden = _int(text, "hidden_size", f"target {target}: config.json")
    if method is Method.EAGLE3 and (size := _int(head_config, "target_hidden_size", where)) is not None:
        takes, key = size, "target_hidden_size"
    else:
        takes, key = _int(model, "hidden_size", where), "hidden_size"
    if takes is not None and target_hidden is not None and takes != target_hidden:
        raise ConfigError(f"{prefix}: it takes hidden states of size {takes} ({key}), the target's hidden_size is {target_hidden}")
    if method is Method.EAGLE3:
        layers = _int(text, "num_hidden_layers", f"target {target}: config.json")
        if layers is not None:
            _check_aux_layers(head_config, layers, prefix, where)
        _check_vocab_maps(head_config, _vocab_size(target_dir), head_dir, prefix, where)
    _check_verifier(head_config, target, target_dir, text, head)


def vllm_default_aux_layers(layers: int) -> tuple[int, int, int]:
    """The layers vLLM's Llama models hand an EAGLE-3 head that names none: ``(2, n // 2, n - 3)``."""
    return 2, layers // 2, layers - 3


def _check_aux_layers(config: dict[str, Any], layers: int, prefix: str, where: str) -> None:
    """The target layers an EAGLE-3 head reads (see :func:`check_pairing`)."""
    eagle = config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}
    if eagle.get("use_aux_hidden_state") is False:
        return
    key = "eagle_aux_hidden_state_layer_ids"
    ids = config.get(key) or eagle.get(key)  # vLLM's order: the top level, then eagle_config
    if not ids:
        default = vllm_default_aux_layers(layers)
        if len(set(default)) < 3 or min(default) < 0:
            raise ConfigError(
                f"{prefix}: the head names no {key}, and vLLM's default for a {layers}-layer target, "
                f"{default}, is not three distinct layers; the engine would fail on the hidden states' shape "
                f"(give the head's config.json the layers it was trained on)")
        return
    if not isinstance(ids, list) or not all(_is_int(i) for i in ids):
        raise ConfigError(f"{where}: {key} is {_show(ids)}, not a list of layer ids")
    if repeated := sorted({i for i in ids if ids.count(i) > 1}):
        raise ConfigError(f"{prefix}: {key} {ids} repeats layer {repeated[0]} (vLLM reads each layer once, "
                          "and the head would get fewer hidden states than it was trained on)")
    if outside := [i for i in ids if not 0 <= i <= layers]:
        raise ConfigError(f"{prefix}: {key} {ids} names layer {outside[0]}, the target has layers 0..{layers} "
                          f"(num_hidden_layers {layers})")


def _check_vocab_maps(config: dict[str, Any], target_vocab: int | None, head_dir: Path, prefix: str, where: str) -> None:
    """An EAGLE-3 head's draft vocabulary and its maps to the target's (see :func:`check_pairing`)."""
    draft_vocab = _int(config, "draft_vocab_size", where)
    if draft_vocab is None or target_vocab is None or draft_vocab == target_vocab:
        return
    if draft_vocab > target_vocab:
        raise ConfigError(f"{prefix}: draft_vocab_size {draft_vocab} exceeds the target's vocab_size {target_vocab}")
    shapes = _tensor_shapes(head_dir, ("d2t", "t2d"))
    if shapes is None:
        logger.debug("pairing: %s has no safetensors weights; its vocabulary maps are not checked", head_dir)
        return
    smaller = f"its draft vocabulary ({draft_vocab} tokens) is smaller than the target's ({target_vocab})"
    if "d2t" not in shapes:
        raise ConfigError(f"{prefix}: {smaller}, and its weights hold no d2t (the draft -> target id map vLLM needs)")
    for name, want in (("d2t", draft_vocab), ("t2d", target_vocab)):
        shape = shapes.get(name)
        if shape is not None and shape != [want]:
            raise ConfigError(f"{prefix}: {smaller}, and its {name} has shape {shape}, not [{want}]")


def _tensor_shapes(folder: Path, names: tuple[str, ...]) -> dict[str, list[Any]] | None:
    """The shapes of tensors ``names`` in the folder's safetensors weights (read from their
    headers only; a sharded checkpoint through its index); None where it has no such weights."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError, RecursionError) as e:
            raise ConfigError(f"{index}: cannot read its weight_map: {e}") from e
        if not isinstance(weight_map, dict):
            raise ConfigError(f"{index}: no weight_map")
        files = sorted({str(f) for n, f in weight_map.items() if n in names})
    elif (folder / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        return None
    shapes: dict[str, list[Any]] = {}
    for file in files:
        header = _safetensors_header(folder / file)
        shapes.update({n: info.get("shape") for n, info in header.items() if n in names and isinstance(info, dict)})
    return shapes


def _safetensors_header(path: Path) -> dict[str, Any]:
    """A safetensors file's header: 8 bytes of little-endian length, then that much JSON."""
    try:
        with path.open("rb") as f:
            raw = f.read(8)
            size = int.from_bytes(raw, "little")
            if len(raw) < 8 or size > _MAX_HEADER:
                raise ConfigError(f"{path}: not a safetensors file (no header of a sensible size)")
            header = json.loads(f.read(size))
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e}") from e
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ConfigError(f"{path}: not a safetensors file (its header is no JSON)") from e
    if not isinstance(header, dict):
        raise ConfigError(f"{path}: not a safetensors file (its header is no JSON object)")
    return header


_IDENTITY = ("model_type", "architectures", "hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size",
             "num_attention_heads", "num_key_value_heads")
"""The ``config.json`` keys that tell two models apart (for :func:`_check_verifier`)."""


def _model_name(name: str) -> str:
    """A model's name without where it lies: the last path component, or ``name`` of a hub
    cache folder ``models--org--name`` (whose last components are ``snapshots/<commit>``)."""
    parts = [p for p in name.replace("\\", "/").split("/") if p]
    for part in reversed(parts):
        if part.startswith("models--"):
            return part.split("--")[-1].lower()
    return parts[-1].lower() if parts else ""


def _check_verifier(config: dict[str, Any], target: str, target_dir: Path, text: dict[str, Any], head: str) -> None:
    """The model a speculators head was trained with against the target (see :func:`check_pairing`)."""
    spec = config.get("speculators_config")
    verifier = spec.get("verifier") if isinstance(spec, dict) else None
    name = verifier.get("name_or_path") if isinstance(verifier, dict) else None
    if not isinstance(name, str) or not name.strip() or _model_name(name) == _model_name(target):
        return
    try:
        folder = Path(name).expanduser()
        local = folder.is_dir()
    except (OSError, ValueError, RuntimeError):  # a NUL in the name, an unknown ~user
        folder, local = Path(), False
    if local:
        if folder.resolve() == target_dir:
            return
        other = _config(folder)
        if other is not None:
            theirs = _text_config(other)
            for key in _IDENTITY:
                if key in theirs and key in text and theirs[key] != text[key]:
                    raise ConfigError(
                        f"head {head} was trained for {name}, another model than target {target}: "
                        f"{key} {_show(theirs[key])} there, {_show(text[key])} in the target")
    logger.warning("head %s was trained for %s, not (by its name) for target %s: if that is another model, "
                   "the target will reject most of its proposals", head, name, target)
