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
followed by the result's or exception's two blobs. No file is written for the hand-over. A batch
(many jobs calling one function) opens with ``{"batch", "function"}`` and the function's pickle,
then takes its calls a few at a time; each call is answered as it ends (``_serve_batch``).
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import socket
import sys
import threading
import time
import types
from typing import Any, NoReturn

from shoal._internal.jsoncodec import dumps as _json_dumps  # a job may monkeypatch json
from shoal._internal.jsoncodec import loads as _json_loads
from shoal._internal.private import restore_client_umask
from shoal.jobs._child import become_job_process, limit_memory, replace_environ

__all__ = ["serve"]

_DIRTY: set[str] = set()
#: The modules the snapshot tracks (id -> module, which keeps the ids valid).
_TRACKED: dict[int, types.ModuleType] = {}
#: Submodules a job imported, set as attributes of a tracked package: (package, name).
_ADDED: list[tuple[types.ModuleType, str]] = []


class _TrackedModule(types.ModuleType):
    """Records attribute assignments on modules that were loaded before the first job.

    ``sys`` is one of them, and the import system makes every new module with ``type(sys)``
    (``importlib._bootstrap._new_module``): modules a job imports are instances of this
    class too, and their own attributes (``__spec__``, ``__file__``, ...) are not counted:
    those modules are forgotten after the job. Nor is a submodule the job imported being
    bound on its tracked package (``import json.tool`` sets ``json.tool``): that binding is
    undone with the submodule.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if id(self) in _TRACKED:
            if _new_submodule(self, name, value):
                _ADDED.append((self, name))
            else:
                _DIRTY.add(self.__name__)
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        if id(self) in _TRACKED:
            _DIRTY.add(self.__name__)
        super().__delattr__(name)


def _is_extension(module: object) -> bool:
    """Whether *module* was loaded from a compiled extension (numpy's ``_multiarray_umath``,
    ...): such a module cannot be loaded a second time in one process."""
    import importlib.machinery

    spec = getattr(module, "__spec__", None)
    return isinstance(getattr(spec, "loader", None), importlib.machinery.ExtensionFileLoader)


def _new_submodule(package: types.ModuleType, name: str, value: Any) -> bool:
    """Whether ``package.name = value`` binds a submodule imported just now, for the first
    time (the import system's own step after loading ``package.name``)."""
    return (isinstance(value, types.ModuleType) and id(value) not in _TRACKED
            and getattr(value, "__name__", None) == f"{package.__name__}.{name}"
            and name not in package.__dict__)


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
                    _TRACKED[id(module)] = module

    def restore(self, *, environ: bool = True) -> str | None:
        """Undo what can be undone; return why the process must be discarded, or None.
        (*environ*: False leaves the environment to the caller, which sets the next job's.)"""
        os.chdir(self.cwd)
        if environ:
            replace_environ(self.environ)
        sys.path[:] = self.path
        sys.argv[:] = self.argv
        added = sys.modules.keys() - self.modules
        native = sorted(n for n in added if _is_extension(sys.modules.get(n)))
        for name in added:
            del sys.modules[name]
        while _ADDED:  # the submodules just forgotten leave their packages as they were
            package, attr = _ADDED.pop()
            if f"{package.__name__}.{attr}" in self.modules:
                _DIRTY.add(package.__name__)  # a module the snapshot had: not the job's
            else:
                package.__dict__.pop(attr, None)
        if _DIRTY:
            return f"the job changed attributes of module(s) {', '.join(sorted(_DIRTY))}"
        if native:  # forgotten, they could not be imported again in this process
            shown = ", ".join(native[:5]) + (", ..." if len(native) > 5 else "")
            return f"the job imported extension module(s) {shown}, which load once per process"
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
        restore_client_umask(os.environ)
        limit_memory(memory_mib)
        snapshot = _Snapshot()
        inbox = _Inbox(ctrl)
        while (line := inbox.line()) is not None:
            request = _json_loads(line)
            if "batch" in request:
                reason = _serve_batch(request, inbox, ctrl, snapshot)
            else:
                reason = _serve_one(request, inbox, ctrl, snapshot)
            if reason is not None:
                break
    except _Gone:
        pass  # the supervisor went away mid-request
    except BaseException:  # never return into the code that forked us
        import traceback

        traceback.print_exc()
        code = 70
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _serve_one(request: dict[str, Any], inbox: _Inbox, ctrl: socket.socket,
               snapshot: _Snapshot) -> str | None:
    from shoal.jobs._entrypoint import execute
    from shoal.serialization import Payload

    blobs = [inbox.take(n) for n in request["sizes"]]
    replace_environ(request.get("env") or {})
    # The key reaches the job through its environment; user code never sees it.
    key = os.environ.pop("SHOAL_JOB_KEY", "")
    os.chdir(os.environ.get("SHOAL_JOB_CWD") or request["workdir"])
    sys.path[:0] = [p for p in request.get("pythonpath") or [] if p not in sys.path]
    try:
        status, outcome = execute(Payload(blobs[0], blobs[1]), Payload(blobs[2], blobs[3]), key)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    reason = snapshot.restore()
    ctrl.sendall(_reply({"exit": status, "discard": reason}, outcome))
    return reason


def _serve_batch(request: dict[str, Any], inbox: _Inbox, ctrl: socket.socket,
                 snapshot: _Snapshot) -> str | None:
    """Run a batch's calls in order, each as its own job, until the supervisor says ``end``.

    After the opening request (``{"batch": ..., "function": n}`` and the function's pickle),
    the supervisor sends ``{"calls": [...], "sizes": [...]}`` (three blobs per call) a few
    calls ahead, ``{"skip": [i...]}`` for calls it stopped (answered ``skipped``), and
    ``{"end": true}``. Before each call a marker goes into the output
    (``\\x1e<marker><index>:<time>\\x1e``), so the supervisor can tell whose output is whose;
    after it, the call's answer goes on the socket. Returns why the process must be
    discarded, or None.
    """
    batch = _Batch(request["batch"], inbox.take(request["function"]), ctrl, snapshot)
    todo: collections.deque[tuple[dict[str, Any], list[bytes]]] = collections.deque()
    skip: set[int] = set()
    ended = False
    while True:
        for head, blobs in inbox.messages(wait=not todo and not ended):
            if "calls" in head:
                todo.extend((call, blobs[3 * k:3 * k + 3]) for k, call in enumerate(head["calls"]))
            skip.update(head.get("skip") or ())
            ended = ended or bool(head.get("end"))
        if not todo:
            if ended:
                replace_environ(snapshot.environ)
                return None
            continue
        call, blobs = todo.popleft()
        if call["i"] in skip:
            ctrl.sendall(_json_dumps({"i": call["i"], "skipped": True, "sizes": []}).encode()
                         + b"\n")
            continue
        reason = batch.run(call, blobs)
        if reason is not None:
            return reason


class _Batch:
    """What the calls of one batch share: the function's pickle, environment and directory."""

    def __init__(self, opening: dict[str, Any], function: bytes, ctrl: socket.socket,
                 snapshot: _Snapshot) -> None:
        self._function = function
        self._marker = b"\x1e" + opening["marker"].encode()
        self._env: dict[str, str] = opening.get("env") or {}
        self._scratch: str = opening["cwd"]
        self._pythonpath = list(opening.get("pythonpath") or ())
        self._ctrl = ctrl
        self._snapshot = snapshot
        self._image: dict[bytes, bytes] | None = None  # the environment as the last job left it

    def run(self, call: dict[str, Any], blobs: list[bytes]) -> str | None:
        """One call as its own job; its answer goes on the socket. Returns why the process
        must be discarded, or None."""
        from shoal.jobs._entrypoint import execute
        from shoal.serialization import Payload

        index = call["i"]
        began = time.time()
        os.write(1, b"%s%d:%a\x1e" % (self._marker, index, began))
        self._env["SHOAL_JOB_NAME"] = call["job"]
        if self._image is not None and _environ_data() == self._image:
            os.environ["SHOAL_JOB_NAME"] = call["job"]  # the last job left it as it was
        else:
            replace_environ(self._env)
        os.chdir(os.environ.get("SHOAL_JOB_CWD") or self._scratch)
        sys.path[:0] = [p for p in self._pythonpath if p not in sys.path]
        fmeta, adata, ameta = blobs
        try:
            status, outcome = execute(Payload(self._function, fmeta), Payload(adata, ameta),
                                      call["key"])
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        reason = self._snapshot.restore(environ=False)
        data = _environ_data()
        self._image = dict(data) if data is not None else None
        _keep_workdir(self._scratch, call["workdir"])
        self._ctrl.sendall(_reply({"i": index, "t": [began, time.time()], "exit": status,
                                   "discard": reason}, outcome))
        return reason


def _environ_data() -> dict[bytes, bytes] | None:
    """os.environ's own bytes mapping, to tell cheaply whether a job changed anything."""
    data = getattr(os.environ, "_data", None)
    return data if isinstance(data, dict) else None


def _keep_workdir(scratch: str, workdir: str) -> None:
    """A call that left files in the batch's scratch directory keeps them as its own workdir;
    the next call gets an empty one."""
    try:
        if not os.listdir(scratch):
            return
        os.rename(scratch, workdir)
        os.mkdir(scratch)
    except OSError:
        pass  # the files stay where they are; the next call sees them


def _reply(head: dict[str, Any], outcome: dict[str, Any]) -> bytes:
    head["sizes"] = []
    data = b""
    for kind in ("results", "exception"):
        if kind in outcome:
            payload = outcome[kind]
            head.update(kind=kind, sizes=[len(payload.data), len(payload.metadata)])
            data = payload.data + payload.metadata
    head["summary"] = outcome.get("summary")
    head["error"] = outcome.get("error")
    return _json_dumps(head).encode() + b"\n" + data


class _Gone(Exception):
    """The supervisor closed the control socket in the middle of a request."""


class _Inbox:
    """Lines and blobs from the control socket, with a look for lines that already arrived."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buf = bytearray()

    def _fill(self) -> bool:
        chunk = self._sock.recv(1 << 20)
        if chunk:
            self._buf += chunk
        return bool(chunk)

    def line(self) -> bytes | None:
        """The next line; None when the socket closed between requests."""
        while (end := self._buf.find(b"\n")) < 0:
            if not self._fill():
                if self._buf:
                    raise _Gone
                return None
        out = bytes(self._buf[:end])
        del self._buf[:end + 1]
        return out

    def take(self, n: int) -> bytes:
        while len(self._buf) < n:
            if not self._fill():
                raise _Gone
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def messages(self, *, wait: bool) -> list[tuple[dict[str, Any], list[bytes]]]:
        """The complete messages (a JSON line, then the blobs its ``sizes`` announce) that
        have arrived; with *wait*, block until there is at least one."""
        while True:
            while True:
                try:
                    chunk = self._sock.recv(1 << 16, socket.MSG_DONTWAIT)
                except (BlockingIOError, InterruptedError):
                    break
                if not chunk:
                    raise _Gone
                self._buf += chunk
            out: list[tuple[dict[str, Any], list[bytes]]] = []
            while (end := self._buf.find(b"\n")) >= 0:
                head = _json_loads(bytes(self._buf[:end]))
                sizes = head.get("sizes") or []
                if len(self._buf) < end + 1 + sum(sizes):
                    if out or not wait:
                        return out  # the rest of it is on its way
                    break
                del self._buf[:end + 1]
                out.append((head, [self.take(n) for n in sizes]))
            if out or not wait:
                return out
            if not self._fill():
                raise _Gone
