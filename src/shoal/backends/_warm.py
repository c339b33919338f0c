"""Warm pools on this machine: supervisors that stay alive to take the next compatible job.

Each warm worker listens on ``<pool>/<pid>.sock`` and owns ``<pool>/<pid>.claim``. A client
claims an idle worker by taking the claim file's lock, hands it one job, and is told when the
job has ended; a worker retires after its keep-alive period only when it can take its own
claim lock, so a worker is never retired under a client that just claimed it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

from shoal.backends._procfs import start_ticks
from shoal.backends._rundir import private_socket_dir

__all__ = ["WarmClaim", "WarmEndpoint", "claim_worker", "pool_dir"]


def pool_dir(run_dir: Path, pool: str) -> Path:
    """The directory of a pool; short enough for AF_UNIX paths (108 bytes)."""
    path = Path(run_dir) / "warm" / pool[:16]
    if len(str(path)) > 80:
        digest = hashlib.sha256(str(path).encode()).hexdigest()[:16]
        path = private_socket_dir() / "warm" / digest
    return path


def _recv_line(sock: socket.socket) -> dict[str, Any]:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("peer closed the connection")
        buf += chunk
    return json.loads(buf)  # type: ignore[no-any-return]


def _send_line(sock: socket.socket, message: Mapping[str, Any]) -> None:
    sock.sendall(json.dumps(message).encode() + b"\n")


class WarmClaim:
    """A client's hold on one warm worker for one job."""

    def __init__(self, sock: socket.socket, lock: IO[str], pid: int) -> None:
        self._sock, self._lock, self.pid = sock, lock, pid
        self.done = False

    def wait(self, timeout: float) -> bool:
        """True once the worker says the job ended (or the worker is gone); False on timeout."""
        if self.done:
            return True
        self._sock.settimeout(max(timeout, 0.0001))
        try:
            _recv_line(self._sock)
        except TimeoutError:
            return False
        except (OSError, ValueError):
            pass  # the worker died: the job's record (and the reaper) tell what happened
        self.close()
        return True

    def close(self) -> None:
        if not self.done:
            self.done = True
            self._sock.close()
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()


def claim_worker(directory: Path, job: str, env: Mapping[str, str]) -> WarmClaim | None:
    """Hand *job* to an idle worker of the pool, or return None when none is idle."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return None
    for name in sorted(names):
        if not name.endswith(".claim"):
            continue
        pid = int(name.split(".")[0])
        try:
            lock = open(directory / name)  # noqa: SIM115 - held for the job's duration
        except FileNotFoundError:
            continue  # it retired meanwhile
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue  # busy with another client's job
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(10)
            sock.connect(str(directory / f"{pid}.sock"))
            _send_line(sock, {"job": job, "env": dict(env)})
            reply = _recv_line(sock)
        except (OSError, ValueError):
            sock.close()
            fcntl.flock(lock, fcntl.LOCK_UN)
            lock.close()
            continue
        if reply.get("ok"):
            return WarmClaim(sock, lock, pid)
        sock.close()
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()
    return None


class WarmEndpoint:
    """The worker's side: wait for the next job, say when it is done, retire when idle."""

    def __init__(self, directory: Path) -> None:
        self._dir = Path(directory)
        self._pid = os.getpid()
        self._server: socket.socket | None = None
        self._conn: socket.socket | None = None

    def open(self) -> WarmEndpoint:
        self._dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        sock_path = self._dir / f"{self._pid}.sock"
        with contextlib.suppress(FileNotFoundError):
            sock_path.unlink()
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o077)
        try:
            server.bind(str(sock_path))
        finally:
            os.umask(old)
        server.listen(4)
        self._server = server
        (self._dir / f"{self._pid}.claim").touch()  # visible only once it listens
        return self

    def next_job(self, keep_alive: float, should_stop: Callable[[], bool] = lambda: False
                 ) -> tuple[str, dict[str, str]] | None:
        """Block until a client hands over a job; None once idle for *keep_alive* seconds, or
        when *should_stop* says so (a SIGTERM while idle retires the worker)."""
        if self._server is None:
            raise RuntimeError("endpoint is not open")
        deadline = time.monotonic() + keep_alive
        while True:
            left = deadline - time.monotonic()
            if should_stop():
                left = 0.0
            if left <= 0:
                if self._retire():
                    return None
                left = 1.0  # a client holds our claim and is about to connect
                deadline = time.monotonic() + left
            self._server.settimeout(min(left, 0.5))
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            try:
                conn.settimeout(10)
                request = _recv_line(conn)
                _send_line(conn, {"ok": True, "pid": self._pid,
                                  "start_ticks": start_ticks(self._pid)})
            except (OSError, ValueError):
                conn.close()
                continue
            self._conn = conn
            return str(request["job"]), dict(request.get("env") or {})

    def job_done(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(OSError):
                _send_line(self._conn, {"done": True})
            self._conn.close()
            self._conn = None

    def _retire(self) -> bool:
        claim = self._dir / f"{self._pid}.claim"
        with open(claim) as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            claim.unlink()
            (self._dir / f"{self._pid}.sock").unlink(missing_ok=True)
        self.close()
        return True

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        (self._dir / f"{self._pid}.claim").unlink(missing_ok=True)
        (self._dir / f"{self._pid}.sock").unlink(missing_ok=True)
