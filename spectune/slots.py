"""Where a worker runs its engines: one slot per GPU group (``--gpus``), numbered within the GPUs
the worker was given, and the checks that keep a study's trials comparable across slots and
workers (group size, GPU model)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spectune.errors import ConfigError
from spectune.provenance import gpu_devices
from spectune.records import StudyRecord, write_study_fields

if TYPE_CHECKING:
    from spectune.config import EngineArgs
    from spectune.study import StudyContext

__all__ = ["GPU_ENV", "MAX_GPU_INDEX", "Slot", "check_placement", "parse_gpus"]

GPU_ENV = "CUDA_VISIBLE_DEVICES"

MAX_GPU_INDEX = 1024
"""GPU numbers ``--gpus`` takes are below this: a range is listed one GPU at a time."""


@dataclass(frozen=True)
class Slot:
    """Where a worker runs one engine at a time: a GPU group, or (``gpus`` None) wherever the
    engine's environment puts it (the CPU, or the GPUs the worker itself was given).

    ``gpus`` are the numbers ``--gpus`` gave; ``devices`` what ``CUDA_VISIBLE_DEVICES`` names for
    them: the entries of the list the worker inherited (a scheduler's GPUs 4-7, or their UUIDs),
    or the numbers themselves where it inherited none."""

    gpus: tuple[int, ...] | None = None
    devices: tuple[str, ...] | None = None

    @property
    def label(self) -> str | None:
        """The slot's ``CUDA_VISIBLE_DEVICES`` (None: not placed by spectune)."""
        if self.gpus is None:
            return None
        return ",".join(self.devices) if self.devices is not None else ",".join(map(str, self.gpus))

    @property
    def name(self) -> str:
        """The slot as a person names it: ``GPU 2``, ``GPUs 2,3``, or ``the worker's engine slot``."""
        if self.gpus is None:
            return "the worker's engine slot"
        return f"GPU{'s' if len(self.gpus) > 1 else ''} {self.label}"

    def place(self, engine: EngineArgs) -> EngineArgs:
        """The study's engine arguments on this slot: its GPUs as ``CUDA_VISIBLE_DEVICES``, and
        tensor parallelism over the group unless the study fixes it (:func:`parse_gpus` checked)."""
        if self.gpus is None:
            return engine
        return engine.model_copy(update={
            "env": {**engine.env, GPU_ENV: self.label},
            "tensor_parallel_size": engine.tensor_parallel_size or len(self.gpus),
        })


def parse_gpus(text: str | None, env: Mapping[str, str] | None = None) -> list[Slot]:
    """``"0,1,2,3"``: one engine per GPU; ``"0-1,2-3"``: one per group of two; None: one engine,
    placed by the environment. The numbers count the GPUs the worker was given: where its
    environment (``env``, default this process's) sets ``CUDA_VISIBLE_DEVICES=4,5,6,7``, GPU 0
    is device 4, as CUDA numbers them for the worker itself.

    Raises:
        ConfigError: not GPU numbers and ranges, a GPU in two groups, groups of different sizes
            (their trials would not compare), or a number beyond the GPUs the worker was given.
    """
    if text is None or not text.strip():
        return [Slot()]
    groups: list[tuple[int, ...]] = []
    for part in text.split(","):
        low, sep, high = part.strip().partition("-")
        try:
            first, last = int(low), int(high) if sep else int(low)
        except ValueError:
            raise ConfigError(f"--gpus {text!r}: expected GPU numbers and ranges, e.g. 0,1,2,3 or 0-1,2-3") from None
        if first < 0 or last < first:
            raise ConfigError(f"--gpus {text!r}: {part.strip()!r} is no GPU range")
        if last >= MAX_GPU_INDEX:
            raise ConfigError(f"--gpus {text!r}: GPU {last} is beyond any machine's (numbers below {MAX_GPU_INDEX})")
        groups.append(tuple(range(first, last + 1)))
    seen = [g for group in groups for g in group]
    if len(seen) != len(set(seen)):
        raise ConfigError(f"--gpus {text!r}: a GPU is in two groups")
    if len({len(g) for g in groups}) > 1:
        raise ConfigError(f"--gpus {text!r}: every group needs the same number of GPUs "
                          "(trials on groups of other sizes would not compare)")
    visible = (os.environ if env is None else env).get(GPU_ENV)
    if visible is None:
        return [Slot(g) for g in groups]
    given = [d.strip() for d in visible.split(",") if d.strip()]
    if (beyond := max(seen)) >= len(given):
        raise ConfigError(f"--gpus {text!r}: GPU {beyond} is not among the {len(given)} this worker was given "
                          f"({GPU_ENV}={visible}); --gpus counts those, from 0")
    return [Slot(g, tuple(given[i] for i in g)) for g in groups]


def _models(slot: Slot) -> list[str]:
    """The GPU models of ``slot``'s devices (of every GPU the worker sees, for an unplaced slot)."""
    return sorted({d.name for d in gpu_devices(slot.label if slot.label is not None else os.environ.get(GPU_ENV))})


def check_placement(ctx: StudyContext, slots: list[Slot], *, mixed_gpus: bool = False) -> None:
    """Refuse slots that do not fit the study: a fixed tensor parallel size of another size, other
    workers' engines on groups of another size, or (unless ``mixed_gpus``) GPUs of another model
    than this worker's other slots or the study's (each recorded by the first worker)."""
    size = len(slots[0].gpus) if slots[0].gpus is not None else None
    fixed = ctx.engine.tensor_parallel_size
    if size is not None and fixed is not None and fixed != size:
        raise ConfigError(f"--gpus: groups of {size} GPU(s), but the study fixes tensor_parallel_size {fixed}")
    record = StudyRecord.of(ctx.study)
    if record.gpus_per_engine is None:
        write_study_fields(ctx.study, gpus_per_engine=size or 0)
    elif record.gpus_per_engine != (size or 0):
        def says(n: int | None) -> str:
            return f"{n} GPU(s) per engine (--gpus)" if n else "engines placed by their environment (no --gpus)"

        raise ConfigError(f"study {ctx.study.study_name} measures with {says(record.gpus_per_engine)}; this worker "
                          f"would use {says(size)}: its trials would not compare")
    models = {slot: _models(slot) for slot in slots}
    seen = sorted({m for ms in models.values() for m in ms})
    if not seen or mixed_gpus:
        return
    if len(seen) > 1:
        where = "; ".join(f"{slot.name}: {', '.join(ms)}" for slot, ms in models.items() if ms)
        raise ConfigError(f"--gpus: GPUs of different models ({where}) would not compare; --mixed-gpus to share "
                          "the study anyway")
    if record.gpu_model is None:
        write_study_fields(ctx.study, gpu_model=seen[0])
    elif record.gpu_model != seen[0]:
        raise ConfigError(f"study {ctx.study.study_name} measures on {record.gpu_model}; this worker's GPUs are "
                          f"{seen[0]}: its trials would not compare (--mixed-gpus to share the study anyway)")
