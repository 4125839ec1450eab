"""Small helpers around transformers, for the code that loads checkpoints (the draft replay and
the checkpoint builders). Imports transformers only when called."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["dtype_kwarg", "quiet_transformers"]


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
