"""Endpoints on the server's host: the ``EndpointBackend`` port's routes
(``client/endpoints.py: HttpEndpointBackend``) over the server's own endpoint backends.

A client's ``EndpointService`` records the endpoint (``POST /endpoints``, owned by its
caller), uploads the model and code to the server's artifact store and asks for the runtime:
``POST /endpoints/{name}/runtime`` starts it with ``Session.make_endpoint_backends`` of the
server's session (a supervisor launched through the server's backend, or Ray Serve), with the
server's settings and ``SHOAL_ENDPOINT_CREDENTIALS=withhold``, so the model servers (the
deployer's inference code) get none of the server's credentials. Only the record's owner or an
admin starts or stops it, only for a Creating record not started yet, only for a model_data in
the server's artifact store (never a path or URL of the server's host that the deployer
could not read themselves). The server seals the handle it records (HMAC under
``<server home>/server/endpoint-seal-secret``): it looks at and stops only runtimes it
started, never a process a client's handle names. ``GET .../runtime`` is one look
(``RuntimeView``, anyone's); when the runtime is gone or failed the server stops what is left
of its model servers (only processes serving from that endpoint's directory), marks a live
endpoint Failed with the reason (a reader's client may not) and, for a Deleting one, removes
its directory; ``DELETE .../runtime`` stops it and does the same.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import shutil
import signal
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Query, Request

from shoal.core.endpoints import (
    EndpointBackend,
    EndpointConfig,
    EndpointInstance,
    EndpointRecord,
    EndpointStatus,
    ReplicaAccess,
    RuntimeState,
    RuntimeView,
    endpoint_dir,
    endpoint_key,
)
from shoal.core.ports import EndpointStore
from shoal.errors import (
    BackendUnavailableError,
    EndpointNotFound,
    InvalidArgumentError,
    InvalidTransitionError,
    PermissionDeniedError,
)
from shoal.server._owners import require_owner
from shoal.server._wire_endpoints import CheckIn, GoneOut, HandleOut, RuntimeIn, RuntimeOut

if TYPE_CHECKING:
    from shoal.server._jobtokens import JobTokens
    from shoal.session import Session

__all__ = ["ServerEndpoints", "runtime_routes"]

_SEAL = "seal"
_LABEL = b"shoal/endpoint-handle/v1\0"
_MAX_DELETE_WAIT_S = 25.0


class ServerEndpoints:
    """The server's endpoint backends (built on first use), the seal of their handles and
    the clean-up of what they leave on this host."""

    def __init__(self, session: Session, store: EndpointStore, *, url: str | None = None,
                 tokens: JobTokens | None = None) -> None:
        self.session = session
        self.store = store
        self.url = None if url is None else url.rstrip("/")  # where its nodes reach it
        self._tokens = tokens
        self._secret_path = session.home / "server" / "endpoint-seal-secret"
        self._secret: bytes | None = None
        self._backends: tuple[EndpointBackend, ...] | None = None
        self._lock = threading.Lock()

    @property
    def backends(self) -> tuple[EndpointBackend, ...]:
        with self._lock:
            if self._backends is None:
                env = {**self.session.supervisor_env(), "SHOAL_ENDPOINT_CREDENTIALS": "withhold"}
                self._backends = self.session.make_endpoint_backends(
                    env, replica_access=None if self._tokens is None else self.replica_access)
            return self._backends

    def replica_access(self, name: str, model_data: str) -> ReplicaAccess:
        """How the Ray Serve replicas of endpoint *name* reach its files: through this server
        (its URL for the nodes), with a replica token of the endpoint's owner that reads its
        model, code and requirements and writes its logs only (``server/_jobtokens.py``), so
        no node needs the server's store or its credentials."""
        assert self._tokens is not None and self.url is not None
        record = self.store.get_endpoint(name)
        key = self.model_key(name, model_data)
        return ReplicaAccess(self.url, self._tokens.mint_endpoint(record.owner, name, key),
                             key)

    # --- sealed handles ---------------------------------------------------------------

    def _mac(self, name: str, handle: Mapping[str, Any]) -> str:
        if self._secret is None:
            from shoal.jobs.keys import load_user_secret  # 0600 in a 0700 dir, 32 bytes

            self._secret = load_user_secret(self._secret_path)
        body = json.dumps([name, {k: v for k, v in handle.items() if k != _SEAL}],
                          sort_keys=True, separators=(",", ":"), default=str).encode()
        return hmac.new(self._secret, _LABEL + body, hashlib.sha256).hexdigest()

    def seal(self, name: str, handle: Mapping[str, Any]) -> dict[str, Any]:
        return {**handle, _SEAL: self._mac(name, handle)}

    def sealed(self, record: EndpointRecord) -> bool:
        """Whether *record*'s handle is one this server sealed (it started the runtime)."""
        seal = str(record.supervisor.get(_SEAL) or "")
        return bool(seal) and hmac.compare_digest(seal, self._mac(record.name, record.supervisor))

    def backend_for(self, record: EndpointRecord) -> EndpointBackend | None:
        """The backend that started *record*'s runtime here, or None: no handle, or one this
        server did not seal (written by a client, or by a session on this host)."""
        if not self.sealed(record):
            return None
        return next((b for b in self.backends if b.owns(record.supervisor)), None)

    # --- checks -----------------------------------------------------------------------

    def check_instance(self, record: EndpointRecord, instance: EndpointInstance) -> None:
        """A client's ``PUT .../instances/{i}`` of an endpoint this server started names an
        address its runtime reports (Ray Serve's proxy, which the client's ``EndpointService``
        records once the runtime is ready), never one of the client's choosing: the
        invocation route sends requests there. A supervisor here records its own instances
        in the server's store, not through this route."""
        if not self.sealed(record):
            return  # not started here: the invocation route passes nothing on to it
        backend = self.backend_for(record)
        view = backend.refresh(record) if backend is not None else None
        reported = () if view is None else view.addresses
        if (instance.host, instance.port) not in reported:
            shown = ", ".join(f"{h}:{p}" for h, p in reported) or \
                "none: its supervisor records its instances itself"
            raise PermissionDeniedError(
                f"endpoint {record.name!r} was started by this server, so its instances are "
                f"the addresses its runtime reports ({shown}), not "
                f"{instance.host}:{instance.port}", endpoint=record.name,
                action="record an instance address")

    def check_model_data(self, name: str, model_data: str) -> None:
        """A model in the server's artifact store (what every user may read), nothing else."""
        self.model_key(name, model_data)

    def model_key(self, name: str, model_data: str) -> str:
        """*model_data*'s key in the server's artifact store; InvalidArgumentError for a
        model anywhere else."""
        root = self.session.artifacts.root.rstrip("/") + "/"
        key = model_data[len(root):] if model_data.startswith(root) else ""
        if key and "::" not in model_data and ".." not in key.split("/") and \
                not key.startswith("/"):
            return key
        raise InvalidArgumentError(
            f"endpoint {name!r}: model_data {model_data!r} is not in this server's artifact "
            f"store ({root}...); through a team server give a local file or directory (it "
            "is uploaded) or a model already in its store (a training job's model_data)",
            endpoint=name, model_data=model_data)

    # --- what is left on this host ----------------------------------------------------

    def clean_up(self, record: EndpointRecord, *, files: bool) -> None:
        """Stop what is left of *record*'s model servers; with *files*, remove its directory."""
        where = str(endpoint_dir(self.session.home, record.name)).encode()
        for instance in record.instances:
            if instance.pid and _serves_from(instance.pid, where):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(instance.pid, signal.SIGKILL)
        if files:
            shutil.rmtree(endpoint_dir(self.session.home, record.name), ignore_errors=True)


def _serves_from(pid: int, where: bytes) -> bool:
    """A model server (``python -m shoal.serving``) of the endpoint whose directory is *where*."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"shoal.serving" in cmdline and where + b"/" in cmdline


def runtime_routes(endpoints: ServerEndpoints) -> APIRouter:
    api = APIRouter(tags=["endpoints"])
    store = endpoints.store

    @api.post("/endpoint-checks", status_code=204)
    def check_endpoint_config(body: CheckIn) -> None:
        endpoints.backends[0].check(EndpointConfig.from_json(body.config))

    @api.post("/endpoints/{name}/runtime", status_code=201)
    def start_endpoint(name: str, body: RuntimeIn, request: Request) -> HandleOut:
        record = store.get_endpoint(name)
        require_owner(request, record.owner, "deploy", f"endpoint {name!r}")
        if record.status != EndpointStatus.CREATING or record.supervisor:
            raise InvalidTransitionError(
                f"endpoint {name!r} is {record.status}"
                f"{' and already started' if record.supervisor else ''}: only a new endpoint "
                "is started", endpoint=name, current=str(record.status))
        endpoints.check_model_data(name, record.model_data)
        expected = {"code_key": endpoint_key(name, "code", "code.tar.gz"),
                    "requirements_key": endpoint_key(name, "env", "requirements.txt")}
        for field, key in (("code_key", body.code_key),
                           ("requirements_key", body.requirements_key)):
            if key is not None and key != expected[field]:
                raise InvalidArgumentError(f"endpoint {name!r}: {field} must be "
                                           f"{expected[field]!r}, not {key!r}", endpoint=name)
        backend = endpoints.backends[0]
        backend.check(record.config)
        handle = endpoints.seal(name, backend.deploy(
            name, model_data=record.model_data, config=record.config, code_key=body.code_key,
            requirements_key=body.requirements_key))
        store.set_endpoint_supervisor(name, handle)
        return HandleOut(handle=handle)

    @api.get("/endpoints/{name}/runtime")
    def look_at_endpoint(name: str) -> RuntimeOut:
        record = store.get_endpoint(name)
        backend = endpoints.backend_for(record)
        if backend is None:
            return RuntimeOut.of(RuntimeView(RuntimeState.UNCHANGED))
        view = backend.refresh(record)
        if view.state in (RuntimeState.FAILED, RuntimeState.GONE):
            deleting = record.status == EndpointStatus.DELETING
            endpoints.clean_up(record, files=view.state == RuntimeState.GONE and deleting)
            if not deleting:  # said on the record here, whoever looks (a reader may not)
                with contextlib.suppress(InvalidTransitionError, EndpointNotFound):
                    store.update_endpoint(name, status=EndpointStatus.FAILED, failure_reason=(
                        view.reason or f"the endpoint's runtime is {view.state}"))
                    store.remove_endpoint_instances(name)
        return RuntimeOut.of(view)

    @api.delete("/endpoints/{name}/runtime")
    def stop_endpoint(name: str, request: Request,
                      timeout: Annotated[float, Query(ge=0)] = _MAX_DELETE_WAIT_S) -> GoneOut:
        record = store.find_endpoint(name)
        if record is None:
            return GoneOut(gone=True)
        require_owner(request, record.owner, "delete", f"endpoint {name!r}")
        backend = endpoints.backend_for(record)
        if backend is None and record.supervisor:
            raise BackendUnavailableError(
                f"endpoint {name!r} was not started by this server (its handle "
                f"{dict(record.supervisor)!r} is not one it sealed); delete it where it was "
                "deployed, with that host's own settings", endpoint=name)
        if backend is not None:
            backend.delete(record, timeout=min(timeout, _MAX_DELETE_WAIT_S))
        endpoints.clean_up(record, files=True)
        return GoneOut(gone=store.find_endpoint(name) is None)

    return api
