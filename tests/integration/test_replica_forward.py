"""A Serve replica whose model has its own environment forwards to a model server in it
(``shoal.endpoints._replica_env.Forward``): here against a real uvicorn server on 127.0.0.1,
driven as Serve drives an ASGI app."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from helpers import wait_until
from shoal.endpoints._replica_env import Forward

uvicorn = pytest.importorskip("uvicorn")


class _Upstream:
    """Echoes what it was sent; ``/stream`` answers in three chunks."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        seen = {"method": scope["method"], "raw_path": scope["raw_path"].decode("latin-1"),
                "query": scope["query_string"].decode("latin-1"), "body": body.decode(),
                "headers": {k.decode(): v.decode() for k, v in scope["headers"]}}
        self.requests.append(seen)
        if scope["path"] == "/stream":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/plain")]})
            for i in range(3):
                await send({"type": "http.response.body", "body": f"part {i}\n".encode(),
                            "more_body": True})
                await asyncio.sleep(0.05)
            await send({"type": "http.response.body", "body": b""})
            return
        payload = json.dumps(seen).encode()
        await send({"type": "http.response.start", "status": 418,
                    "headers": [(b"content-type", b"application/json"), (b"x-model", b"m1")]})
        await send({"type": "http.response.body", "body": payload})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def upstream() -> Iterator[tuple[_Upstream, int]]:
    app = _Upstream()
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off",
                                           log_config=None, access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 30, what="the upstream server to start")
    yield app, port
    server.should_exit = True
    thread.join(30)


def _call(app: Forward, scope: dict[str, Any], messages: list[dict[str, Any]]
          ) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def run() -> None:
        inbox = list(messages)

        async def receive() -> dict[str, Any]:
            return inbox.pop(0)

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        try:
            await app(scope, receive, send)
        finally:
            await app.aclose()

    asyncio.run(run())
    return sent


def _scope(path: str, raw_path: bytes, query: bytes = b"", method: str = "POST",
           headers: list[tuple[bytes, bytes]] | None = None) -> dict[str, Any]:
    return {"type": "http", "method": method, "path": path, "raw_path": raw_path,
            "query_string": query, "root_path": "", "headers": headers or []}


def _body(sent: list[dict[str, Any]]) -> bytes:
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def test_a_request_goes_through_with_its_path_query_headers_and_body(upstream):
    app, port = upstream
    sent = _call(Forward(port, "e1"),
                 _scope("/invocations", b"/invocations", b"a=1&b=%20",
                        headers=[(b"content-type", b"application/json"),
                                 (b"x-custom", b"yes"), (b"host", b"serve-proxy:8000")]),
                 [{"type": "http.request", "body": b"[[1, ", "more_body": True},
                  {"type": "http.request", "body": b"2]]", "more_body": False}])
    start = sent[0]
    assert start["status"] == 418  # the server's own status, whatever it is
    headers = dict(start["headers"])
    assert headers[b"x-model"] == b"m1" and headers[b"content-type"] == b"application/json"
    seen = json.loads(_body(sent))
    assert (seen["method"], seen["raw_path"], seen["query"]) == ("POST", "/invocations",
                                                                 "a=1&b=%20")
    assert seen["body"] == "[[1, 2]]"
    assert seen["headers"]["x-custom"] == "yes"
    assert seen["headers"]["host"] == f"127.0.0.1:{port}"  # the hop's own, not the proxy's


def test_the_raw_path_is_kept_and_a_raw_utf8_query_is_encoded_once(upstream):
    app, port = upstream
    sent = _call(Forward(port), _scope("/a/b", b"/a%2Fb", "q=ü".encode()),
                 [{"type": "http.request", "body": b""}])
    seen = json.loads(_body(sent))
    assert seen["raw_path"] == "/a%2Fb" and seen["query"] == "q=%C3%BC"
    sent = _call(Forward(port), _scope("//evil.com/x", b"//evil.com/x"),
                 [{"type": "http.request", "body": b""}])
    assert json.loads(_body(sent))["raw_path"] == "//evil.com/x"  # a path, never a host


def test_an_answer_streams_as_it_comes(upstream):
    app, port = upstream
    sent = _call(Forward(port), _scope("/stream", b"/stream", method="GET"),
                 [{"type": "http.request", "body": b""}])
    chunks = [m["body"] for m in sent if m["type"] == "http.response.body" and m["body"]]
    assert b"".join(chunks) == b"part 0\npart 1\npart 2\n"
    assert len(chunks) == 3  # one message per chunk the server sent, not one at the end


def test_a_client_that_leaves_mid_request_is_never_forwarded(upstream):
    app, port = upstream
    sent = _call(Forward(port), _scope("/invocations", b"/invocations"),
                 [{"type": "http.request", "body": b"[[1, ", "more_body": True},
                  {"type": "http.disconnect"}])
    assert sent == [] and app.requests == []


def test_a_server_that_is_gone_answers_502_naming_the_endpoint():
    sent = _call(Forward(_free_port(), "my-endpoint"), _scope("/invocations", b"/invocations"),
                 [{"type": "http.request", "body": b"[[1]]"}])
    assert sent[0]["status"] == 502
    error = json.loads(_body(sent))
    assert error["error"] == "bad gateway" and "'my-endpoint'" in error["detail"]
