"""The warm path's writes (``POST /api/v1/launches/batch``, ``POST /api/v1/job-transitions``)
answered in front of FastAPI.

Each warm ``@remote`` call through a team server makes one of each, one after the other on
its critical path, and FastAPI's own path (middleware, the match over every route, the
dependency solver, a hop through anyio's thread pool, the response model validated again) was
1-4 ms of each before the route's code began (docs/performance.md, "Team server"). Here the
request is matched by method and path, its body parsed by the route's own pydantic model
(``model_validate_json``), authorized by the same ``Authorizer`` (with the route's name in the
scope, as FastAPI puts it there, so the job-token rules are the same), and the route's own
function called (its blocking part on a small thread pool of its own); its answer is serialized as FastAPI would and
errors get the app's error bodies. A body that does not parse goes on to FastAPI unchanged
(replayed), so a bad request gets FastAPI's own answer; FastAPI still declares the routes
(the OpenAPI document is unchanged).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from fastapi import APIRouter
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from shoal.core.api import API_PREFIX
from shoal.errors import ShoalError

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from shoal.server._auth import Authorizer

__all__ = ["FAST_WRITES", "FastWrites"]

logger = logging.getLogger(__name__)

#: The routes answered here: (method, path under the API prefix).
FAST_WRITES = (("POST", "/launches/batch"), ("POST", "/job-transitions"))
#: The long poll of a warm worker's messages (its route's path and its parameters' types).
_MESSAGES = "/launches/{launch}/messages"
_MESSAGE_PARAMS: dict[str, Callable[[str], Any]] = {"after": int, "timeout": float}
_WRITERS = 4


@dataclass(frozen=True, slots=True)
class _Route:
    route: APIRoute  # its name is what the Authorizer's job-token rules read
    endpoint: Callable[..., Any]
    body: type[BaseModel]
    status: int


class FastWrites:
    """ASGI app: the ``FAST_WRITES`` routes of *fastapi* here, everything else to *app*."""

    def __init__(self, app: ASGIApp, routers: Sequence[APIRouter], authorizer: Authorizer,
                 error_answer: Callable[[str, str, ShoalError], ASGIApp]) -> None:
        """*routers*: the routers (as declared, before the app includes them under the API
        prefix) that hold the ``FAST_WRITES`` routes."""
        self.app = app
        self._authorizer = authorizer
        self._error_answer = error_answer
        self._routes: dict[tuple[str, str], _Route] = {}
        self._messages_route: APIRoute | None = None
        for router in routers:
            for route in router.routes:
                if not isinstance(route, APIRoute):
                    continue
                for method in route.methods or ():
                    if (method, route.path) in FAST_WRITES:
                        self._routes[(method, API_PREFIX + route.path)] = _Route(
                            route, route.endpoint, _body_model(route.endpoint),
                            int(route.status_code or 200))
                if route.path == _MESSAGES and "GET" in (route.methods or ()):
                    self._messages_route = route
        missing = {API_PREFIX + p for _, p in FAST_WRITES} - {p for _, p in self._routes}
        if missing:
            raise RuntimeError(f"the routers declare no route for {sorted(missing)}")
        self._pool = ThreadPoolExecutor(_WRITERS, thread_name_prefix="shoal-fast-writes")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = self._routes.get((scope.get("method", ""), scope.get("path", ""))) \
            if scope["type"] == "http" else None
        if found is None:
            launch = _messages_of(scope) if self._messages_route is not None else None
            params = None if launch is None else _params(scope)
            if launch is None or params is None:
                await self.app(scope, receive, send)
            else:
                await self._poll(scope, receive, send, launch, params)
            return
        raw = await _read_body(receive)
        try:
            body = found.body.model_validate_json(raw)
        except ValidationError:  # FastAPI's own answer to a bad body
            await self.app(scope, _replay(raw, receive), send)
            return
        scope["route"] = found.route
        scope.setdefault("path_params", {})
        request = Request(scope, _replay(raw, receive))
        try:
            await self._authorizer(request)
            loop = asyncio.get_running_loop()
            parts = getattr(found.endpoint, "fast_parts", None)  # (blocking part, the rest)
            if parts is not None:
                blocking, rest = parts
                answer = await loop.run_in_executor(self._pool, blocking, body, request)
                answer = await rest(answer, body, request)
            elif inspect.iscoroutinefunction(found.endpoint):
                answer = await found.endpoint(body=body, request=request)
            else:
                answer = await loop.run_in_executor(
                    self._pool, lambda: found.endpoint(body=body, request=request))
        except ShoalError as e:
            await self._error_answer(scope["method"], scope["path"], e)(scope, receive, send)
            return
        data = answer.model_dump_json().encode() if isinstance(answer, BaseModel) else \
            json.dumps(answer, separators=(",", ":")).encode()
        await _answer(send, found.status, data)


    async def _poll(self, scope: Scope, receive: Receive, send: Send, launch: str,
                    params: dict[str, Any]) -> None:
        """``GET /launches/{launch}/messages``: the route's own (async) function."""
        route = self._messages_route
        assert route is not None
        scope["route"] = route
        scope["path_params"] = {"launch": launch}
        request = Request(scope, receive)
        try:
            await self._authorizer(request)
            answer = await route.endpoint(launch=launch, request=request, **params)
        except ShoalError as e:
            await self._error_answer(scope["method"], scope["path"], e)(scope, receive, send)
            return
        await _answer(send, 200, answer.model_dump_json().encode())


def _messages_of(scope: Scope) -> str | None:
    """The launch of a plain ``GET /api/v1/launches/{launch}/messages``, else None."""
    if scope["type"] != "http" or scope["method"] != "GET":
        return None
    path: str = scope["path"]
    head, tail = f"{API_PREFIX}/launches/", "/messages"
    if not (path.startswith(head) and path.endswith(tail)):
        return None
    launch = path[len(head):-len(tail)]
    return launch if launch and "/" not in launch else None


def _params(scope: Scope) -> dict[str, Any] | None:
    """The poll's ``after`` and ``timeout``; None when they are not plain non-negative
    numbers (FastAPI then answers, with its own error)."""
    out: dict[str, Any] = {}
    for name, value in parse_qsl(scope.get("query_string", b"").decode("latin-1"),
                                 keep_blank_values=True):
        kind = _MESSAGE_PARAMS.get(name)
        if kind is None or name in out:
            return None
        try:
            out[name] = kind(value)
        except ValueError:
            return None
        if not out[name] >= 0:  # also NaN
            return None
    return out


async def _answer(send: Send, status: int, data: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


def _body_model(endpoint: Callable[..., Any]) -> type[BaseModel]:
    """The pydantic model of the route's ``body`` parameter."""
    annotation = inspect.signature(endpoint, eval_str=True).parameters["body"].annotation
    if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
        raise TypeError(f"route {endpoint.__name__} takes no pydantic body")
    return annotation


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client went away: nothing to answer
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(chunks)


def _replay(raw: bytes, receive: Receive) -> Receive:
    """*receive* that first gives the body already read."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        return await receive()

    return again
