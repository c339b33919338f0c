"""The console's endpoints page: each endpoint's status, owner, instances and model, read
from the ``EndpointStore`` (the session's: the embedded store, or a team server's), and
each instance's load from its model server's ``/metrics`` (requests, mean latency, queue),
read in parallel with a short timeout so an instance that does not answer costs ~1 s once;
every scrape also goes into the console's ``LoadHistory``, whose rate and latency over
time an endpoint's page draws (``/endpoints/{name}/load``, polled by ``endpoints.js``)."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response

from shoal.console._forms import require_csrf
from shoal.console._load import LoadHistory, Sample, sample_of
from shoal.console._render import ago, page
from shoal.console._session import Principal, Sessions, utcnow
from shoal.core.auth import Scope
from shoal.core.endpoints import EndpointRecord, InstanceStatus
from shoal.core.ports import EndpointStore
from shoal.errors import ConfigError, ConflictError, InvalidArgumentError, PermissionDeniedError

__all__ = ["endpoint_routes", "load_of"]

_SCRAPE_TIMEOUT_S = 1.0


def _shown_load(sample: Sample) -> dict[str, str]:
    count, total = sample.latency_count, sample.latency_sum
    return {"requests": f"{sample.requests:.0f}",
            "latency": f"{total / count * 1000:.1f} ms" if count else "",
            "queue": f"{sample.queue:.0f}"}


def load_of(metrics_text: str) -> dict[str, str]:
    """What the page shows of a model server's ``/metrics``: requests so far, their mean
    latency, requests waiting."""
    return _shown_load(sample_of(metrics_text))


def _scrape(url: str) -> Sample | str:
    """The instance's counters, or why its ``/metrics`` did not answer."""
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=_SCRAPE_TIMEOUT_S) as r:  # noqa: S310 - the instance's own address
            return sample_of(r.read(1 << 20).decode("utf-8", "replace"))
    except (OSError, ValueError) as e:
        return f"/metrics did not answer: {e}"


def _scrape_all(urls: Iterable[str]) -> dict[str, Sample | str]:
    wanted = sorted(set(urls))
    if not wanted:
        return {}
    with ThreadPoolExecutor(max_workers=min(16, len(wanted))) as pool:
        return dict(zip(wanted, pool.map(_scrape, wanted), strict=True))


def _in_service(record: EndpointRecord) -> list[str]:
    return [i.url for i in record.instances if i.status == InstanceStatus.IN_SERVICE]


def _remember(history: LoadHistory, record: EndpointRecord,
              found: Mapping[str, Sample | str], at: float) -> None:
    history.record(record.name, at, {url: s for url in _in_service(record)
                                     if isinstance(s := found.get(url), Sample)})


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
    history = LoadHistory()  # this console's scrapes: its charts start when one is viewed

    def detail(request: Request, name: str, **answer: Any) -> Response:
        if endpoints is None:
            raise ConfigError("this console was started without an endpoint store")
        record = endpoints.get_endpoint(name)
        return page(request, "endpoint.html", endpoint=record,
                    content_types=_CONTENT_TYPES, ready=[
                        i for i in record.instances if i.status == InstanceStatus.IN_SERVICE],
                    answer=answer or None)

    @api.get("/endpoints/{name:path}/load")
    def endpoint_load(name: str) -> JSONResponse:
        """Scrape the endpoint's instances in service now; its load over the scrapes this
        console has kept (``LoadHistory.series``), and each instance's totals."""
        if endpoints is None:
            raise ConfigError("this console was started without an endpoint store")
        record = endpoints.get_endpoint(name)
        found = _scrape_all(_in_service(record))
        _remember(history, record, found, time.time())
        return JSONResponse({**history.series(name), "instances": [
            {"url": url, **(_shown_load(got) if isinstance(got, Sample) else {"error": got})}
            for url, got in found.items()]})

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

    def listing(request: Request, template: str) -> Response:
        if endpoints is None:
            return page(request, template, endpoints=None)
        now = utcnow()
        found = endpoints.list_endpoints()
        scraped = _scrape_all(url for e in found for url in _in_service(e))
        at = time.time()
        for e in found:
            _remember(history, e, scraped, at)
        loads = {url: _shown_load(got) if isinstance(got, Sample) else {"error": got}
                 for url, got in scraped.items()}

        def rate(name: str) -> str:
            series = history.series(name)["rate"]
            return f"{series[-1]:.2f}" if series else ""

        rows = [{"name": e.name, "status": e.status.value, "owner": e.owner,
                 "instance_type": e.config.instance_type,
                 "ready": sum(i.status == InstanceStatus.IN_SERVICE for i in e.instances),
                 "wanted": e.config.instance_count, "model_data": e.model_data,
                 "age": ago(e.created_at, now), "reason": e.failure_reason or "",
                 "rate": rate(e.name) if _in_service(e) else "",
                 "instances": [{"url": i.url, "status": i.status.value,
                                "load": loads.get(i.url, {})} for i in e.instances]}
                for e in sorted(found, key=lambda e: e.name)]
        return page(request, template, endpoints=rows)

    @api.get("/endpoints")
    def endpoints_page(request: Request) -> Response:
        return listing(request, "endpoints.html")

    @api.get("/endpoints-rows")
    def endpoints_rows(request: Request) -> Response:
        """The list's rows, which it fetches again every 3 s (live load and rate)."""
        return listing(request, "_endpoint_rows.html")

    return api
