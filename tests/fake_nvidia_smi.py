"""A stand-in ``nvidia-smi`` for what no GPU here can show: a real process answering the queries
spectune makes, ``--query-gpu=FIELDS --format=csv,noheader[,nounits] [--id=LIST]``, from the GPUs
that ``FAKE_SMI_GPUS`` lists (``index,uuid,name,memory.total[,memory.used]`` each, ``;`` between
GPUs). A device's memory.used grows by what ``$FAKE_SMI_STATE/<index>.used`` holds (MiB; the
stand-in engine writes it while it runs). ``--id`` takes host indices or UUIDs, as nvidia-smi
does. Compute-app queries answer nothing, as in a container whose PIDs the driver does not know."""

from __future__ import annotations

import os
import sys

FIELDS = ("index", "uuid", "name", "memory.total", "memory.used")


def _used(gpu: dict[str, str]) -> str:
    """memory.used: the listed base plus what a running stand-in engine holds on the device."""
    base = int(gpu.get("memory.used", "0 MiB").split()[0])
    state = os.environ.get("FAKE_SMI_STATE")
    extra = 0
    if state and os.path.exists(path := os.path.join(state, f"{gpu['index']}.used")):
        with open(path, encoding="utf-8") as f:
            extra = int(f.read().strip() or 0)
    return f"{base + extra} MiB"


def main(argv: list[str]) -> int:
    gpus = [dict(zip(FIELDS, (x.strip() for x in g.split(",")), strict=False))
            for g in os.environ.get("FAKE_SMI_GPUS", "").split(";") if g.strip()]
    for gpu in gpus:
        gpu["memory.used"] = _used(gpu)
    option = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in argv if "=" in a}
    if "--query-gpu" not in option:
        return 0
    ids = option["--id"].split(",") if "--id" in option else None
    for gpu in gpus:
        if ids is None or gpu["index"] in ids or gpu["uuid"] in ids:
            values = [gpu[f] for f in option["--query-gpu"].split(",")]
            if "nounits" in option.get("--format", ""):
                values = [v.removesuffix(" MiB") for v in values]
            print(", ".join(values))
    if ids is not None and not any(g["index"] in ids or g["uuid"] in ids for g in gpus):
        print(f"No devices were found matching the ID {ids[0]}", file=sys.stderr)
        return 6
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
