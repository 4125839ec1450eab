"""Engine watchdog: stops an engine's process group when the process that started it dies.

    python -m spectune.engines._watchdog PGID

Started by :class:`~spectune.engines.VLLMServer` with a pipe on its standard input. The owner
writes ``stop`` before it stops the engine itself; if the pipe closes without that (the owner
was killed, even with SIGKILL), the watchdog sends SIGTERM to the group, then SIGKILL.
It runs in a session of its own, so a Ctrl-C on the owner's terminal does not reach it.
"""

from __future__ import annotations

import os
import signal
import sys
import time


def group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main() -> int:
    pgid = int(sys.argv[1])
    grace = float(sys.argv[2]) if len(sys.argv) > 2 else 10.0
    line = sys.stdin.readline()  # blocks until the owner writes or dies
    if line.strip() == "stop":
        return 0
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGCONT, 0.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return 0
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and group_alive(pgid):
            time.sleep(0.1)
        if not group_alive(pgid):
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
