"""The team server's invocation route streams both ways (``server/_invocations.py``): real
uvicorn servers on 127.0.0.1, one the route (``Invoker`` over a real SQLite endpoint store),
one a model server stand-in that streams its answer and counts the body it receives.

An answer's first part reaches the client while the model server still holds back the rest
(it waits for the client to say it got it: no timing); a body sent in chunks, of no declared
length, arrives whole and is refused (413) as its count passes the limit; headers go on."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from helpers import wait_until
from shoal.core.endpoints import EndpointConfig, EndpointInstance, EndpointStatus, InstanceStatus
from shoal.storage.sql import SqlMetadataStore

LIMIT = 256 * 1024


class _ModelServer:
    """``POST /invocations``: ``/stream`` bodies answer ``first`` then, once the client has
    it (``go``), ``second``; others echo what they received (size, headers)."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.waited: list[bool] = []
        self.received: list[dict[str, Any]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        size, more = 0, True
        while more:
            message = await receive()
            size += len(message.get("body", b""))
            more = message.get("more_body", False)
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.received.append({"size": size, "headers": headers})
        if headers.get("accept") == "text/event-stream":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            await send({"type": "http.response.body", "body": b"data: first\n\n",
                        "more_body": True})
            got = await asyncio.get_running_loop().run_in_executor(None, self.go.wait, 60)
            self.waited.append(got)
            await send({"type": "http.response.body", "body": b"data: second\n\n"})
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"x-amzn-sagemaker-custom-attributes", b"seen")]})
        await send({"type": "http.response.body", "body": str(size).encode()})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(app: Any, lifespan: str = "off") -> tuple[uvicorn.Server, threading.Thread, int]:
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, lifespan=lifespan,
                                           log_config=None, access_log=False, ws="none"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 30, what="a server to start")
    return server, thread, port


@pytest.fixture
def route(tmp_path: Path) -> Iterator[tuple[str, _ModelServer]]:
    from fastapi import FastAPI

    from shoal.errors import ShoalError
    from shoal.server._invocations import Invoker, invocation_routes
    from shoal.server.app import _shoal_error

    model = _ModelServer()
    upstream, up_thread, up_port = _serve(model)
    store = SqlMetadataStore.open(f"sqlite:///{tmp_path / 'shoal.db'}", create=True)
    store.create_endpoint("streamer", model_data="m", config=EndpointConfig())
    store.set_endpoint_supervisor("streamer", {"pid": 1, "seal": "trusted in this test"})
    store.put_endpoint_instance("streamer", EndpointInstance(
        0, "127.0.0.1", up_port, None, InstanceStatus.IN_SERVICE))
    store.update_endpoint("streamer", status=EndpointStatus.IN_SERVICE)
    invoker = Invoker(store, started_here=lambda r: True, max_bytes=LIMIT)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await invoker.aclose()  # its pooled connections, on the loop that opened them

    app = FastAPI(lifespan=lifespan)
    app.include_router(invocation_routes(invoker), prefix="/api/v1")
    app.add_exception_handler(ShoalError, _shoal_error)
    proxy, proxy_thread, port = _serve(app, lifespan="on")
    try:
        yield f"http://127.0.0.1:{port}/api/v1/endpoints/streamer/invocations", model
    finally:
        model.go.set()
        for server, thread in ((proxy, proxy_thread), (upstream, up_thread)):
            server.should_exit = True
            thread.join(30)
        store.close()


def test_an_answer_streams_through_as_the_model_server_sends_it(route):
    url, model = route
    with httpx.stream("POST", url, content=b"{}", timeout=90,
                      headers={"Content-Type": "application/json",
                               "Accept": "text/event-stream"}) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"] == "text/event-stream"
        assert answer.headers["x-shoal-endpoint"] == "streamer"
        parts = answer.iter_raw()
        first = next(parts)
        assert first.startswith(b"data: first")  # while the model server holds the rest
        model.go.set()
        rest = b"".join(parts)
    assert b"data: second" in first + rest
    assert model.waited == [True]  # it waited for the client's word, not its 60 s


def test_a_chunked_body_streams_on_and_is_counted_against_the_limit(route):
    url, model = route

    def chunks(n: int) -> Iterator[bytes]:
        for _ in range(n):
            yield b"x" * (64 * 1024)

    answer = httpx.post(url, content=chunks(3), timeout=60, headers={
        "Content-Type": "application/octet-stream", "X-Amzn-SageMaker-Custom-Attributes": "a=1",
        "Authorization": "Bearer not-for-the-model-server"})
    assert answer.status_code == 200, answer.text
    assert answer.text == str(3 * 64 * 1024)
    assert answer.headers["x-amzn-sagemaker-custom-attributes"] == "seen"
    [seen] = model.received
    assert seen["headers"]["x-amzn-sagemaker-custom-attributes"] == "a=1"
    assert seen["headers"]["content-type"] == "application/octet-stream"
    assert "authorization" not in seen["headers"]  # the caller's token stays with the server

    over = httpx.post(url, content=chunks(5), timeout=60,
                      headers={"Content-Type": "application/octet-stream"})
    assert over.status_code == 413, over.text
    assert over.json()["error"]["code"] == "PAYLOAD_TOO_LARGE"
    assert "x-shoal-endpoint" not in over.headers
    declared = httpx.post(url, content=b"x" * (LIMIT + 1), timeout=60)
    assert declared.status_code == 413 and "nothing was sent" in declared.text
    assert len(model.received) <= 2  # the declared one never reached the model server
