"""A zygote: a small, warm process of a job's interpreter that forks one child per job.

An isolated environment's interpreter would otherwise start, and import cloudpickle, for
every job (~60 ms here). The zygote does that once, then forks each job from its clean,
single-threaded state: the job gets a fresh process (nothing leaks between jobs) in about a
millisecond. It imports only the standard library, cloudpickle and shoal's in-job modules.

Protocol, one Unix-socket connection per job: the supervisor sends one JSON line
``{"workdir", "env", "cwd", "memory_mib", "pythonpath"}``; the zygote answers ``{"pid"}`` with
the read end of the job's output pipe attached (SCM_RIGHTS), and ``{"exit": code}`` (a negative
code is a signal) when the job's process ends. The zygote exits after an idle period.

The zygote and each job it forks are child subreapers (``_descendants.py``): what a job
starts stays its own while it runs, comes to the zygote when it ends, and the zygote ends it
then (SIGTERM, then SIGKILL after the job's ``grace_seconds``), so nothing a job started
outlives it, even a process that left its session.

    python -m shoal.jobs._zygote SOCKET IDLE_SECONDS
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import selectors
import signal
import socket
import sys
import time
from typing import TYPE_CHECKING, Any, cast

from shoal._internal.private import restore_client_umask
from shoal.jobs._child import (
    become_job_process,
    limit_memory,
    replace_environ,
    run_and_exit,
)
from shoal.jobs._descendants import _children, become_subreaper, descendants

if TYPE_CHECKING:
    from types import FrameType

_GRACE_S = 10.0  # until a request says otherwise

__all__ = ["main"]


def _child(request: dict[str, Any], out: int) -> int:
    become_job_process(out)
    become_subreaper()  # keeps what the job starts (and orphans) its own until it ends
    limit_memory(request.get("memory_mib"))
    replace_environ(request.get("env") or {})
    restore_client_umask(request.get("env") or {})
    sys.path[:0] = [p for p in request.get("pythonpath") or [] if p not in sys.path]
    os.chdir(request["workdir"])
    from shoal.jobs._entrypoint import main as entry

    return entry([request["workdir"]])


class _Zygote:
    def __init__(self, sock_path: str, idle: float) -> None:
        self._path = sock_path
        self._idle = idle
        self._jobs: dict[int, socket.socket] = {}  # child pid -> its supervisor's connection
        self._sel = selectors.DefaultSelector()
        self._own_fds: list[int] = []
        self._grace = _GRACE_S
        self._leftovers: dict[int, float] = {}  # what ended jobs left -> when to SIGKILL it

    def serve(self) -> int:
        from shoal.serialization import warm_up

        warm_up()
        become_subreaper()  # what an ended job left comes to us (_end_leftovers)
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        os.set_blocking(wake_r, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, _exit_on_term)  # so the socket is removed on the way out
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o077)
        try:
            server.bind(self._path + ".tmp")
        finally:
            os.umask(old)
        server.listen(64)  # listening before the name appears: no client is ever refused
        os.rename(self._path + ".tmp", self._path)
        self._sel.register(server, selectors.EVENT_READ, "accept")
        self._own_fds = [server.fileno(), wake_r, wake_w]
        self._sel.register(wake_r, selectors.EVENT_READ, "child")
        gc.freeze()
        try:
            while True:
                events = self._sel.select(self._timeout())
                if not events and not self._jobs and not self._leftovers:
                    return 0
                for key, _ in events:
                    if key.data == "accept":
                        conn, _ = server.accept()
                        self._start(conn)
                    elif isinstance(key.data, int):
                        # registered with its supervisor's pid: a job's socket
                        self._supervisor_gone(key.data, cast(socket.socket, key.fileobj))
                    else:
                        with contextlib.suppress(BlockingIOError):
                            os.read(wake_r, 4096)
                self._reap()
                self._end_leftovers()
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path)
            server.close()

    def _start(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(10)
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = conn.recv(1 << 20)
                if not chunk:
                    raise ConnectionError("closed")
                buf += chunk
            request = json.loads(buf)
        except (OSError, ValueError):
            conn.close()
            return
        grace = request.get("grace_seconds")
        if isinstance(grace, int | float) and grace >= 0:
            self._grace = float(grace)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the job's own process
            def body() -> int:
                conn.close()
                os.close(r)
                # Nothing of the zygote's stays open in the job: not its listening socket, not
                # other jobs' connections (their supervisors must see EOF if the zygote dies).
                self._sel.close()
                for other in self._jobs.values():
                    other.close()
                for fd in self._own_fds:
                    with contextlib.suppress(OSError):
                        os.close(fd)
                return _child(request, w)

            run_and_exit(body)
        os.close(w)
        try:
            socket.send_fds(conn, [json.dumps({"pid": pid}).encode() + b"\n"], [r])
        except OSError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        finally:
            os.close(r)
        self._jobs[pid] = conn
        # A supervisor that goes away (killed) takes its job with it: watch its connection.
        self._sel.register(conn, selectors.EVENT_READ, pid)

    def _supervisor_gone(self, pid: int, conn: socket.socket) -> None:
        try:
            data = conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # EOF: nobody will record this job's end, so it must not run on
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            self._sel.unregister(conn)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self._leftovers.pop(pid, None)
            conn = self._jobs.pop(pid, None)
            if conn is not None:
                with contextlib.suppress(KeyError, ValueError):
                    self._sel.unregister(conn)
                with contextlib.suppress(OSError):
                    code = os.waitstatus_to_exitcode(status)
                    conn.sendall(json.dumps({"exit": code}).encode() + b"\n")
                conn.close()

    def _timeout(self) -> float | None:
        if self._leftovers:
            return max(0.01, min(self._leftovers.values()) - time.monotonic())
        return None if self._jobs else self._idle

    def _end_leftovers(self) -> None:
        """A child we did not fork was adopted from a job that ended (each job keeps its own
        orphans while it runs): SIGTERM it and what it started, SIGKILL after the grace."""
        now = time.monotonic()
        for kid in _children(os.getpid()) or ():
            if kid in self._jobs:
                continue
            if kid not in self._leftovers:
                self._leftovers[kid] = now + self._grace
                sig = signal.SIGTERM
            elif now >= self._leftovers[kid]:
                sig = signal.SIGKILL
                self._leftovers[kid] = now + 1.0  # again in a second, until it is reaped
            else:
                continue
            for pid in (kid, *descendants(kid)):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)


def _exit_on_term(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    pid = os.fork()  # detach: the starter reaps this parent at once; init adopts the zygote
    if pid:
        sys.stdout.write(f"{pid}\n")
        sys.stdout.flush()
        os._exit(0)
    os.dup2(2, 1)
    return _Zygote(args[0], float(args[1])).serve()


if __name__ == "__main__":
    sys.exit(main())
