"""Invoking endpoints through the team server: ``POST /endpoints/{name}/invocations``, the
SageMaker-runtime shape (``InvokeEndpoint``), so a client on another host reaches an endpoint
whose model servers listen on the server's host only.

The route forwards the request to one of the endpoint's instances in service (round-robin
over their addresses), streaming both ways: the body goes on as it comes (counted against
``SHOAL_SERVER_MAX_INVOCATION_BYTES``, refused at once when its ``Content-Length`` says it is
over), and the answer comes back as the model server sends it (an LLM's ``text/event-stream``
token by token), with its status, content type and ``X-Amzn-SageMaker-*`` headers as they
are, marked ``X-Shoal-Endpoint: <name>`` so a client tells a model server's refusal (a 415
for a content type it does not take) from the server's own errors, which are shoal's
``{"error": {code, ...}}``: 404 for an unknown endpoint, 503 ``EndpointNotInServiceError``
naming its status, 502 ``EndpointUnreachableError`` naming the endpoint when no instance
answers (``delivered``: whether the request may have reached one; a client retries only
one that did not).

Invoking needs a ``write`` token (the Authorizer's rule for a POST), as SageMaker's
``InvokeEndpoint`` is an action of its own, not a describe: a read token observes (records,
logs, metrics); invoking runs the deployer's code on the server's host with the caller's
input and spends its compute. A job's token reaches no endpoint.

Only endpoints this server started (their handle sealed, ``server/_endpoint_runtime.py``) are
passed on to: a record a client wrote names no address for the server to send to, and a
client records for those only addresses their runtime reports
(``ServerEndpoints.check_instance``), so no one points the route at an address of their
choosing.

One ``httpx.AsyncClient`` per app (pooled keep-alive connections to the model servers),
on the event loop: no thread per request. The record is read at most once a second per
endpoint (``_RECORD_TTL_S``), and again at once when an address stops answering.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from shoal.core.api import INVOCATION_HEADER
from shoal.core.endpoints import EndpointRecord, EndpointStatus
from shoal.core.ports import EndpointStore
from shoal.errors import (
    BackendUnavailableError,
    EndpointNotInServiceError,
    EndpointUnreachableError,
    PayloadTooLargeError,
)

if TYPE_CHECKING:
    import httpx

__all__ = ["DEFAULT_MAX_INVOCATION_BYTES", "Invoker", "invocation_routes"]

#: SageMaker's real-time payload limit, and the model server's default (``max_payload_mb``).
DEFAULT_MAX_INVOCATION_BYTES = 6 * 1024 * 1024
_RECORD_TTL_S = 1.0
#: A body (either way) of a declared length up to this is read whole, then sent in one go.
_SMALL = 64 * 1024
#: Request headers that go on to the model server (SageMaker runtime's, and the body's).
_FORWARD = ("content-type", "accept", "content-length")
_FORWARD_PREFIX = "x-amzn-sagemaker-"
#: Answer headers that stay behind (hop-by-hop, or the server's own).
_DROP = frozenset({"connection", "keep-alive", "transfer-encoding", "date", "server",
                   "proxy-connection", "te", "trailer", "upgrade"})


class _Body:
    """The request's body as it comes, counted; PayloadTooLargeError once past the limit."""

    def __init__(self, request: Request, name: str, limit: int) -> None:
        self._request, self._name, self._limit = request, name, limit
        self.started = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        self.started = True
        received = 0
        async for chunk in self._request.stream():
            received += len(chunk)
            if received > self._limit:
                raise _too_large(self._name, received, self._limit)
            if chunk:
                yield chunk


class Invoker:
    """The server's side of invocations: one pooled async client, the records it read."""

    def __init__(self, store: EndpointStore, *, started_here: Callable[[EndpointRecord], bool],
                 max_bytes: int = DEFAULT_MAX_INVOCATION_BYTES) -> None:
        self.store = store
        self.started_here = started_here
        self.max_bytes = max_bytes
        self._client: httpx.AsyncClient | None = None
        self._records: dict[str, tuple[float, EndpointRecord]] = {}
        self._turn = itertools.count()

    def client(self) -> httpx.AsyncClient:
        # Made on first use, in the event loop's thread: the server imports no httpx until
        # an endpoint is invoked through it (start-up, issue #20).
        if self._client is None:
            import httpx

            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(connect=5.0, read=600.0, write=60.0, pool=30.0),
                limits=httpx.Limits(max_keepalive_connections=64, max_connections=256,
                                    keepalive_expiry=60.0))
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def record(self, name: str, *, fresh: bool = False) -> EndpointRecord:
        now = time.monotonic()
        cached = self._records.get(name)
        if not fresh and cached is not None and cached[0] > now:
            return cached[1]
        record = await run_in_threadpool(self.store.get_endpoint, name)  # 404 when none
        if record.supervisor and not self.started_here(record):
            raise BackendUnavailableError(
                f"endpoint {name!r} was not started by this server (its handle is not one it "
                "sealed), so it does not pass requests on to it; invoke it where it was "
                "deployed, with that host's own settings", endpoint=name)
        self._records[name] = (now + _RECORD_TTL_S, record)
        return record

    def forget(self, name: str) -> None:
        self._records.pop(name, None)

    async def invoke(self, name: str, request: Request) -> Response:
        import httpx

        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            raise _too_large(name, int(declared), self.max_bytes)
        headers = {k: v for k, v in request.headers.items()
                   if k in _FORWARD or k.startswith(_FORWARD_PREFIX)}
        body: _Body | bytes = _Body(request, name, self.max_bytes)
        if declared is not None and declared.isdigit() and int(declared) <= _SMALL:
            body = await request.body()  # one write to the model server, not two
        record = await self.record(name)
        tried: list[str] = []
        last: Exception | None = None
        for attempt in range(2):  # the record as read, then once more freshly read
            urls = _serving_urls(record)
            start = next(self._turn)
            for i in range(len(urls)):
                url = urls[(start + i) % len(urls)]
                upstream = self.client().build_request(
                    "POST", f"{url}/invocations", headers=headers, content=body)
                try:
                    answer = await self.client().send(upstream, stream=True)
                except httpx.TransportError as e:
                    last = e
                    tried.append(url)
                    unsent = isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout,
                                            httpx.PoolTimeout))
                    if not unsent or isinstance(body, _Body) and body.started:
                        # it may have reached the model server: never sent twice (an
                        # invocation is not idempotent)
                        self.forget(name)
                        raise _unreachable(name, tried, e, delivered=True) from e
                    continue
                back = {**{k: v for k, v in answer.headers.items()
                           if k.lower() not in _DROP}, INVOCATION_HEADER: name}
                length = answer.headers.get("content-length")
                if length is not None and length.isdigit() and int(length) <= _SMALL:
                    try:  # a small answer whole: one write back
                        content = await answer.aread()
                    except httpx.TransportError as e:  # it went away while answering
                        self.forget(name)
                        raise _unreachable(name, [url], e, delivered=True) from e
                    finally:
                        await answer.aclose()
                    return Response(content, status_code=answer.status_code, headers=back)
                return StreamingResponse(answer.aiter_raw(), status_code=answer.status_code,
                                         headers=back,
                                         background=BackgroundTask(answer.aclose))
            if attempt == 0:
                record = await self.record(name, fresh=True)
        self.forget(name)
        raise _unreachable(name, tried, last, delivered=False)


def _serving_urls(record: EndpointRecord) -> list[str]:
    if record.status != EndpointStatus.IN_SERVICE and not record.serving:
        reason = f": {record.failure_reason}" if record.failure_reason else ""
        raise EndpointNotInServiceError(
            f"endpoint {record.name!r} is {record.status}, not InService{reason}; see "
            f"'shoal endpoints describe {record.name}'", endpoint=record.name,
            status=str(record.status))
    urls = list(dict.fromkeys(i.url for i in record.serving))
    if not urls:
        raise EndpointNotInServiceError(
            f"endpoint {record.name!r} is {record.status} but none of its instances is in "
            "service now (restarting?); try again shortly", endpoint=record.name,
            status=str(record.status))
    return urls


def _unreachable(name: str, tried: list[str], e: Exception | None, *,
                 delivered: bool) -> EndpointUnreachableError:
    shown = ", ".join(dict.fromkeys(tried)) or "none"
    what = f"{type(e).__name__}: {e}" if e is not None else "no address"
    return EndpointUnreachableError(
        f"endpoint {name!r}: the server could not reach its model server (tried {shown}; "
        f"{what})" + ("; the request may have reached it, so it was not sent again"
                      if delivered else ""), endpoint=name, delivered=delivered)


def _too_large(name: str, size: int, limit: int) -> PayloadTooLargeError:
    return PayloadTooLargeError(
        f"the request to endpoint {name!r} is over this server's invocation limit of {limit} "
        f"bytes (at least {size} bytes); nothing was sent to the endpoint. The server's "
        "SHOAL_SERVER_MAX_INVOCATION_BYTES sets the limit", endpoint=name, limit=limit,
        size=size)


def invocation_routes(invoker: Invoker) -> APIRouter:
    api = APIRouter(tags=["endpoints"])

    @api.post("/endpoints/{name}/invocations", response_class=Response,
              responses={200: {"description": "the model server's answer, as it sent it"}})
    async def invoke_endpoint(name: str, request: Request) -> Any:
        return await invoker.invoke(name, request)

    return api
