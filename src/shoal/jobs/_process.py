"""Starting and watching the job's own process: forked from the supervisor, or exec'd.

Forking reuses the supervisor's clean, single-threaded interpreter (no Python start-up, no
cloudpickle import); exec runs another interpreter, such as an isolated environment's.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal._internal.private import restore_client_umask
from shoal.jobs._child import become_job_process, replace_environ, run_and_exit

if TYPE_CHECKING:
    import socket

__all__ = ["ExecProcess", "ForkedProcess", "JobProcess", "killpg"]


class JobProcess:
    pid: int
    out_fd: int

    def extra_fds(self) -> tuple[int, ...]:
        return ()

    def finish(self) -> None:
        """After the job: kill what is left of its process group and close its output."""
        killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.close(self.out_fd)

    def poll(self) -> int | None:
        raise NotImplementedError

    def wait(self) -> int:
        raise NotImplementedError


class ExecProcess(JobProcess):
    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._p = popen
        self.pid = popen.pid
        if popen.stdout is None:  # Popen(stdout=PIPE) always sets it
            raise RuntimeError("job process has no output pipe")
        self.out_fd = os.dup(popen.stdout.fileno())
        popen.stdout.close()

    @classmethod
    def start(cls, python: str, workdir: Path, env: dict[str, str],
              memory_mib: int | None) -> ExecProcess:
        return cls.run([python, "-m", "shoal.jobs._entrypoint", str(workdir)], cwd=workdir,
                       env=env, memory_mib=memory_mib)

    @classmethod
    def run(cls, argv: list[str], *, cwd: Path, env: dict[str, str],
            memory_mib: int | None) -> ExecProcess:
        """Any command as the job's process: its own session, output and errors on one pipe."""
        return cls(subprocess.Popen(
            argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=_limits(memory_mib)))  # noqa: PLW1509 - the supervisor is single-threaded

    def poll(self) -> int | None:
        return self._p.poll()

    def wait(self) -> int:
        return self._p.wait()


class ForkedProcess(JobProcess):
    def __init__(self, pid: int, out_fd: int) -> None:
        self.pid, self.out_fd = pid, out_fd
        self._rc: int | None = None

    @classmethod
    def start(cls, workdir: Path, env: dict[str, str], memory_mib: int | None,
              close_fds: tuple[int, ...]) -> ForkedProcess:
        r, w = os.pipe()
        limits = _limits(memory_mib)
        gc.freeze()  # long-lived objects stay out of the child's collections: fewer copied pages
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child; its effects are tested
            os.close(r)
            run_and_exit(lambda: _run_forked_child(workdir, env, limits, w, close_fds))
        os.close(w)
        return cls(pid, r)

    def poll(self) -> int | None:
        if self._rc is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self._rc = os.waitstatus_to_exitcode(status)
        return self._rc

    def wait(self) -> int:
        if self._rc is None:
            _, status = os.waitpid(self.pid, 0)
            self._rc = os.waitstatus_to_exitcode(status)
        return self._rc


def _run_forked_child(workdir: Path, env: dict[str, str], limits: Any, out: int,
                      close_fds: tuple[int, ...]) -> int:
    become_job_process(out, close_fds)
    limits()
    replace_environ(env)
    restore_client_umask(env)
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    sys.path[:0] = extra
    os.chdir(workdir)
    from shoal.jobs._entrypoint import main as entry

    return entry([str(workdir)])


def killpg(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


_LIBC: ctypes.CDLL | None = None


def _libc() -> ctypes.CDLL:
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None)
    return _LIBC


def _limits(memory_mib: int | None) -> Callable[[], None]:
    libc = _libc()  # loaded in the parent: a forked child pays nothing for it

    def apply() -> None:
        restore_client_umask(os.environ)  # the supervisor's is 077; the job gets its client's
        # Die with the supervisor: a job never outlives the process that records its end.
        with contextlib.suppress(OSError, AttributeError):
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if memory_mib:
            limit = memory_mib * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return apply


class _ReportedExit(JobProcess):
    """A process whose end is told on a socket: ``_read(block)`` sets ``_rc`` once it is."""

    _rc: int | None

    def _read(self, block: bool) -> None:
        raise NotImplementedError

    def poll(self) -> int | None:
        if self._rc is None:
            self._read(block=False)
        return self._rc

    def wait(self) -> int:
        while self._rc is None:
            self._read(block=True)
        return self._rc


class ZygoteProcess(_ReportedExit):
    """A job forked by a zygote (``_zygote.py``); its end is reported over the connection."""

    def __init__(self, sock: Any, pid: int, out_fd: int) -> None:
        self._sock, self.pid, self.out_fd = sock, pid, out_fd
        self._rc: int | None = None
        self._buf = b""

    @classmethod
    def start(cls, sock_path: str, request: dict[str, Any]) -> ZygoteProcess:
        import json
        import socket

        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(30)
            sock.connect(sock_path)
            sock.sendall(json.dumps(request).encode() + b"\n")
            msg, fds, _flags, _addr = socket.recv_fds(sock, 65536, 1)
            if not fds:
                raise OSError(f"the zygote at {sock_path} sent no output pipe")
            pid = int(json.loads(msg.split(b"\n")[0])["pid"])
        except (OSError, ValueError, KeyError):
            sock.close()
            raise
        return cls(sock, pid, fds[0])

    def _read(self, block: bool) -> None:
        import json

        self._sock.setblocking(block)
        try:
            while not self._buf.endswith(b"\n"):
                chunk = self._sock.recv(4096)
                if not chunk:  # the zygote died: its job went with it
                    self._rc = -int(signal.SIGKILL)
                    return
                self._buf += chunk
        except (BlockingIOError, InterruptedError):
            return
        self._rc = int(json.loads(self._buf)["exit"])
        self._sock.close()


def ensure_zygote(python: str, pythonpath: tuple[str, ...], run_dir: Path,
                  idle_seconds: float) -> str:
    """The socket of a zygote for *python* (started if none answers); shared by jobs."""
    import fcntl
    import hashlib
    import socket
    import time

    digest = hashlib.sha256(f"{python}|{'|'.join(pythonpath)}".encode()).hexdigest()[:16]
    path = str(run_dir / f"z-{digest}.sock")
    if len(path) > 100:  # AF_UNIX paths are limited to 108 bytes
        from shoal.backends.rundir import private_socket_dir

        base = private_socket_dir()
        path = str(base / f"z-{hashlib.sha256(path.encode()).hexdigest()[:16]}.sock")

    def answers() -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            try:
                s.connect(path)
            except OSError:
                return False
            return True  # an empty connection is dropped by the zygote

    if os.path.exists(path) and answers():
        return path
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / f"z-{digest}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(path) and answers():
            return path
        env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.pathsep.join(pythonpath),
               "PYTHONUNBUFFERED": "1"}
        with open(run_dir / f"z-{digest}.log", "ab") as log:
            done = subprocess.run([python, "-m", "shoal.jobs._zygote", path, str(idle_seconds)],
                                  env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=log, start_new_session=True, timeout=60, check=False)
        pid = int(done.stdout.split()[0]) if done.stdout.strip() else 0
        (run_dir / f"z-{digest}.pid").write_text(str(pid))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if os.path.exists(path):
                return path
            if not pid or not os.path.exists(f"/proc/{pid}"):
                break
            time.sleep(0.005)  # bounded poll on a process starting up
        tail = (run_dir / f"z-{digest}.log").read_text(errors="replace")[-2000:]
        raise OSError(f"the zygote for {python} did not start; its log ends with:\n{tail}")



class WarmExecutor:
    """A persistent process that runs a warm pool's jobs in-process (``_executor.py``)."""

    def __init__(self, pid: int, ctrl: socket.socket, out_fd: int, memory_mib: int | None
                 ) -> None:
        self.pid, self._ctrl, self.out_fd = pid, ctrl, out_fd
        self._memory = memory_mib
        self.alive = True
        self._closed = False

    @classmethod
    def start(cls, memory_mib: int | None, close_fds: tuple[int, ...]) -> WarmExecutor:
        import socket

        parent, child = socket.socketpair()
        r, w = os.pipe()
        limits = _limits(None)  # only the parent-death signal: the executor sets its memory
        gc.freeze()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the executor's own process
            def body() -> int:
                parent.close()
                os.close(r)
                for fd in close_fds:
                    with contextlib.suppress(OSError):
                        os.close(fd)
                limits()
                from shoal.jobs._executor import serve

                serve(child, w, memory_mib)  # never returns

            run_and_exit(body)
        child.close()
        os.close(w)
        os.set_blocking(r, False)
        return cls(pid, parent, r, memory_mib)

    def usable(self, memory_mib: int | None) -> bool:
        return self.alive and memory_mib == self._memory

    @property
    def ctrl(self) -> socket.socket:
        """The control socket: requests go out on it and answers come back (batches)."""
        return self._ctrl

    def run(self, workdir: Path, env: dict[str, str], blobs: list[bytes]) -> ExecutorJob:
        """Hand over one job: its payloads travel on the socket, not through files."""
        import json

        pythonpath = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        header = json.dumps({"workdir": str(workdir), "env": env, "pythonpath": pythonpath,
                             "sizes": [len(b) for b in blobs]}).encode() + b"\n"
        self._ctrl.setblocking(True)
        self._ctrl.sendall(header + b"".join(blobs))
        return ExecutorJob(self)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.alive = False
            killpg(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            self._ctrl.close()
            with contextlib.suppress(OSError):
                os.close(self.out_fd)


class ExecutorJob(_ReportedExit):
    """One job inside a WarmExecutor; it ends when the executor says so, or dies."""

    def __init__(self, executor: WarmExecutor) -> None:
        self._ex = executor
        self.pid, self.out_fd = executor.pid, executor.out_fd
        self._rc: int | None = None
        self._buf = b""
        #: The executor's answer: exit code, outcome kind, summary, and the result's blobs.
        self.inline: dict[str, Any] | None = None

    def extra_fds(self) -> tuple[int, ...]:
        return (self._ex._ctrl.fileno(),)

    def _read(self, block: bool) -> None:
        import json

        sock = self._ex._ctrl
        sock.setblocking(block)
        try:
            while b"\n" not in self._buf:
                chunk = sock.recv(65536)
                if not chunk:  # the executor died with the job (killed, or os._exit)
                    self._died()
                    return
                self._buf += chunk
        except (BlockingIOError, InterruptedError):
            return
        line, rest = self._buf.split(b"\n", 1)
        reply = json.loads(line)
        sock.setblocking(True)  # the blobs follow the header at once
        need = sum(reply.get("sizes") or [])
        while len(rest) < need:
            chunk = sock.recv(max(65536, need - len(rest)))
            if not chunk:
                self._died()
                return
            rest += chunk
        self.inline = reply
        sizes = reply.get("sizes") or []
        if sizes:
            reply["payload"] = (rest[:sizes[0]], rest[sizes[0]:sizes[0] + sizes[1]])
        self._rc = int(reply["exit"])
        if reply.get("discard"):  # it exits by itself; finish() reaps it after the drain
            sys.stderr.write(f"[shoal] warm executor discarded: {reply['discard']}\n")
            self._ex.alive = False

    def _died(self) -> None:
        _, status = os.waitpid(self._ex.pid, 0)
        self._rc = os.waitstatus_to_exitcode(status)
        self._ex.alive = False

    def finish(self) -> None:
        if not self._ex.alive:
            self._ex.close()
