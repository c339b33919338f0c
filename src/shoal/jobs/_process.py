"""Starting and watching the job's own process: forked from the supervisor, or exec'd.

Forking reuses the supervisor's clean, single-threaded interpreter (no Python start-up, no
cloudpickle import); exec runs another interpreter, such as an isolated environment's.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import io
import os
import resource
import signal
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

__all__ = ["ExecProcess", "ForkedProcess", "JobProcess", "killpg"]


class JobProcess:
    pid: int
    out_fd: int

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
        return cls(subprocess.Popen(
            [python, "-m", "shoal.jobs._entrypoint", str(workdir)],
            env=env, cwd=workdir, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
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
            code = 70
            try:
                os.close(r)
                code = _run_forked_child(workdir, env, limits, w, close_fds)
            except BaseException:
                traceback.print_exc()
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code)
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
    os.setsid()
    signal.set_wakeup_fd(-1)
    for fd in close_fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    os.close(devnull)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    limits()
    os.environ.clear()
    os.environ.update(env)
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    sys.path[:0] = extra
    os.chdir(workdir)
    from shoal.jobs._entrypoint import main as entry

    return entry([str(workdir)])


def killpg(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


_LIBC: Any = None


def _libc() -> Any:
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None)
    return _LIBC


def _limits(memory_mib: int | None) -> Any:
    libc = _libc()  # loaded in the parent: a forked child pays nothing for it

    def apply() -> None:
        # Die with the supervisor: a job never outlives the process that records its end.
        with contextlib.suppress(OSError, AttributeError):
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if memory_mib:
            limit = memory_mib * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return apply
