"""``HttpEndpointStore``: the ``EndpointStore`` port (endpoint records, transitions,
supervisor handles, instances) over a team server. Each method is one request and one store
call on the server; transitions are POSTs, never retried.

``HttpEndpointBackend``: the ``EndpointBackend`` port over the same server, whose own endpoint
backends run the endpoints on its host (``server/_endpoint_runtime.py``): the client's
``EndpointService`` records, uploads and waits; the server starts, looks and stops."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any
from urllib.parse import quote

from shoal.client.http import ServerConnection
from shoal.core.endpoints import (
    EndpointConfig,
    EndpointInstance,
    EndpointRecord,
    EndpointStatus,
    InstanceStatus,
    RuntimeState,
    RuntimeView,
)
from shoal.core.ports import Handle
from shoal.errors import EndpointNotFound

__all__ = ["HttpEndpointBackend", "HttpEndpointStore"]

#: One delete waits at most this long on the server (below the connection's 30 s timeout).
_DELETE_WAIT_S = 25.0


def endpoint_record(body: Mapping[str, Any]) -> EndpointRecord:
    """An ``EndpointRecord`` from the server's JSON (``server._wire_endpoints.EndpointOut``)."""
    return EndpointRecord(
        name=body["name"], status=EndpointStatus(body["status"]),
        model_data=body["model_data"], config=EndpointConfig.from_json(body["config"]),
        created_at=datetime.fromisoformat(body["created_at"]),
        updated_at=datetime.fromisoformat(body["updated_at"]),
        failure_reason=body["failure_reason"],
        instances=tuple(EndpointInstance(int(i["index"]), i["host"], int(i["port"]), i["pid"],
                                         InstanceStatus(i["status"]), int(i["restarts"]),
                                         i["path"]) for i in body["instances"]),
        supervisor=dict(body["supervisor"]), owner=str(body.get("owner", "local")))


class HttpEndpointStore:
    """Endpoints through ``shoal server``'s ``/api/v1``."""

    def __init__(self, connection: ServerConnection) -> None:
        self._http = connection

    @classmethod
    def open(cls, url: str, token: str | None) -> HttpEndpointStore:
        return cls(ServerConnection(url, token))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> HttpEndpointStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create_endpoint(self, name: str, *, model_data: str, config: EndpointConfig,
                        owner: str = "local") -> EndpointRecord:
        # *owner* is not sent: the server records its caller's user.
        return endpoint_record(self._http.call("POST", "/endpoints", json={
            "name": name, "model_data": model_data, "config": config.to_json()}))

    def find_endpoint(self, name: str) -> EndpointRecord | None:
        try:
            return self.get_endpoint(name)
        except EndpointNotFound:
            return None

    def get_endpoint(self, name: str) -> EndpointRecord:
        return endpoint_record(self._http.call("GET", _endpoint(name)))

    def list_endpoints(self) -> list[EndpointRecord]:
        return [endpoint_record(r) for r in self._http.call("GET", "/endpoints")]

    def update_endpoint(self, name: str, *, status: EndpointStatus,
                        expected: EndpointStatus | None = None,
                        failure_reason: str | None = None) -> EndpointRecord:
        return endpoint_record(self._http.call("POST", _endpoint(name) + "/transitions", json={
            "status": EndpointStatus(status).value,
            "expected": None if expected is None else EndpointStatus(expected).value,
            "failure_reason": failure_reason}))

    def set_endpoint_supervisor(self, name: str, handle: Handle) -> None:
        self._http.call("PUT", _endpoint(name) + "/supervisor", json={"handle": dict(handle)})

    def put_endpoint_instance(self, name: str, instance: EndpointInstance) -> None:
        self._http.call("PUT", _endpoint(name) + f"/instances/{int(instance.index)}", json={
            "host": instance.host, "port": instance.port, "pid": instance.pid,
            "status": InstanceStatus(instance.status).value, "restarts": instance.restarts})

    def remove_endpoint_instances(self, name: str) -> None:
        self._http.call("DELETE", _endpoint(name) + "/instances")

    def delete_endpoint(self, name: str) -> bool:
        return bool(self._http.call("DELETE", _endpoint(name))["deleted"])


class HttpEndpointBackend:
    """Endpoints run by the team server's own endpoint backends, on its host and with its
    settings (``POST /endpoint-checks``, ``POST|GET|DELETE /endpoints/{name}/runtime``)."""

    def __init__(self, connection: ServerConnection) -> None:
        self._http = connection

    def owns(self, handle: Mapping[str, Any]) -> bool:
        """Every handle on the server's records: the server picks its backend (and shows
        one it did not start as it stands)."""
        return bool(handle)

    def check(self, config: EndpointConfig) -> None:
        self._http.call("POST", "/endpoint-checks", json={"config": config.to_json()})

    def deploy(self, name: str, *, model_data: str, config: EndpointConfig,
               code_key: str | None, requirements_key: str | None) -> Mapping[str, Any]:
        """Start the recorded endpoint *name* on the server (its record's model and config
        are what it serves; the server records the handle it returns)."""
        out = self._http.call("POST", _endpoint(name) + "/runtime", json={
            "code_key": code_key, "requirements_key": requirements_key})
        return dict(out["handle"])

    def refresh(self, record: EndpointRecord) -> RuntimeView:
        out = self._http.call("GET", _endpoint(record.name) + "/runtime")
        return RuntimeView(RuntimeState(out["state"]), reason=out.get("reason"),
                           addresses=tuple((str(h), int(p)) for h, p in out["addresses"]))

    def delete(self, record: EndpointRecord, *, timeout: float) -> None:
        self._http.call("DELETE", _endpoint(record.name) + "/runtime",
                        params={"timeout": f"{min(timeout, _DELETE_WAIT_S):.3f}"})

    def close(self) -> None:
        """Nothing of its own: the session closes the shared connection."""


def _endpoint(name: str) -> str:
    return f"/endpoints/{quote(name, safe='')}"
