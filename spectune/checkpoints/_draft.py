"""Draft models spectune builds for a target: a distilled draft for SmolLM2-135M-Instruct.

:func:`build_smollm2_draft` makes a small Llama draft that shares the target's vocabulary and
tokenizer (byte-identical tokenizer files), so that vLLM can use it as a draft model
(``{"model": DRAFT, "num_speculative_tokens": k}``). The recipe, offline and on CPU:

1. **Data.** The target's own greedy continuations (transformers, float32, 32 tokens) of the
   shipped prompts (HumanEval and MT-Bench, as spectune sends them by default: the completions
   API with :meth:`~spectune.workloads.Prompt.as_text`), keeping the target's top-k logits at
   each generated position and, from the same prefill, at the prompt's last 64 positions.
   Some prompts are held out for measuring (:data:`HELD_OUT`): among them every prompt that
   ``spectune measure --num-prompts 8`` (seed 0) sends.
2. **Initialisation.** The draft is the target's embeddings, final norm and lm_head (tied and
   frozen) with a few of the target's decoder layers (:func:`init_draft_from_target`).
3. **Distillation.** The layers and the final norm are trained to match the target's top-k
   distribution on windows of that text, most of them ending on the target's continuation
   (cross-entropy to the renormalised top-k softmax, i.e. the KL up to a constant, with the
   softmax over the tokens seen in the top-k; :func:`train_draft`).
4. **Measuring.** On the held-out prompts: the share of positions along the target's greedy
   path where the draft's argmax equals the target's (:func:`draft_agreement`), before and
   after training. Recorded in the marker file with the build time.

The result is written atomically (temporary folder renamed into place, under a lock file) into
``<cache>/models/<target name>-draft`` with a marker file (:data:`DRAFT_MARKER`) written last;
a later call with the same request returns at once. Locking, the atomic swap and markers are
:mod:`spectune.checkpoints._cache`'s.

torch and transformers are imported inside the functions that use them.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from spectune._hf import dtype_kwarg, quiet_transformers
from spectune._util import ProgressHook, silent
from spectune.checkpoints._cache import (
    checkpoint_identity,
    default_cache_dir,
    import_checkpoint_deps,
    lock,
    read_json,
    remove_stale,
    swap_in,
    versions,
    write_json,
)
from spectune.checkpoints._distil import (
    draft_agreement,
    init_draft_from_target,
    train_draft,
)
from spectune.checkpoints._distil_data import (
    DEFAULT_STEPS,
    DRAFT_MARKER,
    DRAFT_RECIPE,
    THREADS,
    TOKENIZER_GLOBS,
    draft_name,
    generate_distill_data,
    split_prompts,
    torch_threads,
)
from spectune.checkpoints._smollm2 import prepare_smollm2
from spectune.errors import ConfigError, SpectuneError

__all__ = ["build_smollm2_draft"]

logger = logging.getLogger(__name__)


def _draft_request(target: Path, seed: int, steps: int, num_prompts: int | None) -> dict[str, Any]:
    # the builder's name as drafts built before it moved record it: a draft already built is kept
    return {"builder": "spectune.drafts.build_smollm2_draft", "target": checkpoint_identity(target),
            "seed": seed, "steps": steps, "num_prompts": num_prompts, "recipe": DRAFT_RECIPE}


def _draft_is_built(dest: Path, request: dict[str, Any]) -> bool:
    if not (dest / "config.json").is_file():
        return False
    marker = read_json(dest / DRAFT_MARKER)
    return marker is not None and marker.get("request") == json.loads(json.dumps(request))


def _copy_tokenizer_files(src: Path, dst: Path) -> list[str]:
    names = sorted({p.name for g in TOKENIZER_GLOBS for p in src.glob(g) if p.is_file()})
    if not {"tokenizer.json", "tokenizer.model", "vocab.json"} & set(names):
        raise ConfigError(f"{src}: no tokenizer files (tokenizer.json) to share with the draft")
    for name in names:
        shutil.copy2(src / name, dst / name)
    return names


def _build_draft_into(
    target_dir: Path, out: Path, *, seed: int, steps: int, num_prompts: int | None,
    request: dict[str, Any], progress: ProgressHook,
) -> dict[str, Any]:
    """Distil a draft of the target in ``target_dir`` into ``out``; its marker's content."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    arch, train_cfg = DRAFT_RECIPE["architecture"], DRAFT_RECIPE["training"]
    timings: dict[str, float] = {}
    t = time.perf_counter()
    progress("loading the target", 0, 0)
    with quiet_transformers():
        tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
        target = LlamaForCausalLM.from_pretrained(str(target_dir), **dtype_kwarg(torch.float32))
    target.eval()
    timings["load_target_s"] = time.perf_counter() - t
    t = time.perf_counter()
    train_ex, held_ex = _distil_examples(target, tokenizer, num_prompts, progress)
    timings["generate_s"] = time.perf_counter() - t
    t = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        draft = init_draft_from_target(target, arch["target_layers"])
        del target
        progress("measuring the untrained draft's agreement", 0, 0)
        before = draft_agreement(draft, held_ex)
        logger.info("distilling %d examples into the draft (%d steps)", len(train_ex), steps)
        losses = train_draft(draft, train_ex, steps=steps, batch_size=train_cfg["batch_size"],
                             window=train_cfg["window"], lr=train_cfg["lr"], seed=seed,
                             end_share=train_cfg["end_share"], progress=progress)
    timings["train_s"] = time.perf_counter() - t
    logger.info("trained %d steps in %.0fs (loss %.2f -> %.2f)", steps, timings["train_s"], losses[0], losses[-1])
    t = time.perf_counter()
    progress("measuring the draft's agreement", 0, 0)
    after = draft_agreement(draft, held_ex)
    timings["measure_s"] = time.perf_counter() - t
    t = time.perf_counter()
    progress("saving the draft", 0, 0)
    copied = _save_draft(draft, out, target_dir)
    timings["save_s"] = time.perf_counter() - t
    return _marker(out, request, copied, train_ex, held_ex, losses, (before, after), timings)


def _distil_examples(target: Any, tokenizer: Any, num_prompts: int | None,
                     progress: ProgressHook) -> tuple[list[Any], list[Any]]:
    """The target's greedy continuations of the training and the held-out prompts."""
    data_cfg = DRAFT_RECIPE["data"]
    train_prompts, held_prompts = split_prompts(data_cfg["sources"])
    if num_prompts is not None:  # a smaller build (tests): every n-th prompt of each split
        train_prompts = train_prompts[:: max(1, len(train_prompts) // num_prompts)][:num_prompts]
        held_prompts = held_prompts[:: max(1, len(held_prompts) // num_prompts)][:num_prompts]
    logger.info("generating the target's greedy continuations of %d prompts", len(train_prompts) + len(held_prompts))
    examples = generate_distill_data(
        target, tokenizer, train_prompts + held_prompts,
        max_new_tokens=data_cfg["max_new_tokens"], top_k=data_cfg["top_k"],
        batch_size=data_cfg["generation_batch_size"], prompt_labels=data_cfg["prompt_labels"], progress=progress,
    )
    held_keys = {(s, p.id) for s, p in held_prompts}
    logger.info("generated %d positions (%d along greedy paths)", sum(e.num_positions for e in examples),
                sum(e.num_generated for e in examples))
    return ([e for e in examples if (e.source, e.prompt_id) not in held_keys],
            [e for e in examples if (e.source, e.prompt_id) in held_keys])


def _save_draft(draft: Any, out: Path, target_dir: Path) -> list[str]:
    """Save the draft with the target's tokenizer files; the files copied."""
    for p in draft.parameters():
        p.requires_grad_(True)
    with quiet_transformers():
        draft.save_pretrained(out, safe_serialization=True)
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        cfg.pop(key, None)
    write_json(cfg_path, cfg)
    return _copy_tokenizer_files(target_dir, out)


def _marker(out: Path, request: dict[str, Any], copied: list[str], train_ex: list[Any], held_ex: list[Any],
            losses: list[float], agreement: tuple[Any, Any], timings: dict[str, float]) -> dict[str, Any]:
    """What the marker file records of a finished build."""
    k = max(1, len(losses) // 10)
    return {
        "format": DRAFT_RECIPE["format"],
        "name": out.name,
        "request": request,
        "tokenizer_files": copied,
        "num_hidden_layers": len(DRAFT_RECIPE["architecture"]["target_layers"]),
        "data": {
            "train_prompts": len(train_ex),
            "train_positions": sum(e.num_positions for e in train_ex),
            "train_generated_positions": sum(e.num_generated for e in train_ex),
            "held_out_prompts": {s: sorted(e.prompt_id for e in held_ex if e.source == s)
                                 for s in DRAFT_RECIPE["data"]["sources"]},
            "held_out_generated_positions": sum(e.num_generated for e in held_ex),
        },
        "train_loss": {"first": round(sum(losses[:k]) / k, 4),
                       "last": round(sum(losses[-k:]) / k, 4), "averaged_over_steps": k},
        "agreement": {"metric": "held-out share of positions along the target's greedy path "
                                "where the draft's argmax equals the target's (float32)",
                      "before_training": agreement[0], "after_training": agreement[1]},
        "timings_s": {key: round(v, 1) for key, v in timings.items()},
        "versions": versions("torch", "transformers", "tokenizers"),
    }


def build_smollm2_draft(
    target: Path | None = None,
    cache_dir: Path | None = None,
    *,
    force: bool = False,
    steps: int = DEFAULT_STEPS,
    seed: int = 0,
    num_prompts: int | None = None,
    progress: ProgressHook | None = None,
) -> Path:
    """Build (once) a distilled draft for ``target`` (default: SmolLM2-135M-Instruct); return it.

    ``target`` is a Hugging Face Llama folder; by default the one :func:`prepare_smollm2`
    prepares in ``cache_dir``. The draft, ``<cache_dir>/models/<target name>-draft``
    (``cache_dir`` defaults to :func:`default_cache_dir`), is a ``LlamaForCausalLM`` holding the
    target's embeddings, final norm and lm_head and two of its decoder layers, distilled for
    ``steps`` steps on the target's greedy continuations of the shipped HumanEval and MT-Bench
    prompts, with the target's tokenizer files copied byte for byte. Its marker file
    (:data:`DRAFT_MARKER`) records the recipe, seed, steps, build time and the measured
    agreement on held-out prompts. See the module docstring for the recipe. For SmolLM2 about
    7 minutes on 2 shared CPU cores with one torch thread (5 for the target's continuations,
    under 2 for training); ``steps`` costs about 1 s each.

    ``num_prompts`` limits the prompts of each split (training, held out) for quick builds of
    small targets (tests); None takes them all. ``progress`` hears each phase, the prompts
    generated and the training steps counted (:data:`~spectune._util.ProgressHook`).

    Idempotent: when the folder holds a finished build of the same request (target weights'
    size and mtime, recipe, seed, steps, num_prompts), it is returned at once unless ``force``.
    The build happens in a temporary folder renamed into place under a lock file, so concurrent
    callers build once and an interrupted build leaves no half model.

    Raises:
        ConfigError: the target folder does not exist or holds no model or tokenizer, steps < 1,
            or torch/transformers are missing.
        SpectuneError: the build failed or the cache folder cannot be written.
    """
    if steps < 1:
        raise ConfigError(f"steps must be at least 1, got {steps}")
    if num_prompts is not None and num_prompts < 1:
        raise ConfigError(f"num_prompts must be at least 1, got {num_prompts}")
    hook = progress or silent
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    if target is None:
        target = prepare_smollm2(root, progress=hook)
    target = Path(target).expanduser()
    if not (target / "config.json").is_file():
        raise ConfigError(f"{target}: no target model there (no config.json)")
    parent = root / "models"
    name = draft_name(target)
    dest = parent / name
    request = _draft_request(target, seed, steps, num_prompts)
    if not force and _draft_is_built(dest, request):
        logger.debug("draft already built in %s", dest)
        return dest
    hook("importing torch and transformers", 0, 0)
    import_checkpoint_deps()
    prefix = f".{name}.build-"
    try:
        with lock(parent, f".{name}.lock"):
            if not force and _draft_is_built(dest, request):  # built by a concurrent caller
                return dest
            remove_stale(parent, prefix)
            t0 = time.perf_counter()
            work = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
            try:
                out = work / name
                try:
                    with torch_threads(THREADS):
                        marker = _build_draft_into(target, out, seed=seed, steps=steps,
                                                   num_prompts=num_prompts, request=request, progress=hook)
                except (OSError, SpectuneError):
                    raise
                except Exception as e:  # foreign errors from torch/transformers, at the border
                    raise SpectuneError(
                        f"building the draft for {target.name} failed: {type(e).__name__}: {e}"
                    ) from e
                marker["build_seconds"] = round(time.perf_counter() - t0, 1)
                write_json(out / DRAFT_MARKER, marker)  # last: marks a finished draft
                swap_in(out, dest, work / "old")
            finally:
                shutil.rmtree(work, ignore_errors=True)
    except OSError as e:
        raise SpectuneError(f"cannot build the draft {name} in {parent}: {e}") from e
    logger.info("draft %s ready (%.0fs): held-out agreement %.3f", dest, marker["build_seconds"],
                marker["agreement"]["after_training"]["overall"] or 0.0)
    return dest
