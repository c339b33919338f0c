"""TCP_NODELAY on the model server's accepted sockets, whichever event loop runs it.

The servers listen on sockets of their own (``shoal.serving.runner.bind``: ``SO_REUSEPORT``,
workers, a port held across restarts), which are not created as ``IPPROTO_TCP``, so the stdlib
asyncio loop leaves Nagle on for their connections (uvloop sets TCP_NODELAY regardless). A
response written as head + body then waits ~40 ms for the client's delayed ACK: the stdlib
loop served 5x fewer requests than uvloop in bench/serving_frontends.py. The test checks the
socket option itself on the server's connections (served in this process on the stdlib loop,
the pure-Python fallback where uvloop is not installed), which no machine load can make flaky.
"""

from __future__ import annotations

import socket
import threading

import pytest
from tests.helpers import wait_until

uvicorn = pytest.importorskip("uvicorn")


class _App:
    open_paths = frozenset({"/ping"})

    async def __call__(self, scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", b"20")]})
        await send({"type": "http.response.body", "body": b'{"status":"healthy"}'})


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_the_model_servers_accepted_sockets_have_tcp_nodelay(loop: str) -> None:
    if loop == "uvloop":
        pytest.importorskip("uvloop")
    from shoal.serving._options import ServerOptions
    from shoal.serving.runner import bind, uvicorn_config

    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    config = uvicorn_config(_App(), ServerOptions())
    config.loop = loop
    config.lifespan = "off"
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    client = None
    try:
        wait_until(lambda: server.started, 60, what="the in-process model server")
        client = socket.create_connection(("127.0.0.1", port), timeout=30)
        client.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while not answer.endswith(b"}"):
            chunk = client.recv(4096)
            assert chunk, answer
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200")
        sockets = [c.transport.get_extra_info("socket") for c in server.server_state.connections]
        assert sockets, "the server holds no connection: the keep-alive one should be open"
        assert {s.getpeername() for s in sockets} == {client.getsockname()}
        assert all(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for s in sockets)
    finally:
        if client is not None:
            client.close()
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
