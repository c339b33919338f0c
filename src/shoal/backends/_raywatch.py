"""Ends what a Ray node leaves behind when its raylet dies (killed, crashed, out of memory).

``ray start`` starts a node's processes (raylet, ``log_monitor.py``, agents) side by side; when
the raylet dies the others may keep running for good. ``shoal ray up`` starts this watcher
beside each node (``python -m shoal.backends._raywatch TEMP_DIR RAYLET_PID``): it waits for the node's
raylet to end, then ends every process left under the node's temporary directory, and
itself. ``shoal ray down`` ends it with the node (its command line names the directory).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

__all__ = ["main", "raylets_of"]

_POLL_S = 1.0


def raylets_of(temp: str) -> list[int]:
    from shoal.backends.ray_cluster import _processes_under

    found = []
    for pid in _processes_under(Path(temp)):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if cmdline.split(b"\0")[0].endswith(b"/raylet"):
            found.append(pid)
    return found


def main(argv: list[str] | None = None) -> int:
    from shoal.backends.ray_cluster import _exists, _kill_tree, _processes_under

    args = sys.argv[1:] if argv is None else argv
    temp = args[0]
    deadline = time.monotonic() + 120.0
    # The raylet's pid, found by 'shoal ray up' as the node started (it may die before this
    # process has looked for it); else looked for here.
    raylets = [int(a) for a in args[1:]] or raylets_of(temp)
    while not raylets and time.monotonic() < deadline:  # it is still starting
        time.sleep(_POLL_S)
        raylets = raylets_of(temp)
    while any(_exists(p) for p in raylets):
        time.sleep(_POLL_S)  # the node's life: one look a second
    _kill_tree(_processes_under(Path(temp)), grace=2.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
