"""Routes of the ``EndpointStore`` port: endpoint records, their transitions, supervisor
handles and instances. Each route is one store call (a transition's ``expected`` is checked
by the server's store, atomically), after the owner check of a change: everyone reads; a
new endpoint is its caller's; a transition, a handle, an instance and a delete need its owner
or an admin (``server/_owners.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Path, Request

from shoal.core.endpoints import (
    EndpointConfig,
    EndpointInstance,
    EndpointRecord,
    EndpointStatus,
)
from shoal.core.ports import EndpointStore
from shoal.server._owners import caller, require_owner
from shoal.server._wire_endpoints import (
    EndpointIn,
    EndpointOut,
    InstanceIn,
    SupervisorIn,
    TransitionIn,
)

__all__ = ["endpoint_files_guard", "endpoint_routes"]

_ENDPOINT = "/endpoints/{name}"
Index = Annotated[int, Path(ge=0)]


def endpoint_files_guard(store: EndpointStore) -> Callable[[Request, str, str], None]:
    """The artifact routes' check of a change under ``endpoints/<name>/`` (the model, code and
    requirements its supervisor stages): the endpoint's owner or an admin, while it exists;
    ``endpoints/`` as a whole: an admin."""

    def guard(request: Request, key: str, action: str) -> None:
        parts = key.strip("/").split("/")
        if parts[0] != "endpoints":
            return
        if len(parts) < 2 or not parts[1]:
            require_owner(request, "", action, "every endpoint's files")
            return
        record = store.find_endpoint(parts[1])
        if record is not None:
            require_owner(request, record.owner, action, f"the files of endpoint {parts[1]!r}")

    return guard


#: Called with the record and the instance a client records: raises for an address it may
#: not record (``ServerEndpoints.check_instance``: one its runtime did not report).
InstanceGuard = Callable[[EndpointRecord, EndpointInstance], None]


def endpoint_routes(store: EndpointStore,  # noqa: C901 - a closure per route
                    instance_guard: InstanceGuard | None = None) -> APIRouter:
    api = APIRouter(tags=["endpoints"])

    def own(request: Request, name: str, action: str) -> None:
        """The caller owns endpoint *name* (or is an admin); 404 when there is none."""
        require_owner(request, store.get_endpoint(name).owner, action, f"endpoint {name!r}")

    @api.post("/endpoints", status_code=201)
    def create_endpoint(request: Request, body: EndpointIn) -> EndpointOut:
        return EndpointOut.of(store.create_endpoint(
            body.name, model_data=body.model_data, config=EndpointConfig.from_json(body.config),
            owner=caller(request)))

    @api.get("/endpoints")
    def list_endpoints() -> list[EndpointOut]:
        return [EndpointOut.of(r) for r in store.list_endpoints()]

    @api.get(_ENDPOINT)
    def get_endpoint(name: str) -> EndpointOut:
        return EndpointOut.of(store.get_endpoint(name))

    @api.delete(_ENDPOINT)
    def delete_endpoint(name: str, request: Request) -> dict[str, bool]:
        record = store.find_endpoint(name)
        if record is None:
            return {"deleted": False}
        require_owner(request, record.owner, "delete", f"endpoint {name!r}")
        return {"deleted": store.delete_endpoint(name)}

    @api.post(_ENDPOINT + "/transitions")
    def update_endpoint(name: str, body: TransitionIn, request: Request) -> EndpointOut:
        own(request, name, "delete" if body.status == EndpointStatus.DELETING else "change")
        return EndpointOut.of(store.update_endpoint(
            name, status=body.status, expected=body.expected,
            failure_reason=body.failure_reason))

    @api.put(_ENDPOINT + "/supervisor", status_code=204)
    def set_endpoint_supervisor(name: str, body: SupervisorIn, request: Request) -> None:
        own(request, name, "change")
        store.set_endpoint_supervisor(name, body.handle)

    @api.put(_ENDPOINT + "/instances/{index}", status_code=204)
    def put_endpoint_instance(name: str, index: Index, body: InstanceIn,
                              request: Request) -> None:
        record = store.get_endpoint(name)
        require_owner(request, record.owner, "change", f"endpoint {name!r}")
        instance = body.instance(index)
        if instance_guard is not None:
            instance_guard(record, instance)
        store.put_endpoint_instance(name, instance)

    @api.delete(_ENDPOINT + "/instances", status_code=204)
    def remove_endpoint_instances(name: str, request: Request) -> None:
        own(request, name, "change")
        store.remove_endpoint_instances(name)

    return api
