"""The model server's fast path (``shoal.serving._guard``): a plain ``POST /invocations`` with a
``Content-Length`` is answered without ASGI. The same request sent chunked (no
``Content-Length``) takes uvicorn's ASGI path, so each pair below is one request answered by
both: status, body and headers must be the same, errors included. The rest checks what the
fast path does to the connection: keep-alive, pipelining, ``Connection: close`` and the
keep-alive timeout, which the guard's sweep applies to fast requests instead of uvicorn's timer.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from helpers import wait_until

pytest.importorskip("onnxruntime")
pytest.importorskip("uvicorn")
torch = pytest.importorskip("torch")

from tests.integration.test_model_server import (  # noqa: E402
    CSV,
    JSON,
    NPY,
    Server,
    expected,
    from_npy,
    launch,
    linear_module,
    metric,
    npy,
)

from shoal.export.onnx import export  # noqa: E402

KEY = "fast-path-key"


@pytest.fixture(scope="module")
def onnx_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model_dir = tmp_path_factory.mktemp("fast-onnx") / "onnx"
    export(linear_module(), torch.randn(1, 4), model_dir / "model.onnx")
    return model_dir


@pytest.fixture(scope="module")
def server(onnx_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = launch(onnx_dir, tmp_path_factory.mktemp("fast-server"), "--max-payload-mb", "0.01")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def keyed(onnx_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = launch(onnx_dir, tmp_path_factory.mktemp("fast-keyed"), "--api-key", KEY)
    yield s
    assert s.stop() == 0


# --- a raw HTTP/1.1 client: the test decides how the body is framed ---------------------------

def _port(server: Server) -> int:
    return int(server.url.rsplit(":", 1)[1])


def request(body: bytes, headers: dict[str, str], *, chunked: bool = False,
            path: str = "/invocations") -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if chunked:  # no Content-Length: uvicorn's ASGI path
        framed = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if body else b"0\r\n\r\n"
        lines.append("Transfer-Encoding: chunked")
    else:
        framed = body
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + framed


class Response:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body


def read_response(sock: socket.socket, buffer: bytearray) -> Response:
    """One response from *sock* (bytes past it stay in *buffer*): by Content-Length, or
    chunked."""
    def fill() -> None:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection; got so far {bytes(buffer)!r}"
        buffer.extend(chunk)

    while b"\r\n\r\n" not in buffer:
        fill()
    head, _, _ = bytes(buffer).partition(b"\r\n\r\n")
    del buffer[:len(head) + 4]
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        body = bytearray()
        while True:
            while b"\r\n" not in buffer:
                fill()
            size_line, _, _ = bytes(buffer).partition(b"\r\n")
            size = int(size_line, 16)
            while len(buffer) < len(size_line) + 2 + size + 2:
                fill()
            body += buffer[len(size_line) + 2:len(size_line) + 2 + size]
            del buffer[:len(size_line) + 2 + size + 2]
            if size == 0:
                break
        return Response(int(status_line.split()[1]), headers, bytes(body))
    length = int(headers.get("content-length", "0"))
    while len(buffer) < length:
        fill()
    body = bytes(buffer[:length])
    del buffer[:length]
    return Response(int(status_line.split()[1]), headers, body)


def exchange(server: Server, data: bytes, count: int = 1) -> list[Response]:
    with socket.create_connection(("127.0.0.1", _port(server)), timeout=30) as sock:
        sock.sendall(data)
        buffer = bytearray()
        return [read_response(sock, buffer) for _ in range(count)]


#: headers that differ by framing or time, not by answer
_FRAMING = {"date", "content-length", "transfer-encoding", "connection"}


def answered_alike(server: Server, body: bytes, headers: dict[str, str]) -> Response:
    """Send the request both ways; assert they are answered alike; the fast one's answer."""
    fast = exchange(server, request(body, headers))[0]
    slow = exchange(server, request(body, headers, chunked=True))[0]
    assert (fast.status, fast.body) == (slow.status, slow.body), (fast.body, slow.body)
    assert {k: v for k, v in fast.headers.items() if k not in _FRAMING} == \
        {k: v for k, v in slow.headers.items() if k not in _FRAMING}
    assert fast.headers["content-length"] == str(len(fast.body))
    assert "transfer-encoding" not in fast.headers
    return fast


X = np.array([[1, 2, 3, 4], [0, -1, 0.5, 2]], dtype=np.float32)


@pytest.mark.parametrize(("body", "headers", "status"), [
    (npy(X), {"Content-Type": NPY}, 200),
    (npy(X), {"Content-Type": NPY, "Accept": JSON}, 200),
    (npy(X), {"Content-Type": NPY, "Accept": f"{CSV};q=0.5, {JSON}"}, 200),
    (b"[[1, 2, 3, 4]]", {"Content-Type": JSON}, 200),
    (b'{"instances": [[1, 2, 3, 4]]}', {"Content-Type": JSON, "Accept": NPY}, 200),
    (b"1,2,3,4\n", {"Content-Type": CSV}, 200),
    (b"{not json", {"Content-Type": JSON}, 400),
    (b"[[1, 2], [3]]", {"Content-Type": JSON}, 400),
    (b"\x93NUMPY garbage", {"Content-Type": NPY}, 400),
    (b"", {"Content-Type": NPY}, 400),
    (b"1,2,3,4", {"Content-Type": "image/png"}, 415),
    (b"[[1, 2, 3, 4]]", {"Content-Type": JSON, "Accept": "image/png"}, 406),
    (npy(np.ones((1, 5), np.float32)), {"Content-Type": NPY}, 424),  # the model refuses it
    (npy(np.ones((1, 4), np.float32)), {}, 400),  # no Content-Type: JSON, which it is not
    (b"[[1, 2, 3, 4]" + b" " * 10_000 + b"]", {"Content-Type": JSON}, 200),  # near the limit
])
def test_the_fast_path_answers_as_the_asgi_path(server: Server, body: bytes,
                                                headers: dict[str, str], status: int) -> None:
    answer = answered_alike(server, body, headers)
    assert answer.status == status, answer.body
    if status == 200 and answer.headers["content-type"] == NPY and body[:6] == b"\x93NUMPY":
        np.testing.assert_allclose(from_npy(answer.body), expected(X), rtol=1e-5)


def test_both_paths_are_counted_alike_in_the_metrics(server: Server) -> None:
    before = {s: metric(server, "shoal_invocations_total", f'{{status="{s}"}}')
              for s in ("200", "415")}
    answered_alike(server, npy(X), {"Content-Type": NPY})
    answered_alike(server, b"1", {"Content-Type": "image/png"})
    assert metric(server, "shoal_invocations_total", '{status="200"}') == before["200"] + 2
    assert metric(server, "shoal_invocations_total", '{status="415"}') == before["415"] + 2


def test_the_api_key_is_checked_on_both_paths(keyed: Server) -> None:
    for headers in ({"Content-Type": NPY}, {"Content-Type": NPY, "Authorization": "Bearer no"},
                    {"Content-Type": NPY, "Authorization": f"Basic {KEY}"}):
        refused = answered_alike(keyed, npy(X), headers)
        assert refused.status == 401 and refused.headers["www-authenticate"] == "Bearer"
    ok = answered_alike(keyed, npy(X), {"Content-Type": NPY, "Authorization": f"Bearer {KEY}"})
    assert ok.status == 200
    np.testing.assert_allclose(from_npy(ok.body), expected(X), rtol=1e-5)


def test_pipelined_requests_are_answered_in_order_on_one_connection(server: Server) -> None:
    xs = [np.full((1, 4), i, np.float32) for i in range(4)]
    data = b"".join([
        request(npy(xs[0]), {"Content-Type": NPY}),
        request(npy(xs[1]), {"Content-Type": NPY}, chunked=True),  # behind a fast one
        b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n",
        request(npy(xs[2]), {"Content-Type": NPY}),
        request(b"{bad", {"Content-Type": JSON}),
        request(npy(xs[3]), {"Content-Type": NPY}),
    ])
    answers = exchange(server, data, 6)
    assert [a.status for a in answers] == [200, 200, 200, 200, 400, 200]
    for answer, x in zip([answers[0], answers[1], answers[3], answers[5]], xs, strict=True):
        np.testing.assert_allclose(from_npy(answer.body), expected(x), rtol=1e-5)
    assert answers[2].body == b'{"status":"healthy"}'


def test_a_request_split_over_many_packets_is_taken_whole(server: Server) -> None:
    data = request(npy(X), {"Content-Type": NPY})
    with socket.create_connection(("127.0.0.1", _port(server)), timeout=30) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(0, len(data), 7):
            sock.sendall(data[i:i + 7])
        answer = read_response(sock, bytearray())
    assert answer.status == 200
    np.testing.assert_allclose(from_npy(answer.body), expected(X), rtol=1e-5)


def test_connection_close_is_honoured(server: Server) -> None:
    data = request(npy(X), {"Content-Type": NPY, "Connection": "close"})
    with socket.create_connection(("127.0.0.1", _port(server)), timeout=30) as sock:
        sock.sendall(data)
        buffer = bytearray()
        answer = read_response(sock, buffer)
        assert answer.status == 200 and answer.headers["connection"] == "close"
        assert sock.recv(100) == b"" and not buffer  # closed after the answer


def test_many_requests_on_one_kept_alive_connection(server: Server) -> None:
    with socket.create_connection(("127.0.0.1", _port(server)), timeout=30) as sock:
        buffer = bytearray()
        for i in range(200):
            x = np.full((1, 4), i, np.float32)
            sock.sendall(request(npy(x), {"Content-Type": NPY}))
            answer = read_response(sock, buffer)
            assert answer.status == 200 and "connection" not in answer.headers
            np.testing.assert_allclose(from_npy(answer.body), expected(x), rtol=1e-5)


# --- the keep-alive timeout of fast requests: an in-process server with a short one -----------

class _FastEcho:
    """A minimal FastApp: POST /echo is answered fast with its body; the rest by ASGI."""

    open_paths = frozenset({"/ping"})
    fast_paths = frozenset({b"/echo"})
    fast_body_limit = 1024

    def fast_call(self, headers, body, reply) -> None:  # type: ignore[no-untyped-def]
        reply(200, body, b"application/octet-stream", ((b"x-path", b"fast"),))

    async def __call__(self, scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain"), (b"content-length", b"4"),
                                (b"x-path", b"asgi")]})
        await send({"type": "http.response.body", "body": b"asgi"})


def test_an_idle_fast_connection_is_closed_after_the_keep_alive_timeout() -> None:
    import uvicorn

    from shoal.serving._options import ServerOptions
    from shoal.serving.runner import bind, uvicorn_config

    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    config = uvicorn_config(_FastEcho(), ServerOptions(read_timeout_s=2))
    config.lifespan = "off"
    config.timeout_keep_alive = 1
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, 60, what="the in-process server")
        with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
            client.sendall(request(b"hello", {}, path="/echo"))
            buffer = bytearray()
            answer = read_response(client, buffer)
            assert (answer.status, answer.body, answer.headers["x-path"]) == (200, b"hello",
                                                                               "fast")
            client.sendall(request(b"hello", {}, path="/other"))
            assert read_response(client, buffer).headers["x-path"] == "asgi"
            client.sendall(request(b"again", {}, path="/echo"))
            assert read_response(client, buffer).body == b"again"
            # idle from now: the server closes the connection once the timeout (1 s) and the
            # guard's next sweep (at most 0.5 s here) have passed; recv sees the close
            client.settimeout(30)
            assert client.recv(10) == b""
        wait_until(lambda: not server.server_state.connections, 30,
                   what="the server to let the connection go")
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
