"""What runs on a Ray node for a job's supervisor: its environment, home, and how it starts.

Shared by the actor per job (``ray.py``) and the warm actors (``_raywarm.py``). Imports no ray.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from shoal.errors import LaunchError

__all__ = ["node_env", "node_home", "start_supervisor"]

#: The client's values of these are meaningless on another machine: the node's own win.
_NODE_VARS = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "TMPDIR", "VIRTUAL_ENV",
              "PYTHONHOME", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "PWD")
#: Ray schedules capacity; the supervisor's machine-wide slots must not queue a second time.
_NODE_SLOTS = "256"

# Runs in the supervisor's process: die with the actor's worker, then run the entry point.
_RUN = """\
import ctypes, os, signal, sys
ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    sys.exit(70)  # the actor died while this process started
from shoal.backends._launcher import resolve_entrypoint
sys.exit(int(resolve_entrypoint(sys.argv[2])(*sys.argv[3:]) or 0))
"""


def node_home(client_home: str | None) -> Path:
    """The client's SHOAL_HOME when this node can use it (same machine, shared disk), else
    the node user's own, else a temporary directory."""
    candidates = [client_home] if client_home else []
    candidates += [str(Path.home() / ".shoal"), str(Path(tempfile.gettempdir()) / "shoal-node")]
    for path in candidates:
        with contextlib.suppress(OSError):
            Path(path).mkdir(parents=True, exist_ok=True)
            if os.access(path, os.W_OK | os.X_OK):
                return Path(path)
    raise LaunchError(f"no writable shoal home on node {socket.gethostname()}: tried "
                      f"{', '.join(candidates)}")


def node_env(client_env: Mapping[str, str], node_environ: Mapping[str, str]) -> dict[str, str]:
    """The supervisor's environment on a node: the client's, with the node's machine-specific
    variables, home and capacity."""
    env = {k: v for k, v in client_env.items() if k not in _NODE_VARS}
    env.update({k: node_environ[k] for k in _NODE_VARS if k in node_environ})
    env["SHOAL_HOME"] = str(node_home(client_env.get("SHOAL_HOME")))
    env["SHOAL_MAX_SLOTS"] = _NODE_SLOTS
    return env


def start_supervisor(entrypoint: str, args: list[str], env: dict[str, str], cwd: str | None,
                     log_path: Path) -> subprocess.Popen[bytes]:
    """Start a supervisor that dies with this process (``PR_SET_PDEATHSIG``): call it from a
    thread that lives as long as the supervisor should (the signal follows the thread)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-c", _RUN, str(os.getpid()), entrypoint, *args],
            env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True)
