"""The console's endpoints page: each endpoint's status, owner, instances and model; read
from the ``EndpointStore`` (none through a team server's client yet: the page says so)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from shoal.console._render import ago, page
from shoal.console._session import utcnow
from shoal.core.endpoints import InstanceStatus
from shoal.core.ports import EndpointStore

__all__ = ["endpoint_routes"]


def endpoint_routes(endpoints: EndpointStore | None) -> APIRouter:
    api = APIRouter()

    @api.get("/endpoints")
    def endpoints_page(request: Request) -> Response:
        if endpoints is None:
            return page(request, "endpoints.html", endpoints=None)
        now = utcnow()
        rows = [{"name": e.name, "status": e.status.value, "owner": e.owner,
                 "instance_type": e.config.instance_type,
                 "ready": sum(i.status == InstanceStatus.IN_SERVICE for i in e.instances),
                 "wanted": e.config.instance_count, "model_data": e.model_data,
                 "age": ago(e.created_at, now), "reason": e.failure_reason or "",
                 "urls": [i.url for i in e.instances]}
                for e in sorted(endpoints.list_endpoints(), key=lambda e: e.name)]
        return page(request, "endpoints.html", endpoints=rows)

    return api
