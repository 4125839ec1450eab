"""EAGLE-3 heads trained here, on the CPU or a GPU, in speculators' checkpoint format.

The recipe, for any Llama- or Qwen-shaped target transformers loads:

1. **Data.** The target's own greedy answers to the prompts (transformers, float32), then one
   teacher-forced pass over each prompt and answer keeping the residual stream entering three
   of its layers (:func:`~spectune.predict._eagle3.aux_layer_ids`: vLLM's default where it is
   well defined) and its argmax at every position. Only the last ``window`` positions of each
   sequence are kept.
2. **Head.** One Llama decoder layer over ``[embedding, fc(aux states)]``
   (:class:`~spectune.predict._eagle3.Eagle3Head`, vLLM's forward), its embeddings the target's
   (frozen), its ``lm_head`` the target's rows of the draft vocabulary: every token, or the
   ``draft_vocab_size`` most frequent among the target's argmax tokens, with speculators' maps
   ``d2t`` and ``t2d``.
3. **Training.** Cross-entropy to the target's argmax at each depth of the chain (EAGLE-3's
   training-time test, ``ttt_steps`` deep, later depths weighted down), AdamW with a one-cycle
   schedule. speculators' own trainer needs CUDA (a Triton loss, flex attention's backward), so
   this loop is spectune's; the forward is vLLM's, so what trains here is what the engine runs.
4. **Format.** The weights go through speculators' ``Eagle3DraftModel.save_pretrained``:
   ``config.json`` with ``speculators_model_type: eagle3``, the verifier's name and the
   auxiliary layer ids, and ``model.safetensors``, which vLLM serves with ``method: eagle3``.

A build is resumable: its data (the target's answers and states) and, every ``SAVE_EVERY``
steps, its training are kept in ``.<name>.resume/`` beside the destination until the head is in
place; a build with other training settings reuses the data.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from spectune._hf import dtype_kwarg, quiet_transformers
from spectune._util import ProgressHook, silent
from spectune.checkpoints._cache import (
    checkpoint_identity,
    import_checkpoint_deps,
    lock,
    read_json,
    remove_stale,
    swap_in,
    versions,
    write_json,
)
from spectune.checkpoints._head_train import HeadTraining, _head_data, _new_head, _save, _train
from spectune.errors import ConfigError, SpectuneError

__all__ = ["HEAD_MARKER", "HEAD_RECIPE", "HeadTraining", "build_eagle3_head", "corpus_prompts", "head_name",
           "train_head"]

logger = logging.getLogger(__name__)

HEAD_MARKER = "spectune-head.json"
"""Marker file written last into a finished head folder."""

# Changing any value changes the marker, so an existing head is rebuilt on the next call.
HEAD_RECIPE: dict[str, Any] = {
    "format": 1,
    "data": "target's greedy answers (transformers, float32), aux states and argmax by teacher forcing",
    "architecture": "speculators Eagle3DraftModel, one Llama decoder layer, embeddings frozen",
    "loss": "cross-entropy to the target's argmax per chain depth, weight decay^(depth-1)",
    "optimizer": "AdamW, one-cycle schedule, gradient norm clipped at 1",
}

def head_name(target: Path | str, workload: str | None = None) -> str:
    """``<target name>-eagle3``, or ``<target name>-eagle3-<workload>`` for a workload's head."""
    base = f"{Path(str(target).rstrip('/')).name}-eagle3"
    return f"{base}-{workload}" if workload else base


def _digest(texts: Sequence[Any]) -> str:
    return hashlib.sha256(json.dumps(list(texts)).encode()).hexdigest()[:16]


def build_eagle3_head(
    target: Path,
    prompts: Sequence[str],
    dest: Path,
    *,
    training: HeadTraining = HeadTraining(),
    verifier_name: str | None = None,
    threads: int | None = None,
    force: bool = False,
    progress: ProgressHook | None = None,
) -> Path:
    """Train (once) an EAGLE-3 head for the transformers model in ``target`` on its own greedy
    answers to ``prompts`` (texts, sent as vLLM's completions API sends them); write it to
    ``dest`` in speculators' format and return ``dest``.

    ``verifier_name`` is the target's name the head records (default: ``target``'s path).
    ``threads`` torch threads (default: every core). Runs on a GPU when torch sees one.
    Idempotent (marker :data:`HEAD_MARKER` with the request), atomic (a temporary folder renamed
    into place under a lock), resumable (see the module docstring). ``progress`` hears each
    phase and counts prompts and training steps.

    Raises:
        ConfigError: no model in ``target``, no prompts, speculators or torch missing.
        SpectuneError: training or saving failed, or ``dest`` cannot be written.
    """
    target = Path(target).expanduser()
    if not (target / "config.json").is_file():
        raise ConfigError(f"{target}: no target model there (no config.json)")
    if not prompts:
        raise ConfigError("no prompts to train the head on")
    if training.steps < 1:
        raise ConfigError(f"steps must be at least 1, got {training.steps}")
    dest = Path(dest).expanduser()
    request = {"builder": "spectune.checkpoints.build_eagle3_head", "target": checkpoint_identity(target),
               "verifier": verifier_name or str(target.resolve()), "prompts": _digest(prompts),
               "num_prompts": len(prompts), "training": training.__dict__, "recipe": HEAD_RECIPE}
    request = json.loads(json.dumps(request))
    if not force and _is_built(dest, request):
        return dest
    hook = progress or silent
    if "transformers" not in sys.modules:  # a phase only where it costs time
        hook("importing torch and transformers", 0, 0)
    import_checkpoint_deps()
    _import_speculators()
    parent, name = dest.parent, dest.name
    prefix = f".{name}.build-"
    try:
        with lock(parent, f".{name}.lock"):
            if not force and _is_built(dest, request):
                return dest
            remove_stale(parent, prefix)
            resume = parent / f".{name}.resume"
            keep = _resume_files(request, training)
            resume.mkdir(parents=True, exist_ok=True)
            for stale in resume.iterdir():  # another request's state: its data may still serve
                if stale.name not in keep:
                    stale.unlink()
            t0 = time.perf_counter()
            work = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
            try:
                out = work / name
                try:
                    marker = _build_into(target, list(prompts), out, [resume / f for f in keep], training,
                                         request["verifier"], threads or os.cpu_count() or 1, hook)
                except (OSError, SpectuneError):
                    raise
                except Exception as e:  # foreign errors from torch/transformers, at the border
                    raise SpectuneError(f"training the head for {target.name} failed: {type(e).__name__}: {e}") from e
                marker.update(request=request, build_seconds=round(time.perf_counter() - t0, 1))
                write_json(out / HEAD_MARKER, marker)  # last: marks a finished head
                swap_in(out, dest, work / "old")
                shutil.rmtree(resume, ignore_errors=True)
            finally:
                shutil.rmtree(work, ignore_errors=True)
    except OSError as e:
        raise SpectuneError(f"cannot build the head {name} in {parent}: {e}") from e
    logger.info("head %s ready (%.0fs)", dest, marker["build_seconds"])
    return dest


def _is_built(dest: Path, request: dict[str, Any]) -> bool:
    marker = read_json(dest / HEAD_MARKER)
    return (dest / "config.json").is_file() and marker is not None and marker.get("request") == request


def _import_speculators() -> None:
    try:
        import speculators.models.eagle3  # noqa: F401
    except ImportError as e:
        raise ConfigError(
            "training a head needs speculators (its checkpoint format): "
            "pip install --no-deps speculators==0.9.0 hs-connectors==0.9.0 (see scripts/setup.sh)"
        ) from e


def _resume_files(request: dict[str, Any], training: HeadTraining) -> tuple[str, str]:
    """The names of a build's resumable data (kept across training settings that do not change
    it) and training state (this request's only)."""
    data = [request["target"], request["prompts"], training.max_new_tokens, training.window, HEAD_RECIPE["format"]]
    return f"data-{_digest(data)}.pt", f"train-{_digest([request])}.pt"


def _build_into(target_dir: Path, prompts: list[str], out: Path, resume: list[Path], training: HeadTraining,
                verifier: str, threads: int, progress: ProgressHook) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from spectune.predict._eagle3 import aux_layer_ids

    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    timings: dict[str, float] = {}
    try:
        t = time.perf_counter()
        progress("loading the target", 0, 0)
        with quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
            target = AutoModelForCausalLM.from_pretrained(str(target_dir), **dtype_kwarg(torch.float32)).to(device)
        target.eval()
        layer_ids = tuple(aux_layer_ids(target.config.num_hidden_layers))
        data_file, state_file = resume
        if data_file.is_file():
            data = torch.load(data_file)
            logger.info("resuming: the target's answers and states are in %s", data_file)
        else:
            data = _head_data(target, tokenizer, prompts, layer_ids, training, progress)
            torch.save(data, data_file)
        timings["data_s"] = time.perf_counter() - t
        t = time.perf_counter()
        head, d2t, t2d = _new_head(target, layer_ids, data, training)
        del target
        head.to(device)
        losses, agreement = _train(head, data, training, state_file, progress)
        timings["train_s"] = time.perf_counter() - t
        progress("saving the head", 0, 0)
        _save(head.cpu(), d2t, t2d, target_dir, verifier, training, out)
    finally:
        torch.set_num_threads(old_threads)
    k = max(1, len(losses) // 10)
    return {
        "format": HEAD_RECIPE["format"], "name": out.name, "method": "eagle3",
        "aux_hidden_state_layer_ids": list(layer_ids), "draft_vocab_size": head.shape.draft_vocab_size,
        "data": {"prompts": len(prompts), "sequences": len(data["features"]),
                 "positions": sum(len(f) for f in data["features"])},
        "train_loss": {"first": round(sum(losses[:k]) / k, 4) if losses else None,
                       "last": round(sum(losses[-k:]) / k, 4) if losses else None},
        "train_agreement_per_depth": agreement,
        "timings_s": {key: round(v, 1) for key, v in timings.items()},
        "device": device, "threads": threads,
        "versions": versions("torch", "transformers", "speculators"),
    }


def corpus_prompts(tokenizer: Any, texts: Sequence[str], *, count: int, length: int, seed: int) -> list[str]:
    """``count`` windows of ``length`` tokens from ``texts``, as text: prompts for a head built
    without a workload (the tiny target's own corpus)."""
    import torch

    ids = [i for t in texts for i in tokenizer(t)["input_ids"]]
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, max(1, len(ids) - length), (count,), generator=gen).tolist()
    return [tokenizer.decode(ids[s: s + length]) for s in starts]



def train_head(target: str, workload: Any, dest: Path | None = None, *, training: HeadTraining = HeadTraining(),
               cache_dir: Path | None = None, force: bool = False, progress: ProgressHook | None = None) -> Path:
    """Train an EAGLE-3 head for ``target`` (a folder, or a hub name, downloaded where the hub
    can be reached) on its own answers to the prompts of ``workload`` (a
    :class:`~spectune.config.WorkloadSpec`); return the head's folder, by default
    ``<cache_dir>/models/<target>-eagle3-<workload>``.

    Raises:
        ConfigError: the target cannot be found, the workload has no prompts, or a package is missing.
        SpectuneError: as :func:`build_eagle3_head`.
    """
    from spectune.checkpoints._cache import default_cache_dir
    from spectune.workloads import load_prompts

    local = Path(target).expanduser()
    folder = local if local.is_dir() else _from_hub(target)
    prompts = [p.as_text() for p in load_prompts(workload)]
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    dest = Path(dest).expanduser() if dest is not None else root / "models" / head_name(folder, workload.name)
    return build_eagle3_head(folder, prompts, dest, training=training, verifier_name=None if local.is_dir() else target,
                             force=force, progress=progress)


def _from_hub(name: str) -> Path:
    """The local snapshot of hub model ``name`` (downloaded where the hub can be reached)."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"]))
    except Exception as e:  # noqa: BLE001 - any hub failure: one line
        raise ConfigError(f"target {name}: no such folder, and the hub did not give it ({type(e).__name__})") from e
