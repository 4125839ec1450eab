"""The draft model's replay: at temperature 0 vLLM drafts greedily, so one forward pass of the
draft (transformers, on the CPU, in the engine's dtype) along each recorded prompt and output gives
what it drafts at every step, for every k, before any draft trial."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spectune.config import Method

if TYPE_CHECKING:
    from spectune.measurement import Measurement

from spectune.predict._replay import (
    UNLIMITED_MODEL_LEN,
    ReplayAcceptance,
    ReplayRequest,
    Tally,
    recorded_pairs,
)

__all__ = ["DRAFT_REPLAY_MAX_BYTES", "DRAFT_REPLAY_SPREAD", "HEAD_REPLAY_DEPTH", "DraftGuesses", "DraftReplays",
           "HeadChains", "draft_guesses", "head_chains", "replay_draft", "replay_head", "warm_replays"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DraftGuesses:
    """What a draft model proposes along recorded target outputs: for each request, the prompt's
    length and ``guess[n]``, the draft's argmax after ``prompt + output[:n]`` (``n`` from 0 to
    the output's length), from one teacher-forced forward pass (:func:`draft_guesses`)."""

    requests: tuple[tuple[int, tuple[int, ...], tuple[int, ...]], ...]
    """``(prompt length, output, guesses)`` per request."""


@dataclass(frozen=True)
class HeadChains:
    """What an EAGLE-3 head drafts along recorded target outputs: for each request, the prompt's
    length, the output and ``chain[n]``, the head's greedy chain after ``prompt + output[:n]``
    (``n`` from 0; empty where nothing is drafted), as deep as the recorded output allows
    (:func:`head_chains`)."""

    requests: tuple[tuple[int, tuple[int, ...], tuple[tuple[int, ...], ...]], ...]
    """``(prompt length, output, chains)`` per request."""


_TORCH_DTYPES = {"float32": "float32", "float": "float32", "bfloat16": "bfloat16", "float16": "float16",
                 "half": "float16"}
"""vLLM's ``--dtype`` values as torch's; any other (``auto``) loads the checkpoint's own."""


def draft_guesses(requests: Iterable[ReplayRequest], model: str, *, dtype: str | None = None) -> DraftGuesses:
    """Run the draft ``model`` (a local folder or hub name transformers can load) once over each
    request's prompt and recorded output, keeping its argmax at every output position.

    At temperature 0 vLLM's draft proposer drafts greedily, so while its drafts are accepted the
    draft reads the target's own tokens: the argmax along the recorded output is what it drafts
    at every step, whatever ``k``. ``dtype`` is the engine's (``float32``, ``bfloat16``...;
    None: the checkpoint's); the draft runs on the CPU, one request at a time. Requests without
    token ids, or failed, are skipped.

    Raises:
        ImportError: torch or transformers is not installed.
        OSError: the model cannot be loaded (not local, and no hub access).
    """
    import torch
    from transformers import AutoModelForCausalLM

    from spectune._hf import dtype_kwarg, quiet_transformers

    pairs = [(p, o) for p, o in recorded_pairs(requests) if o]
    torch_dtype = _TORCH_DTYPES.get(dtype or "auto", "auto")
    with quiet_transformers():
        draft = AutoModelForCausalLM.from_pretrained(model, **dtype_kwarg(
            getattr(torch, torch_dtype) if torch_dtype != "auto" else "auto"))
    draft.eval()
    out = []
    with torch.inference_mode():
        for prompt, output in pairs:
            ids = torch.tensor([prompt + output], dtype=torch.long)
            # positions len(prompt) - 1 .. end: the draft's next token after prompt + output[:n]
            logits = draft(input_ids=ids, logits_to_keep=len(output) + 1).logits[0]
            out.append((len(prompt), tuple(output), tuple(int(t) for t in logits.argmax(-1).tolist())))
    return DraftGuesses(tuple(out))


HEAD_REPLAY_DEPTH = 8
"""Deepest chain :func:`head_chains` computes: replays of every ``k`` up to it."""


def head_chains(requests: Iterable[ReplayRequest], head: str, target: str, *, dtype: str | None = None,
                depth: int = HEAD_REPLAY_DEPTH) -> HeadChains:
    """Run the target (transformers) once over each request's prompt and recorded output for its
    auxiliary hidden states, then the EAGLE-3 ``head`` over them: its greedy chain of ``depth``
    drafts at every decode step (vLLM's proposer, :mod:`spectune.predict._eagle3`).

    While a chain's drafts are accepted they are the target's own tokens, so the chain is read
    with the recorded tokens as its inputs; past the recorded output it stops. ``dtype`` is the
    engine's; both models run on the CPU, one request at a time.

    Raises:
        ImportError: torch, transformers or safetensors is not installed.
        OSError, ValueError: a model cannot be loaded, or the head is not one replay runs.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from spectune._hf import dtype_kwarg, quiet_transformers
    from spectune.predict._eagle3 import load_head, target_features

    torch_dtype = getattr(torch, _TORCH_DTYPES.get(dtype or "float32", "float32"))
    with quiet_transformers():
        model = AutoModelForCausalLM.from_pretrained(target, **dtype_kwarg(torch_dtype))
    model.eval()
    drafter = load_head(head, torch_dtype)
    out = []
    with torch.inference_mode():
        for prompt, output in (pair for pair in recorded_pairs(requests) if pair[1]):
            ids = torch.tensor(prompt + output, dtype=torch.long)
            features, _ = target_features(model, ids, drafter.shape.layer_ids)
            tokens = torch.cat([ids, torch.zeros(depth, dtype=torch.long)])[None]
            first = len(prompt) - 1  # the start of n = 1: the head reads output[0] at position P - 1
            logits = drafter.chain_logits(features[None, :-1], tokens, depth, first=first)
            drafts = torch.stack([drafter.to_target(lg[0].argmax(-1)) for lg in logits], dim=1).tolist()
            length = len(prompt) + len(output)
            chains = [()] + [tuple(drafts[i][: max(0, length - 1 - (first + i))]) for i in range(len(drafts))]
            out.append((len(prompt), tuple(output), tuple(chains)))
    return HeadChains(tuple(out))


DRAFT_REPLAY_SPREAD = 0.02
"""Relative interval of a replayed draft's tokens per step: what the numerics of transformers
and the engine's kernels can move (near ties between the draft's top tokens; the largest
difference seen, 1.6 % of acceptance length, was on SmolLM2 in bfloat16)."""

DRAFT_REPLAY_MAX_BYTES = 4 * 2**30
"""Largest draft (weights on disk) that :class:`DraftReplays` runs on the CPU: about 2B
parameters in bfloat16 (its forward passes grow with its size and the study's output tokens)."""

def _weights_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.suffix in (".safetensors", ".bin", ".pt"))


def warm_replays(drafts: DraftReplays, proposers: Iterable[tuple[Method, str]], baseline: Measurement) -> None:
    """Run the drafts' guesses and heads' chains along ``baseline``'s outputs that predictions of
    ``proposers`` ((method, model) pairs) would ask ``drafts`` for, so that they are kept."""
    if not any(r.ok and r.token_ids and r.prompt_token_ids is not None for r in baseline.requests):
        return
    for method, model in proposers:
        if method is Method.DRAFT_MODEL:
            drafts.guesses(baseline.requests, model, dtype=baseline.engine.dtype)
        elif method is Method.EAGLE3:
            drafts.chains(baseline.requests, model, baseline.engine.model, dtype=baseline.engine.dtype)


def _local_weights(model: str) -> Path | None:
    """The folder holding ``model``'s weights: the path itself, or its snapshot in the Hugging
    Face cache (nothing is downloaded); None when neither is on this machine."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, local_files_only=True))
    except Exception:  # noqa: BLE001 - not a hub name, or not cached: no replay, and the reason is logged
        return None


class DraftReplays:
    """:func:`draft_guesses` and :func:`head_chains`, kept per proposer, dtype and outputs while
    the owner lives (guided search predicts again after every trial: a worker's search keeps
    one), and the proposers that would not run, not tried again; and each candidate's replayed
    acceptance on the same outputs (:meth:`acceptance`).

    Thread-safe: the slots of a worker share one. A replay runs in one thread at a time; another
    thread that asks for it meanwhile gets None at once (its prediction falls back to the
    proposer's measured trials, the learned model or the prior), as does any thread inside
    :meth:`cached_only` for a replay not run yet: a decision under the study's lock starts none."""

    KEPT = 8
    """Replays kept at most (the oldest is dropped first)."""
    KEPT_ACCEPTANCE = 4096
    """Candidates' replayed acceptances kept at most (the oldest is dropped first)."""

    def __init__(self) -> None:
        self._kept: dict[tuple[str, str, str, int], DraftGuesses | HeadChains] = {}
        self._refused: set[tuple[str, str, str]] = set()
        self._acceptance: dict[tuple[str, int], Any] = {}
        self._outputs: tuple[Sequence[ReplayRequest], int] | None = None
        self._lock = threading.Lock()
        self._running: set[tuple[str, str, str, int]] = set()
        self._local = threading.local()

    @contextlib.contextmanager
    def cached_only(self) -> Iterator[None]:
        """While in it, this thread is given only replays already run; none starts."""
        self._local.cached_only = True
        try:
            yield
        finally:
            self._local.cached_only = False

    def acceptance(self, candidate: str, requests: Sequence[ReplayRequest], replay: Callable[[], Any]) -> Any:
        """``replay()`` of ``candidate`` (its configuration as text) along ``requests``, run once
        per outputs while this lives: a replay of every n-gram window or suffix setting of a large
        space costs most of a prediction, and guided search predicts again after every trial."""
        with self._lock:
            if self._outputs is None or self._outputs[0] is not requests:  # held: its id cannot be reused meanwhile
                self._outputs = (requests, hash(tuple((tuple(p), tuple(o)) for p, o in recorded_pairs(requests))))
            key = (candidate, self._outputs[1])
            if key in self._acceptance:
                return self._acceptance[key]
        self._local.missed = False
        value = replay()
        if value is None and getattr(self._local, "missed", False):
            return None  # its draft's replay is not ready yet: asked again next time
        with self._lock:
            if len(self._acceptance) >= self.KEPT_ACCEPTANCE:
                self._acceptance.pop(next(iter(self._acceptance)))
            self._acceptance[key] = value
        return value

    def guesses(self, requests: Sequence[ReplayRequest], model: str, *, dtype: str | None = None) -> DraftGuesses | None:
        """The draft's guesses along ``requests``; None when the draft is not on this machine
        (asked again next time), or, logged once per draft and dtype, when it is larger than
        :data:`DRAFT_REPLAY_MAX_BYTES` or does not load or run. Predictions then fall back to the
        draft's measured trials, the learned model or the prior."""
        return self._replay("draft", requests, model, dtype, lambda folder: draft_guesses(requests, folder, dtype=dtype))

    def chains(self, requests: Sequence[ReplayRequest], head: str, target: str, *,
               dtype: str | None = None) -> HeadChains | None:
        """An EAGLE-3 head's chains along ``requests`` (:func:`head_chains`), None as for
        :meth:`guesses`; the target must be on this machine too, and counts towards the limit
        (the replay loads it whole)."""
        return self._replay("head", requests, head, dtype,
                            lambda folder, target_folder: head_chains(requests, folder, str(target_folder), dtype=dtype),
                            target=target)

    def _replay(self, kind: str, requests: Sequence[ReplayRequest], model: str, dtype: str | None,
                run: Callable[..., Any], target: str | None = None) -> Any:
        pairs = recorded_pairs(requests)
        key = (kind, model, str(dtype), hash(tuple((tuple(p), tuple(o)) for p, o in pairs)))
        with self._lock:
            if key in self._kept:
                return self._kept[key]
            if key[:3] in self._refused:
                return None
            if key in self._running or getattr(self._local, "cached_only", False):
                self._local.missed = True  # running in another thread, or not to be started here
                return None
            self._running.add(key)
        try:
            replay, why = self._run(kind, model, dtype, run, target)
        finally:
            with self._lock:
                self._running.discard(key)
        if replay is None and why is None:  # not on this machine: not remembered, its engine may fetch it
            return None
        with self._lock:
            if replay is None:
                self._refused.add(key[:3])
            else:
                if len(self._kept) >= self.KEPT:
                    self._kept.pop(next(iter(self._kept)))
                self._kept[key] = replay
        if replay is None:
            logger.warning("%s %s is not replayed offline: %s", kind, model, why)
        return replay

    @staticmethod
    def _run(kind: str, model: str, dtype: str | None, run: Callable[..., Any],
             target: str | None) -> tuple[Any, str | None]:
        """(the replay, None), or (None, why it will not run here), or (None, None) for weights
        not on this machine. Everything the replay loads counts towards the limit: the model,
        and a head's target, at the width the replay computes in (float32: twice a 16-bit file)."""
        folder = _local_weights(model)
        target_folder = _local_weights(target) if target is not None else None
        missing = model if folder is None else target if target is not None and target_folder is None else None
        if missing is not None:
            logger.info("%s %s is not replayed offline: %s's weights are not on this machine", kind, model, missing)
            return None, None
        try:
            size = sum(_weights_bytes(f) for f in (folder, target_folder) if f is not None)
            size *= 2 if dtype in (None, "float32") else 1
            if size > DRAFT_REPLAY_MAX_BYTES:
                what = "it and its target take" if target is not None else "its weights take"
                return None, (f"{what} {size / 2**30:.1f} GiB in {dtype or 'float32'}, more than "
                              f"{DRAFT_REPLAY_MAX_BYTES / 2**30:.0f} GiB to run on the CPU: predictions use its "
                              "measured trials")
            return (run(str(folder), target_folder) if target is not None else run(str(folder))), None
        except Exception as exc:  # noqa: BLE001 - any checkpoint transformers cannot run: no replay, logged
            return None, f"it did not load or run ({type(exc).__name__}: {exc})"


def replay_draft(guesses: DraftGuesses, k: int, *, max_model_len: int | None = None) -> ReplayAcceptance:
    """What vLLM's draft-model proposer (``method: draft_model``) drafts and has accepted with
    ``k`` tokens, from the draft's argmax along the recorded outputs (:func:`draft_guesses`).

    The draft proposes ``k`` tokens at every decode step; the ``i``-th is its argmax after the
    context and the ``i - 1`` drafted before it, which is ``guess[n + i]`` as long as those were
    the target's (past the first rejected one, what it drafts no longer counts). Near
    ``max_model_len`` the engine schedules fewer: at most ``max_model_len - 1`` tokens in all. Exact
    up to the numerics of the two implementations: a near tie between the draft's top tokens can
    fall the other way in the engine's kernels.

    Raises:
        ValueError: ``k < 1``.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return _replay_proposals(((p, o, lambda n, room, g=g: g[n: n + room]) for p, o, g in guesses.requests),
                             k, max_model_len)


def replay_head(chains: HeadChains, k: int, *, max_model_len: int | None = None) -> ReplayAcceptance:
    """What vLLM's EAGLE-3 proposer drafts and has accepted with ``k`` tokens, from the head's
    chains along the recorded outputs (:func:`head_chains`, at least ``k`` deep). Exact up to the
    numerics of the two implementations, as :func:`replay_draft`.

    Raises:
        ValueError: ``k < 1``.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return _replay_proposals(((p, o, lambda n, room, c=c: c[n][:room]) for p, o, c in chains.requests),
                             k, max_model_len)


def _replay_proposals(requests: Iterable[tuple[int, Sequence[int], Any]], k: int,
                      max_model_len: int | None) -> ReplayAcceptance:
    """Step through each request as the engine does; ``propose(n, room)`` gives the known
    drafts after ``prompt + output[:n]`` (at most ``room``)."""
    limit = max_model_len or UNLIMITED_MODEL_LEN
    tally = Tally(k)
    for prompt_len, output, propose in requests:
        tally.requests += 1
        n = 1
        while n < len(output):
            room = min(k, limit - prompt_len - n - 1)  # the scheduler's cap near max_model_len
            known = propose(n, max(room, 0))
            draft = (*known, *([-1] * (room - len(known))))  # past the recorded output: unknown, never equal
            n += tally.step(draft, output, n)
    return tally.result(spread=DRAFT_REPLAY_SPREAD)
