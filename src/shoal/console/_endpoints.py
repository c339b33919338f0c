"""The console's endpoints page: each endpoint's status, owner, instances and model, read
from the ``EndpointStore`` (the session's: the embedded store, or a team server's), and
each instance's load from its model server's ``/metrics`` (requests, mean latency, queue),
read in parallel with a short timeout so an instance that does not answer costs ~1 s once."""

from __future__ import annotations

import math
import urllib.error
import urllib.request
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from shoal.console._forms import require_csrf
from shoal.console._render import ago, page
from shoal.console._session import Principal, Sessions, utcnow
from shoal.core.auth import Scope
from shoal.core.endpoints import InstanceStatus
from shoal.core.ports import EndpointStore
from shoal.errors import ConfigError, ConflictError, InvalidArgumentError, PermissionDeniedError

__all__ = ["endpoint_routes", "load_of"]

_SCRAPE_TIMEOUT_S = 1.0


def _samples(text: str) -> dict[str, float]:
    """Prometheus text: each metric name's values summed over its labels."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name = head.split("{", 1)[0].strip()
        try:
            number = float(value)
        except ValueError:
            continue
        if name and not math.isnan(number):
            out[name] = out.get(name, 0.0) + number
    return out


def load_of(metrics_text: str) -> dict[str, str]:
    """What the page shows of a model server's ``/metrics``: requests so far, their mean
    latency, requests waiting."""
    values = _samples(metrics_text)
    count = values.get("shoal_invocation_latency_seconds_count", 0.0)
    total = values.get("shoal_invocation_latency_seconds_sum", 0.0)
    return {"requests": f"{values.get('shoal_invocations_total', 0.0):.0f}",
            "latency": f"{total / count * 1000:.1f} ms" if count else "",
            "queue": f"{values.get('shoal_queue_depth', 0.0):.0f}"}


def _scrape(url: str) -> dict[str, str]:
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=_SCRAPE_TIMEOUT_S) as r:  # noqa: S310 - the instance's own address
            return load_of(r.read(1 << 20).decode("utf-8", "replace"))
    except (OSError, ValueError) as e:
        return {"error": f"/metrics did not answer: {e}"}


def _scrape_all(urls: Iterable[str]) -> dict[str, dict[str, str]]:
    wanted = sorted(set(urls))
    if not wanted:
        return {}
    with ThreadPoolExecutor(max_workers=min(16, len(wanted))) as pool:
        return dict(zip(wanted, pool.map(_scrape, wanted), strict=True))


_INVOKE_TIMEOUT_S = 60.0
_SHOWN_BYTES = 64 * 1024
_CONTENT_TYPES = ("application/json", "text/csv", "text/plain")


def _invoke(url: str, body: bytes, content_type: str) -> tuple[int, str, str]:
    """POST *body* to an instance's ``/invocations``: (status, content type, text shown)."""
    request = urllib.request.Request(f"{url}/invocations", data=body, method="POST",
                                     headers={"Content-Type": content_type,
                                              "Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=_INVOKE_TIMEOUT_S) as r:  # noqa: S310 - the instance's own address
            return r.status, r.headers.get("content-type", ""), _shown(r.read(_SHOWN_BYTES + 1))
    except urllib.error.HTTPError as e:  # the model server's refusal, with its reason
        return e.code, e.headers.get("content-type", ""), _shown(e.read(_SHOWN_BYTES + 1))


def _shown(data: bytes) -> str:
    text = data[:_SHOWN_BYTES].decode("utf-8", "replace")
    return text + ("\n[… cut at 64 KiB]" if len(data) > _SHOWN_BYTES else "")


def endpoint_routes(endpoints: EndpointStore | None, sessions: Sessions) -> APIRouter:
    api = APIRouter()

    def detail(request: Request, name: str, **answer: Any) -> Response:
        if endpoints is None:
            raise ConfigError("this console was started without an endpoint store")
        record = endpoints.get_endpoint(name)
        return page(request, "endpoint.html", endpoint=record,
                    content_types=_CONTENT_TYPES, ready=[
                        i for i in record.instances if i.status == InstanceStatus.IN_SERVICE],
                    answer=answer or None)

    @api.get("/endpoints/{name:path}")
    def endpoint_page(request: Request, name: str) -> Response:
        return detail(request, name)

    @api.post("/endpoints/{name:path}/invoke")
    async def invoke(request: Request, name: str) -> Response:
        form = await require_csrf(sessions, request)
        principal: Principal = request.state.principal
        if not principal.scope.allows(Scope.WRITE):
            raise PermissionDeniedError(
                f"user {principal.user!r} signed in with a {principal.scope.value} token; "
                f"invoking endpoint {name!r} needs a write token", action="invoke",
                user=principal.user)
        if endpoints is None:
            raise ConfigError("this console was started without an endpoint store")
        record = endpoints.get_endpoint(name)
        ready = [i for i in record.instances if i.status == InstanceStatus.IN_SERVICE]
        if not ready:
            raise ConflictError(f"endpoint {name!r} has no instance in service (it is "
                                f"{record.status.value}); wait for it, or see "
                                f"'shoal endpoints describe {name}'", endpoint=name)
        content_type = form.get("content_type", "application/json")
        if content_type not in _CONTENT_TYPES:
            raise InvalidArgumentError(f"content type {content_type!r} is not one of "
                                       f"{', '.join(_CONTENT_TYPES)}", endpoint=name)
        body = form.get("body", "").encode()
        try:
            status, media, text = await run_in_threadpool(_invoke, ready[0].url, body,
                                                          content_type)
        except OSError as e:
            status, media, text = 0, "", f"{ready[0].url}/invocations did not answer: {e}"
        return detail(request, name, status=status, media=media, text=text,
                      sent=form.get("body", ""), content_type=content_type)

    @api.get("/endpoints")
    def endpoints_page(request: Request) -> Response:
        if endpoints is None:
            return page(request, "endpoints.html", endpoints=None)
        now = utcnow()
        found = endpoints.list_endpoints()
        loads = _scrape_all(i.url for e in found for i in e.instances
                            if i.status == InstanceStatus.IN_SERVICE)
        rows = [{"name": e.name, "status": e.status.value, "owner": e.owner,
                 "instance_type": e.config.instance_type,
                 "ready": sum(i.status == InstanceStatus.IN_SERVICE for i in e.instances),
                 "wanted": e.config.instance_count, "model_data": e.model_data,
                 "age": ago(e.created_at, now), "reason": e.failure_reason or "",
                 "instances": [{"url": i.url, "status": i.status.value,
                                "load": loads.get(i.url, {})} for i in e.instances]}
                for e in sorted(found, key=lambda e: e.name)]
        return page(request, "endpoints.html", endpoints=rows)

    return api
