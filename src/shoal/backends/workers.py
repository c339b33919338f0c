"""What runs in the background for one shoal home, and stopping it (``shoal workers``).

* **launchers**: the fork servers behind ``<home>/run/launcher-*.sock`` (found by a ping,
  which answers with the pid); idle since the last supervisor one started (the mtime of
  ``<home>/run/supervisors/``, where each start opens a log);
* **warm workers**: supervisors kept alive for the next job, one ``<pid>.claim`` each in
  ``<home>/run/warm/<pool>/`` (busy while a client holds the claim's lock; idle since the
  claim's mtime, which the worker touches whenever a job ends);
* **endpoint supervisors**: from the endpoint records' supervisor handles (pid and start
  ticks, so a reused pid is never mistaken for one).

A process is recognised by its pid *and* its start time (``start_ticks``) before anything is
sent to it. Memory is the resident set (``VmRSS``) of the process, and for warm workers and
endpoint supervisors also of what they started (the job, the model servers). Linux only
(``/proc``), like the local backend's liveness checks.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shoal.backends.procfs import process_state, start_ticks

__all__ = ["Worker", "find_workers", "stop_worker"]


@dataclass(frozen=True, slots=True)
class Worker:
    pid: int
    kind: str  # "launcher", "warm-worker" or "endpoint"
    home: str
    name: str  # the socket, the pool, or the endpoint
    state: str  # "idle", "busy", or an endpoint's status
    idle_seconds: float | None
    rss_bytes: int | None
    start_ticks: int | None
    #: Sockets and claim files it owns, removed when it is stopped.
    files: tuple[str, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "kind": self.kind, "home": self.home, "name": self.name,
                "state": self.state, "idle_seconds": self.idle_seconds,
                "rss_bytes": self.rss_bytes}


def _alive(pid: int, ticks: int | None) -> bool:
    state = process_state(pid)
    if state is None or state in ("Z", "X"):
        return False
    return ticks is None or start_ticks(pid) == ticks


def _rss(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return 0  # a kernel thread or a process on its way out


def _children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError):
                text = Path(f"/proc/{pid}/task/{task}/children").read_text()
                found += [int(c) for c in text.split()]
    return found


def _tree_rss(pid: int, depth: int = 0) -> int | None:
    own = _rss(pid)
    if own is None or depth > 8:
        return own
    return own + sum(_tree_rss(c, depth + 1) or 0 for c in _children(pid))


def _started_at(pid: int) -> float | None:
    ticks = start_ticks(pid)
    if ticks is None:
        return None
    try:
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    except (OSError, StopIteration, ValueError):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def _ping(sock_path: str) -> int | None:
    import json

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.settimeout(2)
            s.connect(sock_path)
            s.sendall(b'{"op": "ping"}\n')
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(4096)
                if not chunk:
                    return None
                data += chunk
            return int(json.loads(data)["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            return None


def _launchers(run_dir: Path, home: str, extra_sockets: Iterable[str]) -> list[Worker]:
    sockets = sorted({*map(str, run_dir.glob("launcher-*.sock")), *extra_sockets})
    supervisors = run_dir / "supervisors"
    found = []
    for path in sockets:
        if not os.path.exists(path):
            continue
        pid = _ping(path)
        if pid is None or not _alive(pid, None):
            continue
        last = max(filter(None, (_started_at(pid), _mtime(supervisors))), default=None)
        found.append(Worker(pid, "launcher", home, os.path.basename(path), "idle",
                            None if last is None else max(0.0, time.time() - last), _rss(pid),
                            start_ticks(pid), (path, path + ".tmp")))
    return found


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _is_claimed(claim: Path) -> bool | None:
    """Whether a client holds the claim (the worker is busy); None when it is gone."""
    try:
        with open(claim) as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(f, fcntl.LOCK_UN)
            return False
    except FileNotFoundError:
        return None


def _pool_dirs(run_dir: Path) -> list[Path]:
    """The home's pools: under its run directory, and those whose path was too long for
    AF_UNIX (in the private socket directory, marked with their run directory)."""
    dirs = sorted((run_dir / "warm").glob("*/"))
    with contextlib.suppress(Exception):
        from shoal.backends._warm import OWNER_FILE
        from shoal.backends.rundir import private_socket_dir

        for d in sorted((private_socket_dir() / "warm").glob("*/")):
            with contextlib.suppress(OSError):
                if (d / OWNER_FILE).read_text() == str(run_dir):
                    dirs.append(d)
    return dirs


def _warm_workers(run_dir: Path, home: str) -> list[Worker]:
    found = []
    for claim in sorted(c for d in _pool_dirs(run_dir) for c in d.glob("*.claim")):
        try:
            pid = int(claim.name.split(".")[0])
        except ValueError:
            continue
        if not _alive(pid, None):
            continue
        busy = _is_claimed(claim)
        if busy is None:
            continue
        mtime = _mtime(claim)
        idle = None if busy or mtime is None else max(0.0, time.time() - mtime)
        sock = claim.with_suffix(".sock")
        found.append(Worker(pid, "warm-worker", home, claim.parent.name,
                            "busy" if busy else "idle", idle, _tree_rss(pid), start_ticks(pid),
                            (str(sock), str(claim))))
    return found


def _endpoint_supervisors(endpoints: Iterable[tuple[str, str, Mapping[str, Any]]],
                          home: str) -> list[Worker]:
    host = socket.gethostname()
    found = []
    for name, status, handle in endpoints:
        pid, ticks = handle.get("pid"), handle.get("start_ticks")
        if not pid or handle.get("host") not in (None, host) or not _alive(int(pid), ticks):
            continue
        found.append(Worker(int(pid), "endpoint", home, name, status, None,
                            _tree_rss(int(pid)), ticks))
    return found


def find_workers(run_dir: Path, home: str, *, launcher_sockets: Iterable[str] = (),
                 endpoints: Iterable[tuple[str, str, Mapping[str, Any]]] = ()) -> list[Worker]:
    """Every launcher, warm worker and endpoint supervisor of the home at *run_dir*.
    *endpoints*: ``(name, status, supervisor handle)`` of the home's endpoints."""
    return [*_launchers(Path(run_dir), home, launcher_sockets),
            *_warm_workers(Path(run_dir), home), *_endpoint_supervisors(endpoints, home)]


def stop_worker(worker: Worker, *, grace_seconds: float) -> str:
    """SIGTERM, then SIGKILL after *grace_seconds*; remove its sockets and claim file.
    Returns ``"stopped"``, ``"killed"`` or ``"gone"`` (it had exited, or the pid is another
    process's now)."""
    pid = worker.pid
    if not _alive(pid, worker.start_ticks):
        _remove(worker.files)
        return "gone"
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    outcome = "stopped"
    if not _wait_gone(pid, worker.start_ticks, grace_seconds):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        _wait_gone(pid, worker.start_ticks, 10.0)
        outcome = "killed"
    _remove(worker.files)
    return outcome


def _wait_gone(pid: int, ticks: int | None, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid, ticks):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)  # bounded poll on a process that is not our child
    return True


def _remove(paths: Iterable[str]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            os.unlink(path)
