"""Small helpers around transformers and the Hugging Face hub, for the code that loads
checkpoints (the draft replay and the checkpoint builders) and checks hub names (the pairing).
Imports transformers and huggingface_hub only when called."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["HUB_FILES", "dtype_kwarg", "hub_files", "quiet_transformers"]


def dtype_kwarg(dtype: Any) -> dict[str, Any]:
    """``from_pretrained``'s keyword for the weights' dtype: ``dtype`` from transformers 5 on,
    ``torch_dtype`` before."""
    import transformers

    return {"dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype": dtype}


@contextlib.contextmanager
def quiet_transformers(gguf: bool = False) -> Iterator[None]:
    """Hide transformers' progress bars (and the GGUF reader's); restores them afterwards."""
    import functools
    import importlib

    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    # The GGUF reader uses tqdm directly, outside transformers' switch.
    gguf_utils: Any = None
    if gguf:
        with contextlib.suppress(ImportError):
            gguf_utils = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
    gguf_tqdm = getattr(gguf_utils, "tqdm", None)
    if gguf_tqdm is not None:
        gguf_utils.tqdm = functools.partial(gguf_tqdm, disable=True)
    try:
        yield
    finally:
        if gguf_tqdm is not None:
            gguf_utils.tqdm = gguf_tqdm
        if was_enabled:
            hf_logging.enable_progress_bar()


HUB_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json",
             "merges.txt", "spiece.model")
"""What the pairing checks read of a hub model: its config and tokenizer, never its weights."""


def _hub_reachable() -> bool:
    """Whether the hub's host answers a TCP connection within 3 s (asked once a process: an
    air-gapped machine would otherwise wait for every name through the hub client's retries)."""
    return _reachable(_endpoint())


def _endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


@functools.lru_cache(maxsize=8)
def _reachable(endpoint: str) -> bool:
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(endpoint)
    try:
        with socket.create_connection((url.hostname or "", url.port or (443 if url.scheme == "https" else 80)),
                                      timeout=3):
            return True
    except OSError:
        return False


def hub_files(name: str, what: str) -> Path | None:
    """The folder holding hub model ``name``'s config and tokenizer files (:data:`HUB_FILES`,
    fetched into the Hugging Face cache; with ``HF_HUB_OFFLINE`` set, read from it); None where
    neither the hub nor the cache has them (the hub unreachable).

    Raises:
        ConfigError: one line: the model is gated and this machine has no access to it, or the
            hub has no such model (``what`` names its role: target, draft, head).
    """
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    from spectune.errors import ConfigError

    online = not constants.HF_HUB_OFFLINE and _hub_reachable()
    folder = None
    for file in HUB_FILES:
        try:
            folder = Path(hf_hub_download(name, file, local_files_only=not online)).parent
        except GatedRepoError:
            raise ConfigError(f"{what} {name} is gated on the Hugging Face hub and this machine may not read it: "
                              "accept its terms on its page, then set HF_TOKEN (or run hf auth login)") from None
        except RepositoryNotFoundError:
            raise ConfigError(f"{what} {name} is no folder here and no model on the Hugging Face hub "
                              "(a private one needs HF_TOKEN)") from None
        except LocalEntryNotFoundError:  # offline or unreachable, and not in the cache
            if file == "config.json":
                return None
        except (EntryNotFoundError, OSError, ValueError):  # the model has no such file
            continue
    return folder
