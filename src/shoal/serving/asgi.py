"""The ASGI plumbing the servers share: the type aliases and ``AsgiApp``, which checks the
API key, routes ``http`` scopes to ``_http`` and runs the lifespan protocol around
``on_startup`` and ``on_shutdown``."""

from __future__ import annotations

import abc
import asyncio
import hmac
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from shoal.serving.http import respond_error, unauthorized

__all__ = ["AsgiApp", "Message", "Receive", "Scope", "Send", "api_key_bytes", "authorized"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def api_key_bytes(key: str | None) -> bytes | None:
    """The key as the servers compare it (UTF-8, surrounding blanks dropped)."""
    return None if key is None else key.strip().encode()


class AsgiApp(abc.ABC):
    """An ASGI callable: requests go to ``_http``; at start-up ``on_startup`` runs on the
    event loop (it starts loading in the background and returns), at shutdown ``on_shutdown``
    is awaited.

    With ``api_key`` set (subclasses set it from ``ServerOptions.api_key``), a request to a
    path outside ``open_paths`` needs ``Authorization: Bearer KEY``, else ``_unauthorized``
    answers it (401)."""

    api_key: bytes | None = None
    open_paths: frozenset[str] = frozenset({"/ping"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            if self.api_key is not None and scope["path"] not in self.open_paths \
                    and not _authorized(scope, self.api_key):
                await self._unauthorized(scope, send)
                return
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _unauthorized(self, scope: Scope, send: Send) -> None:
        await respond_error(send, unauthorized())

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.on_startup(asyncio.get_running_loop())
                await self.started()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.on_shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    @abc.abstractmethod
    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer one HTTP request."""

    @abc.abstractmethod
    def on_startup(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start loading the model (without waiting for it)."""

    async def started(self) -> None:  # noqa: B027 (a hook: most apps listen at once)
        """Awaited after ``on_startup``; the server listens once it returns (at once here)."""

    @abc.abstractmethod
    async def on_shutdown(self) -> None:
        """Release what the app holds."""


def _authorized(scope: Scope, key: bytes) -> bool:
    return authorized(scope["headers"], key)


def authorized(headers: list[tuple[bytes, bytes]], key: bytes) -> bool:
    """Whether the request's ``Authorization`` header is ``Bearer KEY`` (the token compared
    in constant time)."""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), key)
    return False
