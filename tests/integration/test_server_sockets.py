"""TCP_NODELAY on both ends of a connection to the team server.

Without it, a request written in two pieces (headers, then a body) waits for the peer's
delayed ACK: ~40 ms per request on Linux. MLflow's multi-worker ``mlflow server`` loses it
(uvicorn issue 3149: sockets of ``--workers`` are not marked TCP, so asyncio leaves Nagle on),
which is 44 ms of each of its single ``log_metric`` calls. The test checks the socket option
itself, which no load on the machine can make flaky: on the server's accepted sockets (the
uvicorn configuration ``shoal server`` runs, from ``server_config``, served in this process so
that its connections can be inspected) and on the client's pooled httpx socket.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.helpers import wait_until

from shoal.client import ServerConnection
from shoal.session import Session

uvicorn = pytest.importorskip("uvicorn")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _nodelay(sock: socket.socket) -> bool:
    return bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[object, str]]:
    from shoal.server.admin import server_config

    session = Session(home=str(tmp_path / "home"))
    port = _free_port()
    server = uvicorn.Server(server_config(session, host="127.0.0.1", port=port, auth=False))
    thread = threading.Thread(target=server.run, name="shoal-server", daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, 60, what="the in-process shoal server")
        yield server, f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        session.close()


def test_accepted_and_client_sockets_have_tcp_nodelay(served):
    server, url = served
    connection = ServerConnection(url, None)
    try:
        connection.call("PUT", "/experiments/nodelay", json={"display_name": None, "tags": {}})
        connection.call("POST", "/metrics", params={"owner": "run:nodelay/r"},
                        json={"points": [["loss", 1.0, 0.0, 0]]})
        # The client's side: the pooled connection the calls above used (httpcore's stream).
        response = connection._client.get("/api/v1/version")
        client_sock = response.extensions["network_stream"].get_extra_info("socket")
        assert client_sock is not None and _nodelay(client_sock)
        # The server's side: every connection it holds open now (the keep-alive one above).
        sockets = [c.transport.get_extra_info("socket") for c in server.server_state.connections]
        assert sockets, "the server holds no connection: the keep-alive one should be open"
        assert all(_nodelay(s) for s in sockets), [s.getsockname() for s in sockets]
        peers = {s.getpeername() for s in sockets}
        assert client_sock.getsockname() in peers  # the very connection the client used
    finally:
        connection.close()
