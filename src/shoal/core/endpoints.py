"""Endpoint types: what an endpoint serves and how (``EndpointConfig``), its lifecycle
(SageMaker's ``EndpointStatus``), the server processes behind it, and the seam to what runs
them (``EndpointBackend``: a local supervisor per endpoint, or Ray Serve). Frozen values, no
I/O; ``shoal.endpoints`` starts and supervises the processes, the metadata store keeps the
records.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from shoal.errors import InvalidArgumentError, InvalidTransitionError

__all__ = [
    "ENDPOINT_TRANSITIONS",
    "BatchingOptions",
    "EndpointConfig",
    "EndpointInstance",
    "EndpointRecord",
    "EndpointBackend",
    "EndpointStatus",
    "InstanceStatus",
    "ReplicaAccess",
    "ReplicaAccessFor",
    "RuntimeState",
    "RuntimeView",
    "check_endpoint_name",
    "check_endpoint_transition",
    "endpoint_dir",
    "endpoint_key",
]

#: SageMaker's endpoint-name rule: 1-63 letters, digits or hyphens, no leading hyphen.
_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")


class EndpointStatus(StrEnum):
    """SageMaker's ``EndpointStatus`` values that a shoal endpoint goes through."""

    CREATING = "Creating"
    IN_SERVICE = "InService"
    UPDATING = "Updating"
    FAILED = "Failed"
    DELETING = "Deleting"

    @property
    def is_settled(self) -> bool:
        """InService or Failed: ``deploy(wait=True)`` stops waiting here."""
        return self in (EndpointStatus.IN_SERVICE, EndpointStatus.FAILED)


class InstanceStatus(StrEnum):
    """One server process: starting, answering ``/ping``, being restarted, or given up on."""

    PENDING = "Pending"
    IN_SERVICE = "InService"
    RESTARTING = "Restarting"
    FAILED = "Failed"


_E = EndpointStatus
#: The only moves an endpoint makes. A deleted endpoint's record is removed, not moved on.
ENDPOINT_TRANSITIONS: Mapping[EndpointStatus, frozenset[EndpointStatus]] = {
    _E.CREATING: frozenset({_E.IN_SERVICE, _E.FAILED, _E.DELETING}),
    _E.IN_SERVICE: frozenset({_E.UPDATING, _E.FAILED, _E.DELETING}),
    _E.UPDATING: frozenset({_E.IN_SERVICE, _E.FAILED, _E.DELETING}),
    _E.FAILED: frozenset({_E.DELETING}),
    _E.DELETING: frozenset(),
}


def check_endpoint_transition(name: str, current: EndpointStatus,
                              new: EndpointStatus) -> None:
    if new not in ENDPOINT_TRANSITIONS[current]:
        raise InvalidTransitionError(f"endpoint {name!r} is {current}; it cannot become {new}",
                                     endpoint=name, current=str(current), new=str(new))


def check_endpoint_name(name: Any) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidArgumentError(
            f"endpoint name {name!r} must be 1-63 letters, digits or hyphens, starting with a "
            "letter or digit", argument="endpoint_name")
    return name


@dataclass(frozen=True, slots=True)
class BatchingOptions:
    """Server-side dynamic batching: up to *max_batch_size* requests, waiting at most
    *max_batch_delay_ms* for the batch to fill."""

    max_batch_size: int
    max_batch_delay_ms: float

    @classmethod
    def parse(cls, value: Any) -> BatchingOptions | None:
        """``None``, a ``BatchingOptions`` or ``{"max_batch_size": 8, "max_batch_delay_ms": 5}``."""
        if value is None or isinstance(value, BatchingOptions):
            return value
        example = '{"max_batch_size": 8, "max_batch_delay_ms": 5}'
        if not isinstance(value, Mapping):
            raise InvalidArgumentError(f"batching must be a dict like {example}, got "
                                       f"{type(value).__name__}", argument="batching")
        unknown = sorted(set(map(str, value)) - {"max_batch_size", "max_batch_delay_ms"})
        if unknown:
            raise InvalidArgumentError(f"batching: unknown option(s) {', '.join(unknown)}; "
                                       f"give {example}", argument="batching")
        size = value.get("max_batch_size")
        delay = value.get("max_batch_delay_ms", 5)
        if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= 4096:
            raise InvalidArgumentError(f"batching: max_batch_size must be an integer from 1 to "
                                       f"4096, got {size!r}", argument="batching")
        if not isinstance(delay, int | float) or isinstance(delay, bool) \
                or not 0 <= delay <= 60_000:
            raise InvalidArgumentError(f"batching: max_batch_delay_ms must be a number of "
                                       f"milliseconds from 0 to 60000, got {delay!r}",
                                       argument="batching")
        return cls(size, float(delay))

    def to_json(self) -> dict[str, Any]:
        return {"max_batch_size": self.max_batch_size,
                "max_batch_delay_ms": self.max_batch_delay_ms}


@dataclass(frozen=True, slots=True)
class EndpointConfig:
    """How an endpoint serves its model.

    *port* fixes the endpoint's port, which all its instances share (an LLM's instance *i*
    listens on ``port + i``); None picks a free one. *code* says the deployer shipped an entry point / source dir for ``code/``,
    *requirements* that it shipped a requirements file for the model's own environment.
    *min_instances* / *max_instances* bound autoscaling (SageMaker's
    ``managed_instance_scaling``); only an endpoint on Ray Serve scales, between them.
    """

    instance_count: int = 1
    instance_type: str = "local"
    batching: BatchingOptions | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    port: int | None = None
    startup_timeout_s: float = 600.0
    code: bool = False
    entry_point: str | None = None
    requirements: bool = False
    min_instances: int | None = None
    max_instances: int | None = None
    #: SageMaker's ``tags`` for the endpoint, kept on its record.
    tags: tuple[tuple[str, str], ...] = ()
    #: SageMaker settings with no effect here (``data_capture_config``, ``kms_key``...), kept
    #: on the record and reported once (shoal.core.inert).
    inert_settings: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        count = self.instance_count
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 64:
            raise InvalidArgumentError(f"initial_instance_count must be an integer from 1 to "
                                       f"64, got {count!r}", argument="initial_instance_count")
        if (self.min_instances is None) != (self.max_instances is None):
            raise InvalidArgumentError("autoscaling needs both MinInstanceCount and "
                                       "MaxInstanceCount", argument="managed_instance_scaling")
        if self.min_instances is not None and not (
                all(isinstance(n, int) and not isinstance(n, bool)
                    for n in (self.min_instances, self.max_instances))
                and 0 <= self.min_instances <= count <= int(self.max_instances or 0) <= 64):
            raise InvalidArgumentError(
                f"autoscaling bounds must be integers with 0 <= MinInstanceCount <= "
                f"initial_instance_count <= MaxInstanceCount <= 64, got {self.min_instances!r}"
                f" <= {count} <= {self.max_instances!r}", argument="managed_instance_scaling")
        if self.port is not None and (not isinstance(self.port, int) or isinstance(
                self.port, bool) or not 1 <= self.port <= 65535 - count + 1):
            raise InvalidArgumentError(f"port must be an integer from 1 to {65535 - count + 1} "
                                       f"(the instances share it; an LLM's take one port each "
                                       f"from it), got {self.port!r}", argument="port")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.env.items()):
            raise InvalidArgumentError("env must map str to str", argument="env")
        if not isinstance(self.startup_timeout_s, int | float) or self.startup_timeout_s <= 0:
            raise InvalidArgumentError("the startup timeout must be a positive number of "
                                       f"seconds, got {self.startup_timeout_s!r}",
                                       argument="container_startup_health_check_timeout")

    def to_json(self) -> dict[str, Any]:
        return {"instance_count": self.instance_count, "instance_type": self.instance_type,
                "batching": self.batching.to_json() if self.batching else None,
                "env": dict(self.env), "port": self.port,
                "startup_timeout_s": self.startup_timeout_s, "code": self.code,
                "entry_point": self.entry_point, "requirements": self.requirements,
                "min_instances": self.min_instances, "max_instances": self.max_instances,
                "tags": [list(t) for t in self.tags], "inert_settings": dict(self.inert_settings)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EndpointConfig:
        return cls(instance_count=int(data.get("instance_count", 1)),
                   instance_type=str(data.get("instance_type") or "local"),
                   batching=BatchingOptions.parse(data.get("batching")),
                   env=dict(data.get("env") or {}), port=data.get("port"),
                   startup_timeout_s=float(data.get("startup_timeout_s", 600.0)),
                   code=bool(data.get("code")), entry_point=data.get("entry_point"),
                   requirements=bool(data.get("requirements")),
                   min_instances=data.get("min_instances"),
                   max_instances=data.get("max_instances"),
                   tags=tuple((str(k), str(v)) for k, v in data.get("tags") or ()),
                   inert_settings=dict(data.get("inert_settings") or {}))

    @classmethod
    def parse_scaling(cls, value: Any) -> tuple[int | None, int | None]:
        """SageMaker's ``managed_instance_scaling`` (``{"Status": "ENABLED",
        "MinInstanceCount": 1, "MaxInstanceCount": 4}``) as (min, max); (None, None) when
        absent or disabled."""
        if value is None:
            return None, None
        if not isinstance(value, Mapping):
            raise InvalidArgumentError('managed_instance_scaling must be a dict like {"Status": '
                                       '"ENABLED", "MinInstanceCount": 1, "MaxInstanceCount": 4}',
                                       argument="managed_instance_scaling")
        if str(value.get("Status", "ENABLED")).upper() != "ENABLED":
            return None, None
        return value.get("MinInstanceCount"), value.get("MaxInstanceCount")


@dataclass(frozen=True, slots=True)
class EndpointInstance:
    """One supervised server process of an endpoint, or (on Ray Serve) one HTTP proxy that
    routes to its replicas under *path*."""

    index: int
    host: str
    port: int
    pid: int | None = None
    status: InstanceStatus = InstanceStatus.PENDING
    restarts: int = 0
    #: The route prefix the endpoint answers under at this address ("" for a model server).
    path: str = ""

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{self.path}"


@dataclass(frozen=True, slots=True)
class EndpointRecord:
    """An endpoint as stored: its model, config, state and instances (by index)."""

    name: str
    status: EndpointStatus
    model_data: str
    config: EndpointConfig
    created_at: datetime
    updated_at: datetime
    failure_reason: str | None = None
    instances: tuple[EndpointInstance, ...] = ()
    #: The supervisor process (``pid``, ``host``, ``start_ticks``): the local backend's handle;
    #: on Ray Serve the application (``backend: "ray-serve"``, ``application``,
    #: ``route_prefix``), whose prefix every instance address serves under.
    supervisor: Mapping[str, Any] = field(default_factory=dict)
    #: The user who created it (``local`` without a team server, and for rows older than
    #: schema 0007).
    owner: str = "local"

    def __post_init__(self) -> None:
        prefix = str(self.supervisor.get("route_prefix") or "")
        if prefix and any(i.path != prefix for i in self.instances):
            object.__setattr__(self, "instances",
                               tuple(replace(i, path=prefix) for i in self.instances))

    @property
    def serving(self) -> tuple[EndpointInstance, ...]:
        """The instances answering requests now."""
        return tuple(i for i in self.instances if i.status == InstanceStatus.IN_SERVICE)

    @property
    def urls(self) -> tuple[str, ...]:
        """The endpoint's addresses: one when its instances share it (a supervised model
        server's instances, or Ray Serve's route), else one per instance (an LLM's)."""
        return tuple(dict.fromkeys(i.url for i in self.instances))


def endpoint_key(name: str, *parts: str) -> str:
    """``endpoints/<name>/...`` in the artifact store."""
    return "/".join(("endpoints", name, *parts))


def endpoint_dir(home: Path | str, name: str) -> Path:
    """Where an endpoint's supervisor stages its model and keeps its instances' logs."""
    return Path(home) / "endpoints" / name


class RuntimeState(StrEnum):
    """What an endpoint backend sees of the processes (or application) behind an endpoint."""

    #: Running as recorded, or the backend cannot tell (another host, an unreachable
    #: cluster): nothing to record.
    UNCHANGED = "unchanged"
    #: Ready to serve at the view's addresses (a Creating endpoint becomes InService).
    READY = "ready"
    #: It failed, for the view's reason.
    FAILED = "failed"
    #: Nothing runs it any more: a Deleting endpoint is gone, a live one failed (the reason).
    GONE = "gone"


@dataclass(frozen=True, slots=True)
class RuntimeView:
    """One look at an endpoint's runtime (``EndpointBackend.refresh``); the endpoint service
    decides what it means for the record."""

    state: RuntimeState
    reason: str | None = None
    #: (host, port) of each address a READY endpoint answers on, in instance order.
    addresses: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class ReplicaAccess:
    """How a team server's Ray Serve replicas reach their endpoint's files: through the
    server at *url* with *token* (a replica token: the endpoint's model, code and
    requirements, and its logs), the model at *model_key* of the server's store."""

    url: str
    token: str = field(repr=False)
    model_key: str


#: What a team server gives its endpoint backends: the access of endpoint *name*'s
#: replicas to its files, its model being *model_data*.
ReplicaAccessFor = Callable[[str, str], ReplicaAccess]


class EndpointBackend(Protocol):
    """What runs endpoints: a detached supervisor per endpoint (launched through the session's
    backend) or a Ray Serve application. It starts, observes and stops the runtime; the
    endpoint service owns the records (status, instances, failure reasons) and the files."""

    def owns(self, handle: Mapping[str, Any]) -> bool:
        """True when *handle* (an ``EndpointRecord.supervisor``) is one this backend made."""
        ...

    def check(self, config: EndpointConfig) -> None:
        """Refuse, before anything is recorded, what this backend cannot serve."""
        ...

    def deploy(self, name: str, *, model_data: str, config: EndpointConfig,
               code_key: str | None, requirements_key: str | None) -> Mapping[str, Any]:
        """Start the endpoint's runtime (without waiting for it); return the handle to keep
        on its record. The code and requirements are already in the artifact store."""
        ...

    def refresh(self, record: EndpointRecord) -> RuntimeView:
        """One look at a live (or Deleting) endpoint's runtime."""
        ...

    def delete(self, record: EndpointRecord, *, timeout: float) -> None:
        """Stop the endpoint's runtime; return once it is gone (waits up to *timeout*)."""
        ...
