"""A warm executor: one persistent process that runs a warm pool's jobs one after another.

Forking a process per job costs ~6 ms here (fork, copy-on-write faults, exit); a warm pool's
executor runs each job in-process instead, then puts the process back as it found it: working
directory, environment, ``sys.path``, ``sys.argv`` and the modules the job imported. A job that
leaves what cannot be reset (module attributes it monkeypatched, threads it started, signal
handlers it changed) gets its result recorded as usual, and the executor is discarded: the next
job starts a fresh one. A job that crashes the process takes only that process with it.

Runs inside the job's interpreter: standard library, cloudpickle and shoal's in-job modules only.
Protocol on the control socket, per job: a JSON line ``{"workdir", "env", "pythonpath", "sizes"}``
followed by the four payload blobs (function and arguments, pickle and metadata); the answer, once
the job's output is flushed, is ``{"exit", "discard", "kind", "summary", "error", "sizes"}``
followed by the result's or exception's two blobs. No file is written for the hand-over.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import types
from json import dumps as _json_dumps  # bound now: a job may monkeypatch json
from json import loads as _json_loads
from typing import Any, NoReturn

from shoal.jobs._child import become_job_process, limit_memory, replace_environ

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
        replace_environ(self.environ)
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


def serve(ctrl: socket.socket, out: int, memory_mib: int | None = None) -> NoReturn:
    """In a freshly forked child: take jobs from *ctrl* until it closes or a job leaves a mess."""
    code = 0
    try:
        become_job_process(out)
        limit_memory(memory_mib)
        from shoal.jobs._entrypoint import execute
        from shoal.serialization import Payload

        snapshot = _Snapshot()
        reader = ctrl.makefile("rb")  # buffered: a header and its blobs may arrive together
        while line := reader.readline():
            request = _json_loads(line)
            blobs = [reader.read(n) for n in request["sizes"]]
            if any(len(b) != n for b, n in zip(blobs, request["sizes"], strict=True)):
                break  # the supervisor went away mid-request
            replace_environ(request.get("env") or {})
            # The key reaches the job through its environment; user code never sees it.
            key = os.environ.pop("SHOAL_JOB_KEY", "")
            os.chdir(os.environ.get("SHOAL_JOB_CWD") or request["workdir"])
            sys.path[:0] = [p for p in request.get("pythonpath") or [] if p not in sys.path]
            try:
                status, outcome = execute(Payload(blobs[0], blobs[1]), Payload(blobs[2], blobs[3]),
                                      key)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
            reason = snapshot.restore()
            reply: dict[str, Any] = {"exit": status, "discard": reason, "sizes": []}
            data = b""
            for kind in ("results", "exception"):
                if kind in outcome:
                    payload = outcome[kind]
                    reply.update(kind=kind, sizes=[len(payload.data), len(payload.metadata)])
                    data = payload.data + payload.metadata
            reply["summary"] = outcome.get("summary")
            reply["error"] = outcome.get("error")
            ctrl.sendall(_json_dumps(reply).encode() + b"\n" + data)
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
