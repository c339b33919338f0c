"""The local launcher: a small fork server that starts job supervisors in milliseconds.

Starting a supervisor by ``exec`` costs an interpreter plus SQLAlchemy and fsspec imports
(≈0.5 s on a small machine); forking the caller would copy a notebook's memory and its
threads. So one clean, single-threaded process per interpreter imports the supervisor's
modules once and forks a fresh session leader for each job. It exits after an idle period.

At most one launcher serves a socket: each holds a lock on ``launcher_lock_path(SOCKET)``
(``fcntl.lockf``, which a forked child does not inherit and the kernel releases when the
launcher dies, kill -9 included) for as long as it runs, and a second one exits at once. A
socket file whose lock nobody holds is a dead launcher's, and is replaced.

``python -m shoal.backends._launcher serve SOCKET IDLE MODULE...`` runs the server;
``python -m shoal.backends._launcher run ENTRY ARG...`` runs one entry point (spawn mode).
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import json
import os
import signal
import socket
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from shoal.backends.procfs import start_ticks

if TYPE_CHECKING:
    from types import FrameType

__all__ = ["launcher_lock_path", "main", "resolve_entrypoint"]

#: The lifetime lock's file descriptor in the launcher (closed in each forked child).
_LOCK_FD = -1


def launcher_lock_path(sock_path: str) -> str:
    """The file whose lock the launcher serving *sock_path* holds while it runs."""
    return sock_path.removesuffix(".sock") + ".lock"


def take_lifetime_lock(sock_path: str) -> int | None:
    """Lock ``launcher_lock_path(sock_path)`` for this process's lifetime; its descriptor,
    or None when another live process holds it."""
    fd = os.open(launcher_lock_path(sock_path), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # EAGAIN or EACCES: held by a live launcher
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def resolve_entrypoint(spec: str) -> Callable[..., int]:
    module, _, attr = spec.partition(":")
    fn: Callable[..., int] = getattr(importlib.import_module(module), attr)
    return fn


def _child(request: dict[str, Any], log_path: str | None) -> None:
    """In the forked child: become a session leader with the job's environment, then run."""
    code = 70
    try:
        if _LOCK_FD >= 0:
            os.close(_LOCK_FD)  # the lock stays the launcher's (lockf locks are per process)
        os.setsid()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(request.get("env") or {})
        if request.get("cwd"):
            os.chdir(request["cwd"])
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        out = os.open(log_path or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(out, 1)
        os.dup2(out, 2)
        fn = resolve_entrypoint(request["entrypoint"])
        code = int(fn(*request.get("args", ())) or 0)
    except BaseException:  # the child must never return into the server loop
        traceback.print_exc()
        code = 70
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            _drop_if_empty(log_path)
        finally:
            os._exit(code)


def _drop_if_empty(log_path: str | None) -> None:
    """Remove the supervisor's log if it wrote nothing there (most do not): an empty file per
    job is an inode and a directory entry for nothing. A log with anything in it stays."""
    if not log_path:
        return
    with contextlib.suppress(OSError):
        if os.fstat(1).st_size == 0 and os.path.samestat(os.fstat(1), os.stat(log_path)):
            os.unlink(log_path)


def serve(sock_path: str, idle_seconds: float, preload: Sequence[str]) -> int:
    global _LOCK_FD
    lock = take_lifetime_lock(sock_path)
    if lock is None:
        sys.stderr.write(f"[shoal] launcher pid {os.getpid()}: another launcher serves "
                         f"{sock_path}; exiting\n")
        return 0
    _LOCK_FD = lock
    _title(sock_path)
    for item in preload:
        if ":" in item:  # "module:function" warms a cache (e.g. builds the Settings class)
            resolve_entrypoint(item)()
        else:
            importlib.import_module(item)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    signal.signal(signal.SIGTERM, _exit_on_term)  # run the clean-up below on the way out
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # What a dead launcher left behind (we hold the lock: no live one owns these names).
    for stale in (sock_path, sock_path + ".tmp"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(stale)
    old_umask = os.umask(0o077)  # only this user may ask the launcher to run anything
    try:
        server.bind(sock_path + ".tmp")
    finally:
        os.umask(old_umask)
    server.listen(64)
    os.rename(sock_path + ".tmp", sock_path)  # clients never see a socket not yet listening
    server.settimeout(idle_seconds)
    try:
        while True:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                return 0
            with conn:
                try:
                    conn.settimeout(10)
                    reply = _handle(conn, server)
                    conn.sendall(json.dumps(reply).encode() + b"\n")
                except OSError:  # a stalled or vanished client must not take the server down
                    traceback.print_exc()
    finally:
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(sock_path)  # ours: we hold the lock until we exit
        finally:
            server.close()
            os.close(lock)  # releases it: the next launcher may start
            _LOCK_FD = -1


def _handle(conn: socket.socket, server: socket.socket) -> dict[str, Any]:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            return {"error": "incomplete request"}
        buf += chunk
    try:
        request = json.loads(buf)
    except ValueError as e:
        return {"error": f"bad request: {e}"}
    if request.get("op") == "ping":
        return {"ok": True, "pid": os.getpid()}
    if request.get("prepare"):
        try:
            resolve_entrypoint(request["prepare"])(request.get("env") or {})
        except Exception:  # warming is an optimisation; the child builds what it needs
            traceback.print_exc()
    pid = os.fork()
    if pid == 0:
        server.close()
        conn.close()
        _child(request, request.get("log_path"))
    return {"pid": pid, "start_ticks": start_ticks(pid)}


def _title(sock_path: str) -> None:
    """``shoal launcher HOME`` in ps (the socket is in ``HOME/run`` unless that path was too
    long for AF_UNIX)."""
    from shoal._internal.proctitle import set_title

    run_dir = os.path.dirname(sock_path)
    set_title("launcher", os.path.dirname(run_dir) if os.path.basename(run_dir) == "run"
              else sock_path)


def _exit_on_term(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def _detach() -> None:
    """Fork; the parent prints the child's pid and exits, so the caller can reap it at once
    and the child is adopted by init (no zombie, no Popen left running in the client)."""
    pid = os.fork()
    if pid:
        sys.stdout.write(f"{pid}\n")
        sys.stdout.flush()
        os._exit(0)
    os.dup2(2, 1)  # the daemon's stdout joins its log (stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("serve", "run"):
        # What the launcher and the supervisors write (logs, work directories, results) is
        # this user's alone; a job's own process gets its client's umask back.
        os.umask(0o077)
    if args and args[0] == "serve":
        _detach()
        return serve(args[1], float(args[2]), args[3:])
    if args and args[0] == "run":
        _detach()
        return int(resolve_entrypoint(args[1])(*args[2:]) or 0)
    sys.stderr.write("usage: python -m shoal.backends._launcher serve|run ...\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())
