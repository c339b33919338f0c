"""Running a model server: bind the port (a clear error when it is taken), then serve with
uvicorn in this process, or supervise ``workers`` uvicorn processes, each on its own socket
of the same port (``SO_REUSEPORT``: the kernel spreads the connections).

With ``shared`` (``--reuse-port``), the server joins a port other servers listen on too (an
endpoint's instances share one address): every socket it binds there takes ``SO_REUSEPORT``,
none listens before its worker has the model, so the kernel gives connections only to
loaded servers, and the port file is written once all its workers have their model.

A worker whose model fails to load exits with status 1, and so does the whole server: a model
that cannot load is not retried in a loop.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from shoal._internal.extras import SERVER_MODULES, require
from shoal.errors import ServingError
from shoal.serving._handlers import select_handler
from shoal.serving._options import ServerOptions
from shoal.serving.artifact import resolve_model
from shoal.serving.runner import (
    STOP_GRACE_S,
    Stop,
    StopSignals,
    bind,
    reuse_port_works,
    run_app,
    url_host,
    write_port_file,
)

__all__ = ["bind", "serve"]

log = logging.getLogger(__name__)

#: A model directory holding this file (or the file alone) is an LLM, served by _LLM_SERVER.
_LLM_PROPERTIES = "serving.properties"
_LLM_SERVER = "shoal.llm.serving"

def serve(model: str | os.PathLike[str], *, options: ServerOptions,
          port_file: str | os.PathLike[str] | None = None, shared: bool = False) -> int:
    """Serve *model* until SIGTERM or SIGINT; return the exit status (0, or 1 when the model
    failed to load).

    *port_file*, when given, receives the bound port once the socket listens (useful with
    ``port=0``; with *shared*, once every worker has its model). Raises ``ModelLoadError`` before listening when *model* holds nothing to
    serve, and ``ServingError`` when the port cannot be bound.
    """
    if Path(os.fspath(model)).name == _LLM_PROPERTIES:
        return _serve_llm(model, options, port_file)
    resolved = resolve_model(model)
    try:
        if (resolved.path / _LLM_PROPERTIES).is_file():
            if shared:
                raise ServingError("an LLM server cannot share its port with others "
                                   "(--reuse-port); give each one its own port")
            return _serve_llm(resolved.path, options, port_file)
        # A missing extra fails here, before listening, naming it (not a traceback later).
        require("serve", "the model server", *SERVER_MODULES)
        select_handler(resolved.path, options)  # fail before listening when there is no model
        # no count asked for: one worker per usable CPU (ServerOptions.worker_count); each
        # worker's runtime then gets one intra-op thread (_handlers.intra_op_threads)
        options = replace(options, workers=options.worker_count)
        workers = options.worker_count
        socks = (bind_shared(options.host, options.port, workers) if shared
                 else bind_workers(options.host, options.port, workers))
        sock = socks[0]
        port = sock.getsockname()[1]
        ready_file = str(port_file) if port_file is not None and shared else None
        if port_file is not None and not shared:
            write_port_file(port_file, port)
        sys.stdout.write(f"shoal model server listening on http://{url_host(options.host)}:"
                         f"{port} (model {resolved.path}, {workers} worker"
                         f"{'s' if workers > 1 else ''})\n")
        sys.stdout.flush()
        with StopSignals():
            try:
                if workers == 1 and not shared:
                    return run_worker(sock, str(resolved.path), options)
                if workers == 1:  # the port file is written once it has the model
                    return run_worker(sock, str(resolved.path), options, WorkerReadiness(
                        bytearray(1), 0, shared=True, ready_file=ready_file, port=port))
                return _supervise(socks, str(resolved.path), options, shared, ready_file)
            except Stop:
                return 0
            finally:
                for s in socks:
                    s.close()
    finally:
        resolved.cleanup()


def _serve_llm(model: str | os.PathLike[str], options: ServerOptions,
               port_file: str | os.PathLike[str] | None) -> int:
    """DJL's serving.properties marks an LLM: shoal.llm's server serves it. It sits a layer
    above, so it is found by dotted path, as registries find implementations."""
    import importlib

    llm_serve = importlib.import_module(_LLM_SERVER).serve
    return int(llm_serve(model, options=options, port_file=port_file))


def bind_workers(host: str, port: int, workers: int) -> list[socket.socket]:
    """One listening socket per worker on *host*:*port*.

    Several workers get a socket each on the same port (``SO_REUSEPORT``), so the kernel
    spreads new connections over them evenly. With one shared socket, the worker that happens
    to be awake when a burst of clients connects accepts them all, and the other workers sit
    idle for as long as those connections live (the benchmark saw all 32 on one of two).
    """
    if workers <= 1 or not reuse_port_works():
        return [bind(host, port)]  # one socket the workers share
    if port != 0:
        bind(host, port).close()  # in use by another process: say so, as for one worker
    first = bind(host, port, reuse_port=True)
    socks = [first]
    try:
        port = first.getsockname()[1]
        # bound, not listening: the kernel gives a socket connections only once its worker
        # listens on it, which it does once its model is loaded (run_worker)
        socks += [bind(host, port, reuse_port=True, listen=False) for _ in range(workers - 1)]
    except BaseException:
        for s in socks:
            s.close()
        raise
    return socks


def bind_shared(host: str, port: int, workers: int) -> list[socket.socket]:
    """One bound, not yet listening, ``SO_REUSEPORT`` socket per worker on *host*:*port*, a
    port other servers may share (each worker listens once its model is loaded)."""
    if not reuse_port_works():
        raise ServingError("this kernel refuses SO_REUSEPORT, so servers cannot share a port; "
                           "give each one its own", host=host, port=port)
    socks: list[socket.socket] = []
    try:
        for _ in range(workers):
            socks.append(bind(host, port, reuse_port=True, listen=False))
            port = socks[0].getsockname()[1]
    except BaseException:
        for s in socks:
            s.close()
        raise
    return socks


class WorkerReadiness:
    """Which of a server's workers have their model, in memory the workers share: worker
    *index* marks itself, and its ``/ping`` answers 200 only once every worker has."""

    def __init__(self, flags: Any, index: int, *, shared: bool = False,
                 ready_file: str | None = None, port: int = 0) -> None:
        self._flags = flags  # multiprocessing RawArray, one byte per worker
        self.index = index
        self._all = False
        #: on a shared port every worker listens only once loaded (none answers 503 there)
        self.listen_when_loaded = index > 0 or shared
        self._ready_file = ready_file
        self._port = port

    def mark_ready(self) -> None:
        self._flags[self.index] = 1
        if self._ready_file is not None and all(self._flags):
            write_port_file(self._ready_file, self._port)

    def all_ready(self) -> bool:
        if not self._all:  # once all are, they stay (a worker that dies ends the server)
            self._all = all(self._flags)
        return self._all


def run_worker(sock: socket.socket, model_dir: str, options: ServerOptions,
               readiness: WorkerReadiness | None = None) -> int:
    """Serve on *sock* in this process with uvicorn; 1 when the model fails to load.

    With *readiness* (one of several workers), ``/ping`` is 200 only once every worker has
    its model, and every worker but the first starts listening only once its own model is
    loaded: no request reaches a worker without its model. The first answers ``/ping`` (503)
    while the models load."""
    from shoal.serving._app import create_app

    def make_app(failed: Callable[[BaseException], None]) -> Any:
        app = create_app(model_dir, options=options, on_load_error=failed)
        if readiness is not None:
            app.others_ready = readiness.all_ready
            app.on_ready = readiness.mark_ready
            app.listen_when_loaded = readiness.listen_when_loaded
        return app

    return run_app(make_app, sock, options)


def _die_with_parent(parent: int) -> None:
    """A worker ends with the server process that started it, even one killed with SIGKILL
    (Linux: PR_SET_PDEATHSIG), so a killed model server leaves no worker answering on its
    port; *parent* gone already (before the call): end now."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)


def _worker_main(sock: socket.socket, model_dir: str, options: ServerOptions, flags: Any,
                 index: int, shared: bool = False, ready_file: str | None = None,
                 parent: int = 0) -> None:
    from shoal._internal import logconfig

    _die_with_parent(parent)
    logconfig.configure(logging.INFO)
    readiness = WorkerReadiness(flags, index, shared=shared, ready_file=ready_file,
                                port=sock.getsockname()[1])
    sys.exit(run_worker(sock, model_dir, options, readiness))


def _supervise(socks: list[socket.socket], model_dir: str, options: ServerOptions,
               shared: bool = False, ready_file: str | None = None) -> int:
    ctx = multiprocessing.get_context("spawn")
    workers = options.worker_count
    flags = ctx.RawArray("b", workers)
    procs = [ctx.Process(target=_worker_main,
                         args=(socks[i % len(socks)], model_dir, options, flags, i, shared,
                               ready_file, os.getpid()),
                         name=f"shoal-model-worker-{i}") for i in range(workers)]
    for p in procs:
        p.start()
    try:
        while True:
            multiprocessing.connection.wait([p.sentinel for p in procs])
            dead = [p for p in procs if p.exitcode is not None]
            if dead:
                log.error("model server worker %s exited with status %s; stopping the others",
                          dead[0].name, dead[0].exitcode)
                return 1 if any(p.exitcode for p in dead) else 0
    finally:
        _stop_all(procs)


def _stop_all(procs: list[Any]) -> None:
    for p in procs:
        if p.exitcode is None:
            p.terminate()
    for p in procs:
        p.join(STOP_GRACE_S)
        if p.exitcode is None:
            p.kill()
            p.join()
