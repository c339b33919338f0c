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

The cost per request is a few dict operations and clock reads (well under a microsecond): one
timer a second per server closes the requests that ran out of time, rather than a timer per
request. The file descriptor limit is raised to fit the connections.

**The fast path.** An app with ``fast_paths`` (a ``FastApp``: the model server's
``/invocations``) answers a plain request to one of them without ASGI: a POST with a
``Content-Length`` up to the app's ``fast_body_limit``, over HTTP/1.1, not pipelined behind
another and without ``Expect: 100-continue`` goes to ``app.fast_call(headers, body, reply)``
once whole, and ``reply`` writes the response in one ``write``. Everything else (other
requests to those paths included) takes uvicorn's ASGI path, which answers the same way. The
read deadline, the connection limit, keep-alive, graceful shutdown and pipelining hold for
both: a fast request stands in uvicorn's ``cycle`` as a ``_FastCycle``. uvicorn's per-request
task, scope, ``receive``/``send`` messages and two writes cost about a third of the server's
CPU per request beside a 1-image MNIST inference (bench/serving.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import resource
import socket
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from shoal._internal.extras import require

__all__ = ["FastApp", "Reply", "fit_fd_limit", "guarded_protocol"]

#: ``reply(status, body, content_type, headers)``: answer a fast request (once)
Reply = Callable[[int, bytes, bytes, tuple[tuple[bytes, bytes], ...]], None]


@runtime_checkable
class FastApp(Protocol):
    """An app that answers some requests without ASGI (see the module's docstring)."""

    #: raw request targets (no query string) answered by ``fast_call``
    fast_paths: frozenset[bytes]

    @property
    def fast_body_limit(self) -> int:
        """The largest body (bytes) a fast request may declare; larger ones go through ASGI."""

    def fast_call(self, headers: list[tuple[bytes, bytes]], body: bytes, reply: Reply) -> None:
        """Answer the POST with *headers* (lower-cased names) and *body* by calling *reply*
        once, now or later on the event loop."""


class _NoEvent:
    """What uvicorn calls on a cycle's ``message_event``: nothing waits on a fast cycle."""

    @staticmethod
    def set() -> None:
        return None


class _FastCycle:
    """A fast request in uvicorn's ``cycle`` slot: the attributes the protocol reads."""

    __slots__ = ("body", "disconnected", "keep_alive", "more_body", "response_complete")
    message_event = _NoEvent

    def __init__(self, keep_alive: bool) -> None:
        self.body: list[bytes] = []
        self.keep_alive = keep_alive
        self.more_body = True
        self.response_complete = False
        self.disconnected = False


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
    # httptools comes with the serve and llm extras, as uvicorn does (checked before listening)
    require("serve", "the model server's HTTP protocol", "httptools")
    from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

    raw_open = frozenset(p.encode() for p in open_paths)
    at_capacity = _at_capacity(max_connections)
    timed_out = _timed_out(read_timeout_s)
    # Connections waiting for their client, oldest first (dicts keep insertion order), with
    # the loop time they began to: in a request not yet whole, or idle between requests.
    reading: dict[Any, float] = {}
    idle: dict[Any, float] = {}
    sweeping: list[bool] = []
    interval = min(1.0, read_timeout_s / 4)
    keep_alive: list[float] = []  # uvicorn's timeout_keep_alive, read from the first connection
    heads: dict[tuple[int, bytes], bytes] = {}  # fast responses' heads up to content-length
    dated: list[Any] = [None]  # the server's default headers (the date) the heads were made with

    def now_idle(proto: Any) -> None:
        """*proto* waits for its client's next request from now (kept in time order)."""
        idle.pop(proto, None)
        idle[proto] = proto.loop.time()

    def sweep(loop: asyncio.AbstractEventLoop) -> None:
        """Close the connections whose request has not arrived whole in time (each second:
        one timer for the server rather than one per request)."""
        expired = loop.time() - read_timeout_s
        while reading:
            proto, since = next(iter(reading.items()))
            if since > expired:
                break
            del reading[proto]
            proto._read_timed_out()
        if keep_alive:  # idle past keep-alive: what uvicorn's timer does, which fast requests skip
            idle_since = loop.time() - keep_alive[0]
            while idle:
                proto, since = next(iter(idle.items()))
                if since > idle_since:
                    break
                del idle[proto]
                proto.transport.close()
        loop.call_later(interval, sweep, loop)

    def make_room() -> None:
        """Close the connection that has waited longest for its client, if one does."""
        oldest = min((next(iter(d.items())) for d in (reading, idle) if d),
                     key=lambda item: item[1], default=None)
        if oldest is not None:
            proto = oldest[0]
            reading.pop(proto, None)
            idle.pop(proto, None)
            proto.transport.close()

    class GuardedProtocol(HttpToolsProtocol):
        _fast_app: FastApp | None = None  # the app, when it answers some requests fast
        _began = False  # a request's first byte arrived...
        _headers_done = False  # ...and its headers

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if isinstance(self.app, FastApp):
                self._fast_app = self.app
            # No Nagle: a response goes out as head + body, and with Nagle on the body waits
            # for the client's delayed ACK (~40 ms). uvloop sets TCP_NODELAY on every accepted
            # socket; the stdlib loop only on sockets created as IPPROTO_TCP, which the
            # servers' own sockets (runner.bind) are not: at c=32 that made the stdlib loop
            # 5x slower than uvloop (bench/serving_frontends.py, uvicorn-asyncio).
            sock = transport.get_extra_info("socket")
            if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if len(self.connections) > max_connections:
                make_room()
            reading[self] = self.loop.time()  # the first request's clock starts now
            if not sweeping:
                sweeping.append(True)
                keep_alive.append(self.timeout_keep_alive)
                self.loop.call_later(interval, sweep, self.loop)

        def connection_lost(self, exc: Exception | None) -> None:
            reading.pop(self, None)
            idle.pop(self, None)
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self not in reading and self._clients_turn():  # the next request begins
                idle.pop(self, None)
                reading[self] = self.loop.time()
            super().data_received(data)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._began, self._headers_done = True, False

        def on_headers_complete(self) -> None:
            if len(self.connections) - len(reading) - len(idle) >= max_connections and \
                    self.url.partition(b"?")[0] not in raw_open:
                app, self.app = self.app, at_capacity  # every connection is busy
                try:
                    super().on_headers_complete()
                finally:
                    self.app = app
            elif not self._fast_request():
                super().on_headers_complete()
            self._headers_done = True

        def _fast_request(self) -> bool:
            """Whether the request whose headers just arrived goes the fast path (and then
            stands in the ``cycle`` slot as a ``_FastCycle``)."""
            app = self._fast_app
            if app is None or self.url not in app.fast_paths:
                return False
            parser = self.parser
            cycle = self.cycle
            if parser.get_method() != b"POST" or parser.get_http_version() != "1.1" \
                    or self.expect_100_continue or parser.should_upgrade() \
                    or not (cycle is None or cycle.response_complete):
                return False
            length = None
            for name, value in self.headers:
                if name == b"content-length":
                    length = value
                elif name == b"transfer-encoding":
                    return False
            if length is None or not length.isdigit() or int(length) > app.fast_body_limit:
                return False
            self.cycle = _FastCycle(parser.should_keep_alive())  # type: ignore[assignment]  # a stand-in, by the attributes read
            return True

        def on_body(self, body: bytes) -> None:
            cycle: Any = self.cycle
            if type(cycle) is _FastCycle:  # bounded by its Content-Length: no flow control
                cycle.body.append(body)
            else:
                super().on_body(body)

        def on_message_complete(self) -> None:
            cycle: Any = self.cycle
            if type(cycle) is _FastCycle:
                cycle.more_body = False
                self._began = False
                reading.pop(self, None)
                body = cycle.body[0] if len(cycle.body) == 1 else b"".join(cycle.body)
                cycle.body = []
                app = self._fast_app
                assert app is not None
                app.fast_call(self.headers, body,
                              lambda status, payload, content_type, headers:
                              self._fast_reply(cycle, status, payload, content_type, headers))
                return
            super().on_message_complete()
            self._began = False
            reading.pop(self, None)
            if self.cycle.response_complete:  # answered before the body was read
                now_idle(self)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.transport.is_closing() or self in reading or not self._clients_turn():
                return  # closing, its body still arriving, or a pipelined request runs
            if self._began:  # the next (pipelined) request is partly here: its clock starts
                reading[self] = self.loop.time()
            else:
                now_idle(self)

        def _fast_reply(self, cycle: _FastCycle, status: int, body: bytes,
                        content_type: bytes, headers: tuple[tuple[bytes, bytes], ...]) -> None:
            """The response to a fast request, head and body in one write (what uvicorn's
            ``send`` writes in two), then the keep-alive bookkeeping its ``send`` does: the
            connection waits for its next request, timed by the sweep rather than a timer."""
            if cycle.response_complete:
                return
            cycle.response_complete = True
            if cycle.disconnected or self.transport.is_closing():
                return
            default_headers = self.server_state.default_headers  # a new list each second
            if dated[0] is not default_headers:
                heads.clear()
                dated[0] = default_headers
            head = heads.get((status, content_type))
            if head is None:
                parts = [STATUS_LINE[status]]
                for name, value in default_headers:
                    parts += (name, b": ", value, b"\r\n")
                parts += (b"content-type: ", content_type, b"\r\ncontent-length: ")
                head = b"".join(parts)
                if len(heads) < 64:
                    heads[(status, content_type)] = head
            parts = [head, b"%d\r\n" % len(body)]
            for name, value in headers:
                parts += (name, b": ", value, b"\r\n")
            if not cycle.keep_alive:
                parts.append(b"connection: close\r\n")
            parts += (b"\r\n", body)
            self.transport.write(b"".join(parts))
            if not cycle.keep_alive or self.pipeline:
                if not cycle.keep_alive:
                    self.transport.close()
                self.on_response_complete()  # uvicorn's: a pipelined request starts
                return
            self.server_state.total_requests += 1
            if self._began:  # the next request is partly here: its clock starts
                reading[self] = self.loop.time()
            else:
                now_idle(self)

        def _clients_turn(self) -> bool:
            """No request in progress, or one whose body is still arriving."""
            cycle = self.cycle
            return cycle is None or cycle.response_complete or cycle.more_body

        def _read_timed_out(self) -> None:
            idle.pop(self, None)
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
