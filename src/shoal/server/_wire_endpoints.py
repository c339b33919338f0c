"""The pydantic models on the wire of the ``EndpointStore`` routes (``server/_endpoints.py``).

An endpoint's config travels as ``EndpointConfig.to_json`` and its supervisor handle as the
JSON object its backend made; ``shoal.client.endpoints`` decodes the same JSON into ``core``
records without pydantic.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel

from shoal.core.endpoints import (
    EndpointInstance,
    EndpointRecord,
    EndpointStatus,
    InstanceStatus,
    RuntimeState,
    RuntimeView,
)

__all__ = ["CheckIn", "EndpointIn", "EndpointOut", "GoneOut", "HandleOut", "InstanceIn",
           "InstanceOut", "RuntimeIn", "RuntimeOut", "SupervisorIn", "TransitionIn"]


class InstanceIn(BaseModel):
    host: str
    port: int
    pid: int | None = None
    status: InstanceStatus = InstanceStatus.PENDING
    restarts: int = 0

    def instance(self, index: int) -> EndpointInstance:
        return EndpointInstance(index, self.host, self.port, self.pid, self.status,
                                self.restarts)


class InstanceOut(InstanceIn):
    index: int
    path: str


class EndpointOut(BaseModel):
    name: str
    status: EndpointStatus
    model_data: str
    config: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    failure_reason: str | None
    instances: list[InstanceOut]
    supervisor: dict[str, Any]
    owner: str = "local"

    @classmethod
    def of(cls, r: EndpointRecord) -> EndpointOut:
        return cls(name=r.name, status=r.status, model_data=r.model_data,
                   config=r.config.to_json(), created_at=r.created_at,
                   updated_at=r.updated_at, failure_reason=r.failure_reason,
                   instances=[InstanceOut(index=i.index, host=i.host, port=i.port, pid=i.pid,
                                          status=i.status, restarts=i.restarts, path=i.path)
                              for i in r.instances],
                   supervisor=dict(r.supervisor), owner=r.owner)


class EndpointIn(BaseModel):
    name: str
    model_data: str
    config: dict[str, Any]


class TransitionIn(BaseModel):
    status: EndpointStatus
    expected: EndpointStatus | None = None
    failure_reason: str | None = None


class SupervisorIn(BaseModel):
    handle: dict[str, Any]


class CheckIn(BaseModel):
    config: dict[str, Any]


class RuntimeIn(BaseModel):
    """What the client shipped beside the record: its code and requirements keys."""

    code_key: str | None = None
    requirements_key: str | None = None


class HandleOut(BaseModel):
    handle: dict[str, Any]


class RuntimeOut(BaseModel):
    """A ``RuntimeView``: one look at the endpoint's runtime on the server's host."""

    state: RuntimeState
    reason: str | None = None
    addresses: list[tuple[str, int]] = []

    @classmethod
    def of(cls, view: RuntimeView) -> RuntimeOut:
        return cls(state=view.state, reason=view.reason,
                   addresses=[(h, p) for h, p in view.addresses])


class GoneOut(BaseModel):
    gone: bool
