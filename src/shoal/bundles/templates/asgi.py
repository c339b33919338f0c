"""ASGI app serving the bundled ONNX model with the SageMaker contract; run it with uvicorn.

``GET /ping`` answers 200 once the model is loaded; ``POST /invocations`` (and
``POST /<route>``) with ``{"data": [...]}`` answers e.g. ``{"digits": [7]}``; ``"raw": true`` or
``?raw=1`` adds the model's outputs. ``python <this file> [serve] [--port 8080]`` starts
uvicorn, as SageMaker starts a bring-your-own container (``docker run IMAGE serve``).
"""

import argparse
import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl

from runtime import get_model, handle

ROUTE = "classify"
MAX_BODY_BYTES = 100 * 1024 * 1024

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    if scope["type"] != "http":
        return
    path, method = scope["path"].rstrip("/") or "/", scope["method"]
    if path == "/ping":
        status, body = await asyncio.get_running_loop().run_in_executor(None, _ping)
    elif path in ("/invocations", f"/{ROUTE}") and method == "POST":
        status, body = await _invoke(scope, receive)
    elif path in ("/invocations", f"/{ROUTE}"):
        status, body = 405, b'{"error":"use POST"}'
    else:
        status, body = 404, b'{"error":"not found: POST /invocations, GET /ping"}'
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _ping() -> tuple[int, bytes]:
    try:
        get_model()
    except Exception as e:  # SageMaker reads anything but 200 as unhealthy
        return 503, json.dumps({"status": "model failed to load", "error": str(e)}).encode()
    return 200, b'{"status":"ok"}'


async def _invoke(scope: Scope, receive: Receive) -> tuple[int, bytes]:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return 400, b'{"error":"client disconnected"}'
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return 413, json.dumps({"error": f"body over {MAX_BODY_BYTES} bytes"}).encode()
        chunks.append(chunk)
        if not message.get("more_body"):
            break
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
    # onnxruntime releases the GIL: run it on a thread, keeping the event loop responsive.
    return await asyncio.get_running_loop().run_in_executor(
        None, handle, b"".join(chunks), headers.get("content-type"), query)


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            try:
                await asyncio.get_running_loop().run_in_executor(None, get_model)
            except Exception as e:
                await send({"type": "lifespan.startup.failed", "message": str(e)})
                return
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve the bundled model over HTTP.")
    parser.add_argument("command", nargs="?", default="serve", choices=["serve"],
                        help="SageMaker starts a container with 'serve'")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (the container image passes 0.0.0.0)")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args(argv)
    import uvicorn

    uvicorn.run(app, host=args.host, port=args.port, log_level="info")


if __name__ == "__main__":
    main()
