"""``EndpointService``: create, wait for, look up and delete endpoints.

Creating an endpoint stores its record (Creating), ships the deployer's code and requirements
to the artifact store and starts its supervisor (``_supervisor.py``) through the session's
backend, detached, like a job's: the endpoint outlives the client that deployed it. The
supervisor moves the record on; this side only waits, reads, and asks for deletion.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

from shoal.core.endpoints import EndpointConfig, EndpointRecord, EndpointStatus
from shoal.core.jobs import JobName
from shoal.core.ports import ExecContext
from shoal.errors import (
    EndpointFailedError,
    EndpointNotFound,
    InvalidTransitionError,
    ServingError,
)

__all__ = ["EndpointService", "endpoint_dir", "endpoint_key"]

_SUPERVISOR_ENTRY = "shoal.endpoints._supervisor:main"
_LIVE = (EndpointStatus.CREATING, EndpointStatus.IN_SERVICE, EndpointStatus.UPDATING)


def endpoint_key(name: str, *parts: str) -> str:
    """``endpoints/<name>/...`` in the artifact store."""
    return "/".join(("endpoints", name, *parts))


def endpoint_dir(home: Path | str, name: str) -> Path:
    """Where an endpoint's supervisor stages its model and keeps its instances' logs."""
    return Path(home) / "endpoints" / name


class EndpointService:
    """The use cases of endpoints, over one session's stores and backend."""

    def __init__(self, session: Any) -> None:
        self._session = session

    @property
    def metadata(self) -> Any:
        return self._session.metadata

    # --- creating -----------------------------------------------------------------------

    def create(self, name: str, *, model_data: str, config: EndpointConfig,
               code_archive: Path | None = None,
               requirements: str | None = None) -> EndpointRecord:
        """Store the endpoint (Creating) and start its supervisor, or, with the Ray backend,
        its Ray Serve application."""
        session = self._session
        on_serve = self._on_ray_serve()
        if on_serve:
            from shoal.endpoints import _ray_serve

            _ray_serve.check_config(config)
        record: EndpointRecord = self.metadata.create_endpoint(name, model_data=model_data,
                                                               config=config)
        try:
            artifacts = session.artifacts
            for part in ("code", "env"):
                artifacts.delete_prefix(endpoint_key(name, part))
            if code_archive is not None:
                artifacts.put_file(endpoint_key(name, "code", "code.tar.gz"), code_archive)
            if requirements is not None:
                artifacts.put_bytes(endpoint_key(name, "env", "requirements.txt"),
                                    requirements.encode())
            if on_serve:
                handle = _ray_serve.deploy(
                    session, name, model_data=model_data, config=config,
                    code_key=endpoint_key(name, "code", "code.tar.gz") if code_archive else None,
                    requirements_key=(endpoint_key(name, "env", "requirements.txt")
                                      if requirements is not None else None))
                self.metadata.set_endpoint_supervisor(name, handle)
            else:
                info = session.backend.launch(ExecContext(
                    job=JobName(f"endpoint-{name}"), entrypoint=_SUPERVISOR_ENTRY,
                    args=(name,), env=session.supervisor_env()))
                self.metadata.set_endpoint_supervisor(name, info.to_json())
        except EndpointNotFound:
            raise  # deleted while it was being created
        except Exception as e:
            with contextlib.suppress(Exception):
                self.metadata.update_endpoint(name, status=EndpointStatus.FAILED,
                                              failure_reason=f"could not start: {e}")
            raise
        return record

    def _on_ray_serve(self) -> bool:
        """Endpoints go to Ray Serve when the session's backend is Ray."""
        return getattr(self._session.backend, "name", None) == "ray"

    def supervisor_log(self, name: str) -> Path:
        return Path(self._session.home) / "run" / "supervisors" / f"endpoint-{name}.log"

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
        logs = self._session.artifacts.uri(endpoint_key(record.name, "logs"))
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
        """An endpoint whose supervisor is gone can serve no more: say so on its record. One
        on Ray Serve follows its application instead."""
        if record.status not in (*_LIVE, EndpointStatus.DELETING) or not record.supervisor:
            return record
        if record.supervisor.get("backend") == "ray-serve":
            from shoal.endpoints import _ray_serve

            return _ray_serve.refresh(self._session, record)
        if self._session.backend.is_alive(record.supervisor) is not False:
            return record
        if record.status == EndpointStatus.DELETING:
            self._clean_up(record)
            return None
        _stop_instances(record)
        log = self.supervisor_log(record.name)
        try:
            tail = "\n".join(log.read_text(errors="replace").rstrip().splitlines()[-20:])
        except OSError:
            tail = ""
        with contextlib.suppress(InvalidTransitionError, EndpointNotFound):
            record = self.metadata.update_endpoint(
                record.name, status=EndpointStatus.FAILED,
                failure_reason=f"the endpoint's supervisor (pid {record.supervisor.get('pid')})"
                               f" is gone, so nothing restarts its instances; its log ({log}) "
                               f"ends with:\n{tail}")
            self.metadata.remove_endpoint_instances(record.name)
            record = self.metadata.get_endpoint(record.name)
        return record

    # --- deleting -----------------------------------------------------------------------

    def delete(self, name: str, *, timeout: float = 60.0) -> None:
        """Stop the endpoint's instances and remove its record (waits up to *timeout*)."""
        record = self.metadata.find_endpoint(name)
        if record is None:
            raise EndpointNotFound(f"no endpoint named {name!r}; 'shoal endpoints list' shows "
                                   "the endpoints there", endpoint=name)
        if record.status != EndpointStatus.DELETING:
            with contextlib.suppress(InvalidTransitionError):
                record = self.metadata.update_endpoint(name, status=EndpointStatus.DELETING)
        backend = self._session.backend
        if record.supervisor.get("backend") == "ray-serve":
            from shoal.endpoints import _ray_serve

            _ray_serve.delete(self._session, record)
            self.metadata.delete_endpoint(name)
            self._remove_files(name)
            return
        if record.supervisor and backend.is_alive(record.supervisor):
            backend.signal_stop(record.supervisor)
            deadline = time.monotonic() + timeout
            delay = 0.01
            while time.monotonic() < deadline:
                if self.metadata.find_endpoint(name) is None:
                    self._remove_files(name)
                    return
                if backend.is_alive(record.supervisor) is False:
                    break
                time.sleep(delay)  # the supervisor stops the instances, then removes the record
                delay = min(delay * 1.5, 0.2)
            if backend.is_alive(record.supervisor):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(record.supervisor["pid"]), signal.SIGKILL)
        current = self.metadata.find_endpoint(name)
        if current is not None:
            self._clean_up(current)

    def _clean_up(self, record: EndpointRecord) -> None:
        _stop_instances(record)
        self._remove_files(record.name)
        self.metadata.delete_endpoint(record.name)

    def _remove_files(self, name: str) -> None:
        """What deploying *name* wrote: its directory under the home (the staged model, the
        code, the instances' logs) and the code and environment it shipped to the artifact
        store. The logs uploaded under ``endpoints/<name>/logs/`` stay, as SageMaker's
        CloudWatch logs outlive an endpoint."""
        import shutil

        shutil.rmtree(endpoint_dir(self._session.home, name), ignore_errors=True)
        artifacts = self._session.artifacts
        for part in ("code", "env", "model"):
            with contextlib.suppress(Exception):
                artifacts.delete_prefix(endpoint_key(name, part))


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
