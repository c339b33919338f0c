"""The endpoint backend seam: ``EndpointService`` over a real SQLite metadata store and a real
local artifact store, with an in-memory ``EndpointBackend`` that records what the service asks
of it. Whatever runs the endpoint, the service does the same: it checks before recording,
ships the code, keeps the handle, turns what the backend sees into status transitions and
failure reasons, and removes the record and the shipped files on deletion."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

import shoal
from shoal.core.endpoints import (
    EndpointConfig,
    EndpointInstance,
    EndpointRecord,
    EndpointStatus,
    InstanceStatus,
    RuntimeState,
    RuntimeView,
    endpoint_key,
)
from shoal.endpoints import EndpointService
from shoal.endpoints._ray_serve import RayServeEndpoints
from shoal.endpoints._supervisor import SupervisedEndpoints
from shoal.errors import BackendUnavailableError, EndpointFailedError, InvalidArgumentError
from shoal.storage.artifacts import FsspecArtifactStore
from shoal.storage.sql import SqlMetadataStore


class MemoryEndpoints:
    """An EndpointBackend whose runtime is a value the test sets (``view``)."""

    def __init__(self, kind: str = "memory") -> None:
        self.kind = kind
        self.calls: list[tuple[str, str]] = []
        self.deployed: dict[str, dict[str, Any]] = {}
        self.view = RuntimeView(RuntimeState.UNCHANGED)
        self.fail_deploy: Exception | None = None

    def owns(self, handle: Mapping[str, Any]) -> bool:
        return handle.get("backend") == self.kind

    def check(self, config: EndpointConfig) -> None:
        self.calls.append(("check", str(config.instance_count)))
        if config.port is not None:
            raise InvalidArgumentError("no fixed ports here", argument="port")

    def deploy(self, name: str, *, model_data: str, config: EndpointConfig,
               code_key: str | None, requirements_key: str | None) -> Mapping[str, Any]:
        self.calls.append(("deploy", name))
        if self.fail_deploy is not None:
            raise self.fail_deploy
        self.deployed[name] = {"model_data": model_data, "code_key": code_key,
                               "requirements_key": requirements_key}
        return {"backend": self.kind, "application": f"app-{name}"}

    def refresh(self, record: EndpointRecord) -> RuntimeView:
        self.calls.append(("refresh", record.name))
        return self.view

    def delete(self, record: EndpointRecord, *, timeout: float) -> None:
        self.calls.append(("delete", record.name))
        self.view = RuntimeView(RuntimeState.GONE)


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[tuple[SqlMetadataStore, FsspecArtifactStore]]:
    metadata = SqlMetadataStore.open(f"sqlite:///{tmp_path / 'shoal.db'}", create=True)
    artifacts = FsspecArtifactStore.open(str(tmp_path / "artifacts"))
    yield metadata, artifacts
    metadata.close()


def _service(stores: tuple[SqlMetadataStore, FsspecArtifactStore], tmp_path: Path,
             *backends: MemoryEndpoints) -> EndpointService:
    metadata, artifacts = stores
    return EndpointService(metadata, artifacts, backends, home=tmp_path / "home")


def test_create_checks_then_ships_the_code_and_keeps_the_backends_handle(stores, tmp_path):
    backend = MemoryEndpoints()
    service = _service(stores, tmp_path, backend)
    archive = tmp_path / "code.tar.gz"
    archive.write_bytes(b"not really a tarball")
    record = service.create("seam", model_data="s3://bucket/model.tar.gz",
                            config=EndpointConfig(instance_count=2), code_archive=archive,
                            requirements="numpy\n")
    assert record.status == EndpointStatus.CREATING
    assert backend.calls == [("check", "2"), ("deploy", "seam")]
    code_key = endpoint_key("seam", "code", "code.tar.gz")
    requirements_key = endpoint_key("seam", "env", "requirements.txt")
    assert backend.deployed["seam"] == {"model_data": "s3://bucket/model.tar.gz",
                                        "code_key": code_key,
                                        "requirements_key": requirements_key}
    metadata, artifacts = stores
    assert artifacts.get_bytes(code_key) == b"not really a tarball"
    assert artifacts.get_bytes(requirements_key) == b"numpy\n"
    assert dict(metadata.get_endpoint("seam").supervisor) == {"backend": "memory",
                                                             "application": "app-seam"}


def test_a_refused_config_records_nothing(stores, tmp_path):
    backend = MemoryEndpoints()
    service = _service(stores, tmp_path, backend)
    with pytest.raises(InvalidArgumentError, match="no fixed ports"):
        service.create("refused", model_data="s3://b/m", config=EndpointConfig(port=9000))
    assert service.find("refused") is None
    assert [c[0] for c in backend.calls] == ["check"]


def test_a_deploy_that_fails_leaves_the_endpoint_failed_with_the_cause(stores, tmp_path):
    backend = MemoryEndpoints()
    backend.fail_deploy = RuntimeError("the cluster said no")
    service = _service(stores, tmp_path, backend)
    with pytest.raises(RuntimeError, match="the cluster said no"):
        service.create("nope", model_data="s3://b/m", config=EndpointConfig())
    record = service.get("nope")
    assert record.status == EndpointStatus.FAILED
    assert record.failure_reason == "could not start: the cluster said no"


def test_what_the_backend_sees_becomes_the_records_status(stores, tmp_path):
    backend = MemoryEndpoints()
    service = _service(stores, tmp_path, backend)
    service.create("live", model_data="s3://b/m", config=EndpointConfig())
    assert service.get("live").status == EndpointStatus.CREATING  # UNCHANGED: as it stands

    backend.view = RuntimeView(RuntimeState.READY,
                               addresses=(("10.0.0.1", 8000), ("10.0.0.2", 8000)))
    ready = service.wait("live", timeout=10)
    assert ready.status == EndpointStatus.IN_SERVICE
    assert [(i.host, i.port, i.status) for i in ready.instances] == [
        ("10.0.0.1", 8000, InstanceStatus.IN_SERVICE),
        ("10.0.0.2", 8000, InstanceStatus.IN_SERVICE)]

    backend.view = RuntimeView(RuntimeState.FAILED, reason="the replicas crashed: OOM")
    failed = service.get("live")
    assert failed.status == EndpointStatus.FAILED
    assert failed.failure_reason == "the replicas crashed: OOM"
    assert failed.instances == ()
    with pytest.raises(EndpointFailedError, match="the replicas crashed: OOM") as info:
        service.wait("live", timeout=10)
    assert info.value.details["logs"].endswith("endpoints/live/logs")
    assert ("refresh", "live") in backend.calls


def test_a_live_endpoint_whose_runtime_is_gone_fails_with_the_reason(stores, tmp_path):
    backend = MemoryEndpoints()
    service = _service(stores, tmp_path, backend)
    service.create("orphan", model_data="s3://b/m", config=EndpointConfig())
    metadata, _ = stores
    metadata.put_endpoint_instance("orphan", EndpointInstance(0, "127.0.0.1", 1234))
    backend.view = RuntimeView(RuntimeState.GONE, reason="its supervisor is gone")
    (record,) = service.list()
    assert record.status == EndpointStatus.FAILED
    assert record.failure_reason == "its supervisor is gone"
    assert record.instances == ()
    assert metadata.get_endpoint("orphan").status == EndpointStatus.FAILED  # stored, not shown


def test_delete_stops_the_runtime_and_removes_the_record_and_shipped_files(stores, tmp_path):
    backend = MemoryEndpoints()
    service = _service(stores, tmp_path, backend)
    service.create("gone", model_data="s3://b/m", config=EndpointConfig(),
                   requirements="numpy\n")
    _, artifacts = stores
    artifacts.put_bytes(endpoint_key("gone", "logs", "instance-0.log"), b"served")
    local = tmp_path / "home" / "endpoints" / "gone"
    local.mkdir(parents=True)
    service.delete("gone")
    assert ("delete", "gone") in backend.calls
    assert service.find("gone") is None
    assert not local.exists()
    assert not artifacts.exists(endpoint_key("gone", "env", "requirements.txt"))
    assert artifacts.get_bytes(endpoint_key("gone", "logs", "instance-0.log")) == b"served"


def test_a_deleting_endpoint_is_finished_off_once_its_runtime_is_gone(stores, tmp_path):
    backend = MemoryEndpoints()
    service = _service(stores, tmp_path, backend)
    service.create("half", model_data="s3://b/m", config=EndpointConfig())
    metadata, _ = stores
    metadata.update_endpoint("half", status=EndpointStatus.DELETING)
    backend.view = RuntimeView(RuntimeState.READY, addresses=(("h", 1),))
    assert service.get("half").status == EndpointStatus.DELETING  # not back to InService
    backend.view = RuntimeView(RuntimeState.GONE)
    assert service.find("half") is None
    assert metadata.find_endpoint("half") is None


def test_each_record_is_managed_by_the_backend_that_owns_its_handle(stores, tmp_path):
    first, second = MemoryEndpoints("first"), MemoryEndpoints("second")
    metadata, _ = stores
    older = _service(stores, tmp_path, second)
    older.create("old", model_data="s3://b/m", config=EndpointConfig())
    service = _service(stores, tmp_path, first, second)
    service.create("new", model_data="s3://b/m", config=EndpointConfig())
    assert dict(metadata.get_endpoint("new").supervisor)["backend"] == "first"
    second.view = RuntimeView(RuntimeState.FAILED, reason="second's own failure")
    assert service.get("old").failure_reason == "second's own failure"
    assert service.get("new").status == EndpointStatus.CREATING
    assert ("refresh", "old") not in first.calls and ("refresh", "new") not in second.calls


def test_a_record_no_backend_owns_is_shown_as_it_stands_and_not_deleted(stores, tmp_path):
    elsewhere = MemoryEndpoints("ray-serve")
    _service(stores, tmp_path, elsewhere).create("far", model_data="s3://b/m",
                                                 config=EndpointConfig())
    here = MemoryEndpoints("local")
    service = _service(stores, tmp_path, here)
    assert service.get("far").status == EndpointStatus.CREATING
    with pytest.raises(BackendUnavailableError, match="'ray-serve'.*select the backend"):
        service.delete("far")
    assert here.calls == []
    metadata, _ = stores
    assert metadata.get_endpoint("far").status == EndpointStatus.DELETING


def test_the_session_chooses_ray_serve_when_its_backend_is_ray(tmp_path):
    local = shoal.Session(home=str(tmp_path / "local"))
    (supervised,) = local.endpoint_backends
    assert isinstance(supervised, SupervisedEndpoints)
    assert supervised.owns({"backend": "local", "pid": 1})
    assert not supervised.owns({"backend": "ray-serve", "application": "shoal-x"})

    ray = shoal.Session(home=str(tmp_path / "ray"), backend="ray")  # connects on first use
    serve, still_supervised = ray.endpoint_backends
    assert isinstance(serve, RayServeEndpoints) and serve.owns({"backend": "ray-serve"})
    assert isinstance(still_supervised, SupervisedEndpoints)
    assert still_supervised.owns({"backend": "local", "pid": 1})
    local.close()
    ray.close()
