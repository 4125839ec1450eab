"""``spectune models`` (build, prepare or train checkpoints) and ``spectune workloads`` (the shipped
prompt sets)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from spectune.cli._args import _err_console

models_app = typer.Typer(help="Build or prepare checkpoints.", no_args_is_help=True)
workloads_app = typer.Typer(help="Prompt sets.", no_args_is_help=True)


@workloads_app.command("list")
def workloads_list() -> None:
    """Shipped prompt sets, read offline from installed packages, with their counts."""
    from rich.console import Console

    from spectune.workloads import shipped_sets_table

    Console().print(shipped_sets_table())


@models_app.command("build-tiny")
def build_tiny(
    directory: Annotated[Path, typer.Argument(help="Folder for target/, draft/ and eagle3/.")],
    seed: Annotated[int, typer.Option()] = 0,
    force: Annotated[bool, typer.Option(help="Rebuild even if present.")] = False,
) -> None:
    """Build a tiny Llama target, a draft sharing its tokenizer and an EAGLE-3 head for it (offline, about 1.5 min)."""
    from spectune._progress import phase_progress
    from spectune.checkpoints import build_tiny as build

    with phase_progress(_err_console(), "build tiny models") as hook:
        built = build(directory, seed=seed, force=force, progress=hook)
    typer.echo(f"target: {built.target}\ndraft: {built.draft}\neagle3: {built.eagle3}")


@models_app.command("prepare")
def prepare(
    name: Annotated[str, typer.Argument(help="smollm2, smollm2-draft (a 2-layer draft distilled from it, 5-12 min) "
                                        "or smollm2-eagle3 (an EAGLE-3 head trained for it, about 15 min).")] = "smollm2",
    cache_dir: Annotated[Optional[Path], typer.Option(help="Cache folder.")] = None,
    force: Annotated[bool, typer.Option()] = False,
) -> None:
    """Convert a shipped model into a checkpoint vLLM serves (offline, once); print its folder."""
    from spectune._progress import phase_progress
    from spectune.checkpoints import build_smollm2_draft, build_smollm2_eagle3, prepare_smollm2
    from spectune.errors import ConfigError

    builders = {"smollm2": lambda hook: prepare_smollm2(cache_dir, force=force, progress=hook),
                "smollm2-draft": lambda hook: build_smollm2_draft(None, cache_dir, force=force, progress=hook),
                "smollm2-eagle3": lambda hook: build_smollm2_eagle3(cache_dir, force=force, progress=hook)}
    if name not in builders:
        raise ConfigError(f"unknown model {name!r}; known: {', '.join(builders)}")
    with phase_progress(_err_console(), f"prepare {name}") as hook:
        typer.echo(str(builders[name](hook)))


@models_app.command("train-head")
def train_head(
    target: Annotated[str, typer.Option(help="Target model: a folder, or a hub name (Llama- or Qwen-shaped).")],
    workload: Annotated[str, typer.Option(help="Prompt file or shipped set whose answers the head learns.")],
    num_prompts: Annotated[Optional[int], typer.Option(min=1, help="Prompts to use (default: all).")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Head folder (default: <cache>/models/<target>-eagle3-<workload>).")] = None,
    steps: Annotated[int, typer.Option(min=1, help="Training steps.")] = 600,
    max_tokens: Annotated[int, typer.Option(min=1, help="Tokens of the target's answer to each prompt.")] = 64,
    draft_vocab: Annotated[Optional[int], typer.Option(min=1, help="Draft vocabulary: the target's most used tokens (default: all).")] = None,
    force: Annotated[bool, typer.Option(help="Train again even if the head is there.")] = False,
) -> None:
    """Train an EAGLE-3 head for TARGET on its own answers to WORKLOAD (CPU, or a GPU torch sees);
    resumes where it stopped; print its folder, for `optimize --draft`."""
    from spectune._progress import phase_progress
    from spectune._util import validate
    from spectune.checkpoints import HeadTraining
    from spectune.checkpoints import train_head as train
    from spectune.config import WorkloadSpec

    spec = validate(WorkloadSpec, {"source": workload, "num_prompts": num_prompts}, "workload")
    training = HeadTraining(steps=steps, max_new_tokens=max_tokens, draft_vocab_size=draft_vocab)
    with phase_progress(_err_console(), "train head") as hook:
        typer.echo(str(train(target, spec, out, training=training, force=force, progress=hook)))
