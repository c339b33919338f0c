"""A warm executor: one persistent process that runs a warm pool's jobs one after another.

Forking a process per job costs ~6 ms here (fork, copy-on-write faults, exit); a warm pool's
executor runs each job in-process instead, then puts the process back as it found it: working
directory, environment, ``sys.path``, ``sys.argv`` and the modules the job imported. A job that
leaves what cannot be reset (module attributes it monkeypatched, threads it started, signal
handlers it changed) gets its result recorded as usual, and the executor is discarded: the next
job starts a fresh one. A job that crashes the process takes only that process with it.

Runs inside the job's interpreter: standard library, cloudpickle and shoal's in-job modules only.
Protocol on the control socket: one JSON line per job ``{"workdir", "env", "pythonpath"}``
answered by ``{"exit": code, "discard": reason-or-null}`` once its output is flushed.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import socket
import sys
import threading
import types
from json import dumps as _json_dumps  # bound now: a job may monkeypatch json
from json import loads as _json_loads
from typing import Any, NoReturn

__all__ = ["serve"]

_DIRTY: set[str] = set()


class _TrackedModule(types.ModuleType):
    """Records attribute assignments on modules that were loaded before the first job."""

    def __setattr__(self, name: str, value: Any) -> None:
        _DIRTY.add(self.__name__)
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        _DIRTY.add(self.__name__)
        super().__delattr__(name)


class _Snapshot:
    def __init__(self) -> None:
        self.cwd = os.getcwd()
        self.environ = dict(os.environ)
        self.path = list(sys.path)
        self.argv = list(sys.argv)
        self.modules = set(sys.modules)
        self.handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT,
                                                          signal.SIGHUP, signal.SIGUSR1)}
        for module in list(sys.modules.values()):
            if type(module) is types.ModuleType:
                with contextlib.suppress(TypeError):
                    module.__class__ = _TrackedModule

    def restore(self) -> str | None:
        """Undo what can be undone; return why the process must be discarded, or None."""
        os.chdir(self.cwd)
        _replace_environ(self.environ)
        sys.path[:] = self.path
        sys.argv[:] = self.argv
        for name in set(sys.modules) - self.modules:
            del sys.modules[name]
        if _DIRTY:
            return f"the job changed attributes of module(s) {', '.join(sorted(_DIRTY))}"
        if threading.active_count() > 1:
            return "the job left threads running"
        if any(signal.getsignal(s) != h for s, h in self.handlers.items()):
            return "the job changed signal handlers"
        return None


def _replace_environ(env: dict[str, str]) -> None:
    for name in [k for k in os.environ if k not in env]:
        del os.environ[name]
    for name, value in env.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


def _recv_line(sock: socket.socket) -> bytes:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = sock.recv(1 << 20)
        if not chunk:
            return b""
        buf += chunk
    return buf


def serve(ctrl: socket.socket, out: int, memory_mib: int | None = None) -> NoReturn:
    """In a freshly forked child: take jobs from *ctrl* until it closes or a job leaves a mess."""
    code = 0
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
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
        if memory_mib:
            import resource

            limit = memory_mib * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        from shoal.jobs._entrypoint import main as entry

        snapshot = _Snapshot()
        while line := _recv_line(ctrl):
            request = _json_loads(line)
            _replace_environ(request.get("env") or {})
            sys.path[:0] = [p for p in request.get("pythonpath") or [] if p not in sys.path]
            try:
                status = entry([request["workdir"]])
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
            reason = snapshot.restore()
            ctrl.sendall(_json_dumps({"exit": status, "discard": reason}).encode() + b"\n")
            if reason is not None:
                break
    except BaseException:  # never return into the code that forked us
        import traceback

        traceback.print_exc()
        code = 70
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
