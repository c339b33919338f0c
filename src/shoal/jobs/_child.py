"""What every job process does first, however it was made (forked by the supervisor, by a
zygote, or as a warm executor): its own session, default signals, output into the job's pipe.

Runs in the job's interpreter: standard library only.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

__all__ = ["become_job_process", "limit_memory", "replace_environ", "run_and_exit"]


def become_job_process(out: int, close_fds: tuple[int, ...] = ()) -> None:
    """In a freshly forked child: a new session, default signals, stdin from /dev/null and
    stdout/stderr (unbuffered) into *out*, which is then closed, as are *close_fds*."""
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


def limit_memory(memory_mib: int | None) -> None:
    """The instance type's memory as an address-space limit (RLIMIT_AS)."""
    if memory_mib:
        import resource

        limit = int(memory_mib) * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def replace_environ(env: dict[str, str]) -> None:
    """Make os.environ equal *env*, touching only what differs (most of a job's environment
    equals its parent's, and each change is a putenv/unsetenv)."""
    for name in [k for k in os.environ if k not in env]:
        del os.environ[name]
    for name, value in env.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


def run_and_exit(body: Callable[[], int]) -> NoReturn:
    """In a forked child: run *body*, print what escapes it, flush, and leave with its code
    (70 when it raised) without ever returning into the code that forked us."""
    code = 70
    try:
        code = body()
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
