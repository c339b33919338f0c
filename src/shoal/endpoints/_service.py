"""``EndpointService``: create, wait for, look up and delete endpoints.

Creating an endpoint stores its record (Creating), ships the deployer's code and requirements
to the artifact store and starts its runtime through an ``EndpointBackend``: a supervisor
(``_supervisor.py``) launched through the session's backend, detached like a job's, or a Ray
Serve application (``_ray_serve.py``) when the session's backend is Ray; ``Session`` chooses.
Either way the endpoint outlives the client that deployed it. This side waits, reads, asks for
deletion, and records what the backend sees (``RuntimeView``): an endpoint whose runtime is
gone or failed is marked Failed with the reason, one that became ready goes InService.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from shoal.core.endpoints import (
    EndpointBackend,
    EndpointConfig,
    EndpointInstance,
    EndpointRecord,
    EndpointStatus,
    InstanceStatus,
    RuntimeState,
    RuntimeView,
    endpoint_dir,
    endpoint_key,
)
from shoal.core.ports import ArtifactStore, EndpointStore
from shoal.endpoints._staging import check_model_data, shipped_key, upload_model
from shoal.errors import (
    BackendUnavailableError,
    EndpointFailedError,
    EndpointNotFound,
    InvalidArgumentError,
    InvalidTransitionError,
    PermissionDeniedError,
    ServingError,
)

if TYPE_CHECKING:
    from shoal.session import Session

__all__ = ["EndpointService", "raise_unless_serving"]

_LIVE = (EndpointStatus.CREATING, EndpointStatus.IN_SERVICE, EndpointStatus.UPDATING)


class EndpointService:
    """The use cases of endpoints, over one endpoint store, artifact store and the endpoint
    backends a session chose: the first deploys new endpoints; each record is managed by the
    backend that ``owns`` its handle (one none owns is shown as it stands).

    *home* is where the endpoints' supervisors keep their files, on this host; None when
    they run on another (a team server's): a local model_data then goes up to the artifact
    store first, and the processes and files on that host are its backend's to clean up.
    """

    def __init__(self, metadata: EndpointStore, artifacts: ArtifactStore,
                 backends: Sequence[EndpointBackend], *, home: Path | str | None) -> None:
        if not backends:
            raise InvalidArgumentError("an EndpointService needs at least one endpoint "
                                       "backend (Session.endpoint_backends)",
                                       argument="backends")
        self.metadata = metadata
        self._artifacts = artifacts
        self._backends = tuple(backends)
        self._home = None if home is None else Path(home)

    @classmethod
    def for_session(cls, session: Session) -> EndpointService:
        """The service over *session*'s stores and endpoint backends (a team server's with
        ``SHOAL_SERVER_URL``: its endpoints run on its host)."""
        through_server = session.settings.server_url is not None
        return cls(session.endpoint_store, session.artifacts, session.endpoint_backends,
                   home=None if through_server else session.home)

    def _owner(self, record: EndpointRecord) -> EndpointBackend | None:
        return next((b for b in self._backends if b.owns(record.supervisor)), None)

    # --- creating -----------------------------------------------------------------------

    def create(self, name: str, *, model_data: str, config: EndpointConfig,
               code_archive: Path | None = None,
               requirements: str | None = None) -> EndpointRecord:
        """Store the endpoint (Creating) and start its runtime: its supervisor, or, with the
        Ray backend, its Ray Serve application."""
        backend = self._backends[0]
        backend.check(config)
        local_model = model_data
        # Its supervisor runs on another host: a local model goes up to the store first.
        shipped = None
        if self._home is None and not _in_store(model_data, self._artifacts.root):
            shipped = shipped_key(name, model_data)
            if shipped is None:
                raise InvalidArgumentError(
                    f"endpoint {name!r}: model_data {model_data!r} is not in this server's "
                    f"artifact store ({self._artifacts.root.rstrip('/')}/...); through a team "
                    "server give a local file or directory (it is uploaded) or a model already "
                    "in its store (a training job's model_data)", argument="model_data",
                    endpoint=name)
            check_model_data(model_data)
            model_data = self._artifacts.uri(shipped)
        record = self.metadata.create_endpoint(name, model_data=model_data, config=config)
        try:
            artifacts = self._artifacts
            for part in ("code", "env"):
                artifacts.delete_prefix(endpoint_key(name, part))
            if shipped is not None:
                upload_model(artifacts, shipped, local_model)
            code_key = requirements_key = None
            if code_archive is not None:
                code_key = endpoint_key(name, "code", "code.tar.gz")
                artifacts.put_file(code_key, code_archive)
            if requirements is not None:
                requirements_key = endpoint_key(name, "env", "requirements.txt")
                artifacts.put_bytes(requirements_key, requirements.encode())
            handle = backend.deploy(name, model_data=model_data, config=config,
                                    code_key=code_key, requirements_key=requirements_key)
            self.metadata.set_endpoint_supervisor(name, handle)
        except EndpointNotFound:
            raise  # deleted while it was being created
        except Exception as e:
            with contextlib.suppress(Exception):
                self.metadata.update_endpoint(name, status=EndpointStatus.FAILED,
                                              failure_reason=f"could not start: {e}")
            raise
        return record

    def wait(self, name: str, *, timeout: float | None = None) -> EndpointRecord:
        """Block until *name* is InService; raise EndpointFailedError (with the reason) if it
        failed, or if it was deleted meanwhile."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.01
        while True:
            record = self.find(name)
            if record is None:
                raise EndpointFailedError(f"endpoint {name!r} was deleted while it was being "
                                          "created", endpoint=name)
            if record.status == EndpointStatus.IN_SERVICE:
                return record
            if record.status in (EndpointStatus.FAILED, EndpointStatus.DELETING):
                raise self.failure(record)
            if deadline is not None and time.monotonic() >= deadline:
                raise EndpointFailedError(
                    f"endpoint {name!r} is still {record.status} after {timeout:g} s; follow "
                    f"it with 'shoal endpoints describe {name}'", endpoint=name)
            time.sleep(delay)  # the supervisor writes the record: poll it, gently
            delay = min(delay * 1.5, 0.2)

    def failure(self, record: EndpointRecord) -> EndpointFailedError:
        reason = record.failure_reason or f"the endpoint is {record.status}"
        logs = self._artifacts.uri(endpoint_key(record.name, "logs"))
        return EndpointFailedError(
            f"endpoint {record.name!r} failed: {reason}\nLogs: {logs}; delete it with "
            f"'shoal endpoints delete {record.name}' before deploying under this name again",
            endpoint=record.name, reason=reason, logs=logs)

    # --- reading ------------------------------------------------------------------------

    def find(self, name: str) -> EndpointRecord | None:
        record = self.metadata.find_endpoint(name)
        return None if record is None else self._reap(record)

    def get(self, name: str) -> EndpointRecord:
        record = self.find(name)
        if record is None:
            raise EndpointNotFound(f"no endpoint named {name!r}; 'shoal endpoints list' shows "
                                   "the endpoints there", endpoint=name)
        return record

    def list(self) -> list[EndpointRecord]:
        return [r for r in map(self._reap, self.metadata.list_endpoints()) if r is not None]

    def _reap(self, record: EndpointRecord) -> EndpointRecord | None:
        """Bring a live (or Deleting) record in line with what its backend sees: an endpoint
        whose runtime is gone can serve no more, so say so on its record; a Deleting one
        whose runtime is gone is finished off (None)."""
        if record.status not in (*_LIVE, EndpointStatus.DELETING) or not record.supervisor:
            return record
        owner = self._owner(record)
        if owner is None:
            return record  # another session's kind of endpoint: show it as it stands
        view = owner.refresh(record)
        if view.state == RuntimeState.UNCHANGED:
            return record
        if record.status == EndpointStatus.DELETING:
            if view.state != RuntimeState.GONE:
                return record
            self._clean_up(record)
            return None
        try:
            return self._record_view(record, view)
        except (InvalidTransitionError, EndpointNotFound):
            return self.metadata.find_endpoint(record.name)  # moved on meanwhile
        except PermissionDeniedError:  # another user's, on a team server (which says it)
            return self.metadata.find_endpoint(record.name)

    def _record_view(self, record: EndpointRecord, view: RuntimeView) -> EndpointRecord:
        name = record.name
        if view.state == RuntimeState.READY:
            if record.status != EndpointStatus.CREATING:
                return record
            for index, (host, port) in enumerate(view.addresses):
                self.metadata.put_endpoint_instance(name, EndpointInstance(
                    index, host, port, None, InstanceStatus.IN_SERVICE))
            self.metadata.update_endpoint(name, status=EndpointStatus.IN_SERVICE,
                                          expected=EndpointStatus.CREATING)
            return self.metadata.get_endpoint(name)
        if self._home is not None:
            _stop_instances(record)
        self.metadata.update_endpoint(
            name, status=EndpointStatus.FAILED,
            failure_reason=view.reason or f"the endpoint's runtime is {view.state}")
        self.metadata.remove_endpoint_instances(name)
        return self.metadata.get_endpoint(name)

    # --- deleting -----------------------------------------------------------------------

    def delete(self, name: str, *, timeout: float = 60.0) -> None:
        """Stop the endpoint's runtime and remove its record (waits up to *timeout*)."""
        record = self.metadata.find_endpoint(name)
        if record is None:
            raise EndpointNotFound(f"no endpoint named {name!r}; 'shoal endpoints list' shows "
                                   "the endpoints there", endpoint=name)
        if record.status != EndpointStatus.DELETING:
            with contextlib.suppress(InvalidTransitionError):
                record = self.metadata.update_endpoint(name, status=EndpointStatus.DELETING)
        if record.supervisor:
            owner = self._owner(record)
            if owner is None:
                raise BackendUnavailableError(
                    f"endpoint {name!r} runs on {record.supervisor.get('backend')!r}, which "
                    "this session's backend does not manage; select the backend that deployed "
                    "it (SHOAL_BACKEND=ray and SHOAL_RAY_ADDRESS for Ray Serve) to delete it",
                    endpoint=name)
            owner.delete(record, timeout=timeout)  # a supervisor removes the record itself
        current = self.metadata.find_endpoint(name)
        if current is None:
            self._remove_files(name)
        else:
            self._clean_up(current)

    def _clean_up(self, record: EndpointRecord) -> None:
        if self._home is not None:
            _stop_instances(record)
        self._remove_files(record.name)
        self.metadata.delete_endpoint(record.name)

    def _remove_files(self, name: str) -> None:
        """What deploying *name* wrote: its directory under the home (the staged model, the
        code, the instances' logs) and the code and environment it shipped to the artifact
        store. The logs uploaded under ``endpoints/<name>/logs/`` stay, as SageMaker's
        CloudWatch logs outlive an endpoint."""
        import shutil

        if self._home is not None:
            shutil.rmtree(endpoint_dir(self._home, name), ignore_errors=True)
        for part in ("code", "env", "model"):
            with contextlib.suppress(Exception):
                self._artifacts.delete_prefix(endpoint_key(name, part))


def _in_store(model_data: str, root: str) -> bool:
    """*model_data* names something in the artifact store at *root* (the server checks it
    again before it starts anything)."""
    root = root.rstrip("/") + "/"
    return model_data.startswith(root) and len(model_data) > len(root)


def _stop_instances(record: EndpointRecord) -> None:
    """Kill what is left of a supervisor-less endpoint's servers (only our own processes)."""
    for instance in record.instances:
        if instance.pid and _is_server(instance.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(instance.pid, signal.SIGKILL)


def _is_server(pid: int) -> bool:
    try:
        return b"shoal.serving" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def raise_unless_serving(record: EndpointRecord) -> None:
    if record.status == EndpointStatus.IN_SERVICE or record.serving:
        return
    raise ServingError(f"endpoint {record.name!r} is {record.status}, not InService"
                       + (f": {record.failure_reason}" if record.failure_reason else "")
                       + f"; see 'shoal endpoints describe {record.name}'", endpoint=record.name)
