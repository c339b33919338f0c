"""The console's endpoints page: each endpoint's status, owner, instances and model, read
from the ``EndpointStore`` (the session's: the embedded store, or a team server's), and
each instance's load from its model server's ``/metrics`` (requests, mean latency, queue),
read in parallel with a short timeout so an instance that does not answer costs ~1 s once."""

from __future__ import annotations

import math
import urllib.request
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from fastapi import APIRouter, Request
from starlette.responses import Response

from shoal.console._render import ago, page
from shoal.console._session import utcnow
from shoal.core.endpoints import InstanceStatus
from shoal.core.ports import EndpointStore

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


def endpoint_routes(endpoints: EndpointStore | None) -> APIRouter:
    api = APIRouter()

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
