"""Running a server app: the listening socket (a clear error when the port is taken), the port
file, uvicorn's settings, and one uvicorn run in this process that ends with status 1 when the
app's model fails to load. The model server (``shoal.serving``) and the LLM server
(``shoal.llm.serving``) both run their apps here.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from shoal.errors import ServingError
from shoal.serving._options import ServerOptions

__all__ = ["STOP_GRACE_S", "Stop", "StopSignals", "bind", "reuse_port_works", "run_app",
           "uvicorn_config", "url_host", "write_port_file"]

#: seconds a stopping server gives open requests (uvicorn's graceful shutdown, then workers)
STOP_GRACE_S = 30

#: builds the app given the callback its load failure calls
AppFactory = Callable[[Callable[[BaseException], None]], Any]


class Stop(BaseException):
    """SIGTERM/SIGINT, raised once uvicorn has shut down gracefully."""


class StopSignals:
    """SIGTERM and SIGINT raise ``Stop``: uvicorn captures them first, shuts down gracefully,
    then re-raises them here, so temporary model directories are still removed. (Outside the
    main thread, signals cannot be set: nothing changes.)"""

    def __enter__(self) -> None:
        self._saved: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._saved[sig] = signal.signal(sig, _raise_stop)

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise Stop(signum)


def reuse_port_works() -> bool:
    """Whether this kernel takes SO_REUSEPORT (some sandboxes name it and refuse it)."""
    if not hasattr(socket, "SO_REUSEPORT"):
        return False
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    except OSError:
        return False
    return True


def bind(host: str, port: int, *, reuse_port: bool = False, listen: bool = True
         ) -> socket.socket:
    """A listening (or, with ``listen=False``, only bound) TCP socket on *host*:*port*;
    ``ServingError`` says why it cannot be had."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        if listen:
            sock.listen(2048)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ServingError(f"port {port} on {host} is already in use; choose another with "
                               f"--port (0 picks a free one) or stop the process holding it",
                               host=host, port=port) from e
        raise ServingError(f"cannot listen on {host}:{port}: {e.strerror or e}", host=host,
                           port=port) from e
    sock.set_inheritable(True)
    return sock


def write_port_file(path: str | os.PathLike[str], port: int) -> None:
    """*port* into *path*, atomically (a reader never sees half of it)."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(f"{port}\n")
    os.replace(tmp, target)


def url_host(host: str) -> str:
    """*host* as a URL writes it (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host else host


def uvicorn_config(app: Any, options: ServerOptions) -> Any:
    """uvicorn's settings for *app*: the guarded protocol (read deadline, connection limit;
    ``shoal.serving._guard``), keep-alive past load balancers' 60 s, no access log."""
    import uvicorn

    from shoal.serving._guard import fit_fd_limit, guarded_protocol

    protocol = guarded_protocol(read_timeout_s=options.read_timeout_s,
                                max_connections=fit_fd_limit(options.max_connections),
                                open_paths=app.open_paths)
    return uvicorn.Config(app, http=protocol, lifespan="on", log_config=None,
                          access_log=False, proxy_headers=False, server_header=False,
                          timeout_keep_alive=75, timeout_graceful_shutdown=STOP_GRACE_S)


def run_app(make_app: AppFactory, sock: socket.socket, options: ServerOptions) -> int:
    """Serve the app ``make_app(failed)`` builds on *sock* with uvicorn until it stops; 0, or
    1 when the app called ``failed`` (its model did not load: the server stops then)."""
    import uvicorn

    status = 0
    server: uvicorn.Server | None = None

    def failed(error: BaseException) -> None:
        nonlocal status
        status = 1
        if server is not None:
            server.should_exit = True

    app = make_app(failed)
    server = uvicorn.Server(uvicorn_config(app, options))
    server.run(sockets=[sock])
    return status
