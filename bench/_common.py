"""What every bench shares: where it writes, which CPU it ran on, and stopping what it
started.

Where: ``$SHOAL_HOME/bench`` when SHOAL_HOME is set, else ``~/.cache/shoal-bench`` (under
$HOME, where a user's SHOAL_HOME lives: /tmp's directory operations are several times slower
on the development machines). Each bench makes its own directory there and removes it.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["cpu_model", "scratch", "stop_background", "wait_background"]


def scratch() -> str:
    home = os.environ.get("SHOAL_HOME")
    path = Path(home) / "bench" if home else Path.home() / ".cache" / "shoal-bench"
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


def cpu_model() -> str:
    """The CPU's model name and how many cores this process may use, for every result line."""
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{name}, {cores} cores"


def stop_background(session: Any) -> None:
    """Stop everything the bench's session left running in its home (warm workers, endpoint
    supervisors, the launcher), through ``shoal workers stop --all``, then close it."""
    env = {**os.environ, "SHOAL_HOME": str(session.home)}
    try:
        subprocess.run([sys.executable, "-m", "shoal.cli", "workers", "stop", "--all",
                        "--grace", "5"], env=env, capture_output=True, timeout=120, check=False)
    finally:
        session.backend.shutdown_launcher()
        session.close()


def wait_background(marker: str, timeout: float = 600.0) -> None:
    """Wait until no ``compileall`` whose command line names *marker* (a bench's directory)
    runs: the bytecode a build compiles in the background must not overlap the next sample."""
    import time

    deadline = time.monotonic() + timeout
    me = os.getpid()
    while time.monotonic() < deadline:
        busy = False
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == me:
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
                if marker.encode() in cmdline and b"compileall" in cmdline:
                    busy = True
                    break
            except OSError:
                continue
        if not busy:
            return
        time.sleep(0.1)  # a bounded wait on processes this bench started
    raise TimeoutError(f"background work naming {marker} still runs after {timeout:g} s")
