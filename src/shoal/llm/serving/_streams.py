"""The LLM server's plumbing between the engine's thread and the requests' tasks (a channel
per generation, events handed over once per step) and the small pieces of HTTP every route
uses (JSON answers, a streamed body's chunks, the request fields' checks)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from shoal.llm.serving._engine import Generation, TokenEvent
from shoal.llm.serving._params import invalid
from shoal.serving.asgi import Receive, Send
from shoal.serving.http import ClientDisconnected, RequestError
from shoal.serving.http import respond as _respond

__all__ = ["Channel", "batches", "chunk", "deliver", "flag", "guarded", "only", "prompt_text",
           "respond_json", "start", "watch_disconnect"]

_JSON = b"application/json"


class Channel:
    """One generation's events on the event loop: ``put`` by ``_deliver``, taken all at once
    by the request's task."""

    __slots__ = ("closed", "events", "waiter")

    def __init__(self) -> None:
        self.events: list[TokenEvent] = []
        self.waiter: asyncio.Future[None] | None = None
        self.closed = False  # the client left: take() raises ClientDisconnected

    def put(self, event: TokenEvent) -> None:
        self.events.append(event)
        self._wake()

    def close(self) -> None:
        """The client is gone: the request's task stops waiting (a cancelled generation
        sends no last event)."""
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def take(self) -> list[TokenEvent]:
        """Every event that arrived since the last call (waits for one); raises
        ``ClientDisconnected`` once the channel is closed."""
        while not self.events:
            if self.closed:
                raise ClientDisconnected

            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        events, self.events = self.events, []
        return events


def deliver(events: list[tuple[Channel, TokenEvent]]) -> None:
    """On the loop: one engine step's events to their channels."""
    for channel, event in events:
        channel.put(event)


async def batches(channel: Channel) -> AsyncIterator[list[TokenEvent]]:
    """The generation's events, in the batches they arrive in, up to its last; an error event
    raises (after the events before it)."""
    while True:
        events = await channel.take()
        for i, event in enumerate(events):
            if event.error is not None:
                if i:
                    yield events[:i]
                raise RequestError(500, "generation failed", event.error)
            if event.finish is not None:
                yield events[:i + 1]
                return
        yield events


async def guarded(channel: Channel, send: Send, *, jsonlines: bool = False
                   ) -> AsyncIterator[list[TokenEvent]]:
    """The events of *channel* in batches, ending a stream already started with an error line
    instead of raising."""
    try:
        async for events in batches(channel):
            yield events
    except RequestError as e:
        payload = {"error": e.detail, "error_type": e.error}
        line = json.dumps(payload).encode()
        await chunk(send, line + b"\n" if jsonlines else b"data: " + line + b"\n\n")


async def watch_disconnect(receive: Receive, generations: list[Generation],
                           channels: list[Channel]) -> None:
    """When the client leaves: cancel its *generations* and close their *channels*, so the
    request's task ends (499) instead of waiting for events that will not come."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            for g in generations:
                g.cancel()
            for channel in channels:
                channel.close()
            return


def only(body: dict[str, Any], allowed: set[str]) -> None:
    extra = sorted(set(body) - allowed)
    if extra:
        raise invalid(f"unknown field(s) {extra}; the body takes {sorted(allowed)}")


def flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if not isinstance(value, bool):
        raise invalid(f"{name} must be true or false, got {value!r}")
    return value


def prompt_text(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise invalid(f"'{name}' must be a non-empty string, got {value!r}")
    return value



async def respond_json(send: Send, payload: Any) -> None:
    await _respond(send, 200, json.dumps(payload).encode(), _JSON)


async def start(send: Send, content_type: bytes) -> None:
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", content_type), (b"cache-control", b"no-cache")]})


async def chunk(send: Send, data: bytes, *, more: bool = True) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": more})
