"""The ASGI plumbing the servers share: the type aliases and ``AsgiApp``, which routes
``http`` scopes to ``_http`` and runs the lifespan protocol around ``on_startup`` and
``on_shutdown``."""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["AsgiApp", "Message", "Receive", "Scope", "Send"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class AsgiApp(abc.ABC):
    """An ASGI callable: requests go to ``_http``; at start-up ``on_startup`` runs on the
    event loop (it starts loading in the background and returns), at shutdown ``on_shutdown``
    is awaited."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.on_startup(asyncio.get_running_loop())
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

    @abc.abstractmethod
    async def on_shutdown(self) -> None:
        """Release what the app holds."""
