"""What keeps the servers answering under hostile clients: uvicorn's httptools protocol with a
read deadline per request and a connection limit that keeps room for new clients.

* **Read deadline.** A request must arrive whole within ``read_timeout_s`` of its first byte
  (of the connection's opening, for its first request): headers cut short are answered 408,
  a body cut short is dropped (the app sees the client leave), and the connection is closed.
  uvicorn's own ``timeout_keep_alive`` covers only the idle time between requests.
* **Connection limit.** Connections that wait for their client (a request not yet whole, or
  idle between requests) are kept in the order they began to wait. Past ``max_connections``
  open connections, a new one closes the one that has waited longest, so half-sent requests
  cannot hold the server; when none waits (every connection is in a request the app works
  on), requests other than the open paths (``/ping``, ``/health``) are answered 503 at once,
  and the open paths are answered as usual.

The cost per request is one timer (armed when its first byte arrives, cancelled when its last
does) and two dict operations. The file descriptor limit is raised to fit the connections.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from typing import Any

from shoal.errors import ServingError

__all__ = ["fit_fd_limit", "guarded_protocol"]

log = logging.getLogger(__name__)

#: descriptors kept for what is not a connection: the model's files, threads' pipes, logs
_FD_RESERVE = 256
_MIN_CONNECTIONS = 16


def fit_fd_limit(max_connections: int) -> int:
    """Raise the soft ``RLIMIT_NOFILE`` so *max_connections* connections fit; the number that
    fits (fewer, with a warning, when the hard limit is too low)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max_connections + _FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < want:
        fits = max(_MIN_CONNECTIONS, soft - _FD_RESERVE)
        log.warning("max_connections=%d does not fit in the file descriptor limit (%d); "
                    "keeping %d connections (raise the limit with ulimit -n)",
                    max_connections, soft, fits)
        return fits
    return max_connections


def guarded_protocol(*, read_timeout_s: float, max_connections: int,
                     open_paths: frozenset[str]) -> type[asyncio.Protocol]:
    """An ``HttpToolsProtocol`` class for one server (``uvicorn.Config(http=...)``) that
    enforces *read_timeout_s* and *max_connections*, letting *open_paths* through past it."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError as e:  # httptools comes with the serve extra, as uvicorn does
        raise ServingError(f"the model server needs httptools ({e}); install shoal[serve]") \
            from e
    raw_open = frozenset(p.encode() for p in open_paths)
    at_capacity = _at_capacity(max_connections)
    timed_out = _timed_out(read_timeout_s)
    #: the connections waiting for their client, oldest first (a dict keeps insertion order)
    waiting: dict[Any, None] = {}

    class GuardedProtocol(HttpToolsProtocol):  # type: ignore[misc]
        _deadline: asyncio.TimerHandle | None = None
        _began = False  # a request's first byte arrived...
        _headers_done = False  # ...and its headers

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections and waiting:
                oldest = next(iter(waiting))
                del waiting[oldest]
                oldest._disarm()
                oldest.transport.close()  # to make room
            waiting[self] = None
            self._deadline = self.loop.call_later(read_timeout_s, self._read_timed_out)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            waiting.pop(self, None)
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._deadline is None and self._clients_turn():  # the next request begins
                self._deadline = self.loop.call_later(read_timeout_s, self._read_timed_out)
            super().data_received(data)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._began, self._headers_done = True, False

        def on_headers_complete(self) -> None:
            if len(self.connections) - len(waiting) >= max_connections and \
                    self.url.partition(b"?")[0] not in raw_open:
                app, self.app = self.app, at_capacity  # every connection is busy
                try:
                    super().on_headers_complete()
                finally:
                    self.app = app
            else:
                super().on_headers_complete()
            self._headers_done = True

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._disarm()
            self._began = False
            self._settle()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._settle()

        def _clients_turn(self) -> bool:
            """No request in progress, or one whose body is still arriving."""
            cycle = self.cycle
            return cycle is None or cycle.response_complete or cycle.more_body

        def _settle(self) -> None:
            """Into ``waiting`` (at its end) while the connection waits for its client, out of
            it while the app works on its request."""
            waiting.pop(self, None)
            if self._clients_turn():
                waiting[self] = None
                if self._began and self._deadline is None:  # a pipelined request, half here
                    self._deadline = self.loop.call_later(read_timeout_s,
                                                          self._read_timed_out)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _read_timed_out(self) -> None:
            self._deadline = None
            waiting.pop(self, None)
            if self._began and not self._headers_done and not self.transport.is_closing():
                self.transport.write(timed_out)
            self.transport.close()

    return GuardedProtocol


def _timed_out(read_timeout_s: float) -> bytes:
    body = json.dumps({"error": "request timeout", "detail":
                       f"the request did not arrive whole within {read_timeout_s:g} s "
                       f"(--read-timeout-s)"}).encode()
    return (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body))


def _at_capacity(max_connections: int) -> Any:
    body = json.dumps({"error": "too many connections", "detail":
                       f"the server holds its {max_connections} connections "
                       f"(--max-connections), all in requests; retry shortly"}).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode()), (b"retry-after", b"1"),
               (b"connection", b"close")]

    async def at_capacity(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return at_capacity
