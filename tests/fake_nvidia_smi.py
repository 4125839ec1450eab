"""A stand-in ``nvidia-smi`` for what no GPU here can show: a real process answering the queries
spectune makes, ``--query-gpu=FIELDS --format=csv,noheader [--id=LIST]``, from the GPUs that
``FAKE_SMI_GPUS`` lists (``index,uuid,name,memory.total`` each, ``;`` between GPUs). ``--id``
takes host indices or UUIDs, as nvidia-smi does; compute-app queries answer nothing."""

from __future__ import annotations

import os
import sys

FIELDS = ("index", "uuid", "name", "memory.total")


def main(argv: list[str]) -> int:
    gpus = [dict(zip(FIELDS, (x.strip() for x in g.split(",")), strict=True))
            for g in os.environ.get("FAKE_SMI_GPUS", "").split(";") if g.strip()]
    option = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in argv if "=" in a}
    if "--query-gpu" not in option:
        return 0
    ids = option["--id"].split(",") if "--id" in option else None
    for gpu in gpus:
        if ids is None or gpu["index"] in ids or gpu["uuid"] in ids:
            print(", ".join(gpu[f] for f in option["--query-gpu"].split(",")))
    if ids is not None and not any(g["index"] in ids or g["uuid"] in ids for g in gpus):
        print(f"No devices were found matching the ID {ids[0]}", file=sys.stderr)
        return 6
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
