"""The local backend: each job gets a detached supervisor process on this machine.

Supervisors are forked by the launcher (``_launcher.py``) or, in ``spawn`` mode, started as
fresh interpreters. Either way they are session leaders that outlive the client.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from shoal._internal.private import CLIENT_UMASK_VAR, client_umask
from shoal.backends._launcher import launcher_lock_path
from shoal.backends._warm import (
    WarmEndpoint,
    _recv_line,
    _send_line,
    claim_worker,
    pool_dir,
    take_request,
)
from shoal.backends.procfs import process_state, start_ticks
from shoal.backends.rundir import private_socket_dir
from shoal.core.ports import ExecContext, LaunchInfo
from shoal.errors import LaunchError

__all__ = ["LocalBackend"]

LaunchMode = Literal["forkserver", "spawn"]


def _code_fingerprint() -> str:
    """Changes when shoal's code changes, so a launcher never runs stale modules."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256(f"{sys.executable}|{root}".encode())
    for path in sorted(root.rglob("*.py")):
        st = path.stat()
        h.update(f"{path}:{st.st_mtime_ns}:{st.st_size}".encode())
    return h.hexdigest()[:16]


class LocalBackend:
    name = "local"

    def __init__(self, run_dir: Path, *, mode: LaunchMode = "forkserver",
                 idle_seconds: float = 600.0, preload: tuple[str, ...] = ()) -> None:
        self._run_dir = Path(run_dir)
        self._mode = mode
        self._idle = idle_seconds
        self._preload = preload
        self._fingerprint: str | None = None

    @property
    def mode(self) -> LaunchMode:
        return self._mode

    # --- launching --------------------------------------------------------------------

    def check_submission(self, env: Mapping[str, str]) -> None:
        """Nothing to check: supervisors run on this machine, which reaches its own stores."""

    def launch(self, ctx: ExecContext) -> LaunchInfo:
        pool = self._pool(ctx.pool) if ctx.pool else None
        env = {**ctx.env, CLIENT_UMASK_VAR: f"{client_umask():03o}"}
        if pool:
            request: dict[str, Any] = {"job": ctx.job, "env": env}
            if ctx.batch:
                request["batch"] = list(ctx.batch)
                if ctx.take is not None:
                    request["take"] = take_request(ctx.take)
            claim = claim_worker(pool_dir(self._run_dir, pool), request)
            if claim is not None:
                return LaunchInfo("local", claim.pid, socket.gethostname(),
                                  claim.start_ticks or start_ticks(claim.pid), waiter=claim)
        log_path = str(self._run_dir / "supervisors" / f"{ctx.job}.log")
        os.makedirs(os.path.dirname(log_path), mode=0o700, exist_ok=True)
        if pool:  # the supervisor stays to serve the pool after this job
            env["SHOAL_WARM_POOL_DIR"] = str(pool_dir(self._run_dir, pool))
            env["SHOAL_KEEP_ALIVE_SECONDS"] = str(ctx.keep_alive_seconds)
        if self._mode == "spawn":
            return self._spawn(ctx, env, log_path)
        request = {"entrypoint": ctx.entrypoint, "args": list(ctx.args), "env": env,
                   "cwd": ctx.cwd, "log_path": log_path, "prepare": ctx.prepare}
        reply = self._request(request)
        if "error" in reply:
            raise LaunchError(f"launcher refused job {ctx.job!r}: {reply['error']}", job=ctx.job)
        return LaunchInfo("local", int(reply["pid"]), socket.gethostname(), reply.get("start_ticks"))

    def _spawn(self, ctx: ExecContext, env: dict[str, str], log_path: str) -> LaunchInfo:
        pid = _start_detached(
            [sys.executable, "-m", "shoal.backends._launcher", "run", ctx.entrypoint, *ctx.args],
            log_path, env=env, cwd=ctx.cwd, what=f"the supervisor of job {ctx.job!r}")
        return LaunchInfo("local", pid, socket.gethostname(), start_ticks(pid))

    def _pool(self, key: str) -> str:
        """A pool is also keyed by shoal's code: a worker never runs jobs of another version."""
        if self._fingerprint is None:
            self._fingerprint = _code_fingerprint()
        return hashlib.sha256(f"{key}|{self._fingerprint}".encode()).hexdigest()

    def launcher_socket_path(self) -> str:
        """The Unix socket of this home's launcher for this code version (under the run
        directory, or a private directory when that path is too long for AF_UNIX)."""
        if self._fingerprint is None:
            self._fingerprint = _code_fingerprint()
        path = str(self._run_dir / f"launcher-{self._fingerprint}.sock")
        if len(path) > 100:  # AF_UNIX paths are limited to 108 bytes
            digest = hashlib.sha256(path.encode()).hexdigest()[:20]
            path = str(private_socket_dir() / f"{digest}.sock")
        return path

    def _request(self, request: Mapping[str, Any]) -> dict[str, Any]:
        path = self.launcher_socket_path()
        for attempt in range(3):
            try:
                return _send(path, request)
            except (FileNotFoundError, ConnectionRefusedError):
                # No launcher, or one that just exited after its idle period: start one.
                self._start_launcher(path)
            except OSError as e:
                if attempt == 2:
                    raise LaunchError(f"cannot reach the launcher at {path}: {e}") from e
        raise LaunchError(f"the launcher at {path} did not accept the job; see "
                          f"{self._run_dir / 'launcher.log'}")

    def _start_launcher(self, path: str) -> None:
        """Start this home's launcher unless one answers. Starters take turns on a lock, and
        a launcher holds its own lock while it runs (``_launcher.py``): one that holds it
        but does not answer yet is waited for, never doubled."""
        self._run_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self._run_dir, 0o700)
        log_path = self._run_dir / "launcher.log"
        with os.fdopen(os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o600), "r+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if _answers(path):
                return  # another client started it while we waited for the lock
            deadline = time.monotonic() + 60
            while _launcher_running(path):  # starting up, or on its way out after idling
                if _answers(path):
                    return
                if time.monotonic() >= deadline:
                    raise LaunchError(f"the launcher holding {launcher_lock_path(path)} does "
                                      f"not answer on {path}; see {log_path}")
                time.sleep(0.01)  # bounded poll on another process
            pid = _start_detached(
                [sys.executable, "-m", "shoal.backends._launcher", "serve", path,
                 str(self._idle), *self._preload],
                str(log_path), env=_launcher_env(), cwd=None, what="the launcher")
            while time.monotonic() < deadline + 60:
                if _answers(path):
                    return
                if process_state(pid) in (None, "Z", "X"):
                    tail = log_path.read_text(errors="replace")[-2000:]
                    raise LaunchError(f"the launcher (pid {pid}) exited while starting; its log "
                                      f"({log_path}) ends with:\n{tail}")
                time.sleep(0.01)  # bounded poll on an external process starting up
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            raise LaunchError(f"the launcher did not start within 60 s; see {log_path}")

    def shutdown_launcher(self) -> None:
        """Stop this home's launcher and zygotes now (tests; otherwise they idle out)."""
        path = self.launcher_socket_path()
        with contextlib.suppress(OSError, ValueError):
            pid = int(_send(path, {"op": "ping"})["pid"])
            os.kill(pid, signal.SIGTERM)
        for pid_file in self._run_dir.glob("z-*.pid"):
            with contextlib.suppress(OSError, ValueError):
                pid = int(pid_file.read_text())
                # Only a zygote: the pid may have been reused since that zygote idled out.
                if b"shoal.jobs._zygote" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGTERM)
            pid_file.unlink(missing_ok=True)

    # --- observing and stopping -------------------------------------------------------

    def warm_endpoint(self, directory: str, *, busy: bool = False) -> WarmEndpoint:
        """The worker's side of a warm pool (used by a supervisor that stays warm); *busy*:
        see ``WarmEndpoint.open``."""
        return WarmEndpoint(Path(directory), run_dir=self._run_dir).open(busy=busy)

    def is_alive(self, handle: Mapping[str, Any]) -> bool | None:
        pid = handle.get("pid")
        if not pid:
            return None
        if handle.get("host") not in (None, socket.gethostname()):
            return None
        state = process_state(int(pid))
        if state is None or state in ("Z", "X"):
            return False
        ticks = handle.get("start_ticks")
        return ticks is None or start_ticks(int(pid)) == ticks

    def signal_stop(self, handle: Mapping[str, Any]) -> None:
        if self.is_alive(handle):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(handle["pid"]), signal.SIGTERM)

    def close(self) -> None:
        """Nothing to release: supervisors and the launcher are detached on purpose."""


def _start_detached(argv: list[str], log_path: str, *, env: dict[str, str], cwd: str | None,
                    what: str) -> int:
    """Run *argv* (which forks and prints the daemon's pid), reap it, return the daemon pid."""
    with os.fdopen(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as log:
        try:
            done = subprocess.run(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=log, start_new_session=True,
                                  timeout=60, check=False)
        except (OSError, subprocess.SubprocessError) as e:
            raise LaunchError(f"cannot start {what}: {e}") from e
    try:
        return int(done.stdout.split()[0])
    except (IndexError, ValueError):
        raise LaunchError(f"cannot start {what} (exit code {done.returncode}); see {log_path}",
                          log=log_path) from None


def _answers(path: str) -> bool:
    """A launcher listens on *path* and answers a ping."""
    try:
        return bool(_send(path, {"op": "ping"}).get("ok"))
    except (OSError, ValueError):
        return False


def _launcher_running(path: str) -> bool:
    """A live process holds the launcher's lifetime lock of *path*."""
    try:
        fd = os.open(launcher_lock_path(path), os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # also releases our own test lock at once
    return False


def _launcher_env() -> dict[str, str]:
    # Each request carries its job's environment; the launcher itself keeps no SHOAL_* state.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    return env


def _send(path: str, request: Mapping[str, Any]) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(path)
        _send_line(s, request)
        try:
            return _recv_line(s)
        except ConnectionError as e:  # a launcher on its way out: start another
            raise ConnectionRefusedError("launcher closed the connection") from e
