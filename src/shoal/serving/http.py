"""The model server's refusals: one exception carrying an HTTP status, and its JSON body.

Only the server's own ASGI app turns these into responses; they never leave the process.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["ClientDisconnected", "RequestError", "error_body", "read_body", "respond",
           "respond_error", "unauthorized"]


class RequestError(Exception):
    """A request the server answers with *status* and ``{"error": error, "detail": detail}``."""

    def __init__(self, status: int, error: str, detail: str,
                 headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        super().__init__(f"{status} {error}: {detail}")
        self.status = status
        self.error = error
        self.detail = detail
        self.headers = headers


def error_body(error: str, detail: str) -> bytes:
    return json.dumps({"error": error, "detail": detail}).encode()


async def respond(send: Callable[[MutableMapping[str, Any]], Awaitable[None]], status: int,
                  body: bytes, content_type: bytes,
                  headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    """One whole ASGI response: status, content type and length, *headers*, body."""
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type),
                            (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


async def respond_error(send: Callable[[MutableMapping[str, Any]], Awaitable[None]],
                        error: RequestError) -> None:
    """*error* as the server's JSON refusal (with its headers, e.g. ``Retry-After``)."""
    await respond(send, error.status, error_body(error.error, error.detail),
                  b"application/json", error.headers)


def bad_request(detail: str) -> RequestError:
    return RequestError(400, "bad request", detail)


def unauthorized() -> RequestError:
    """401 for a request without the server's API key."""
    return RequestError(401, "unauthorized",
                        "this server needs its API key: send the header 'Authorization: Bearer "
                        "KEY' (the key the server was started with: --api-key or "
                        "SHOAL_API_KEY)", headers=((b"www-authenticate", b"Bearer"),))


def model_error(exc: BaseException) -> RequestError:
    """424, SageMaker's status for "the model raised", with the model's own message."""
    message = str(exc) or type(exc).__name__
    return RequestError(424, "model error", f"{type(exc).__name__}: {message}")


class ClientDisconnected(Exception):
    """The client went away before sending its whole body."""


async def read_body(receive: Callable[[], Awaitable[MutableMapping[str, Any]]], limit: int,
                    length: int | None = None) -> bytes:
    """The request's body from ASGI *receive*: 413 above *limit* bytes (at once when the
    ``Content-Length`` *length* says so), ``ClientDisconnected`` when the client leaves."""
    if length is not None and length > limit:
        raise _too_large(f"Content-Length is {length}", limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(f"more than {limit} bytes arrived", limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _too_large(what: str, limit: int) -> RequestError:
    return RequestError(413, "payload too large",
                        f"{what}; the limit is {limit / 1048576:g} MB (--max-payload-mb, "
                        f"SHOAL_MODEL_SERVER_MAX_PAYLOAD_MB)")
