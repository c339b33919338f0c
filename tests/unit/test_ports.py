"""Each implementation provides every method of the ports it stands for (``core/ports.py``),
and each port holds only its own domain: a new store client (issue #20's HTTP clients, one
per port) implements exactly one of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.backends.local import LocalBackend
from shoal.backends.memory import MemoryBackend
from shoal.backends.ray import RayBackend
from shoal.core.ports import (
    ArtifactStore,
    Backend,
    EndpointStore,
    JobStore,
    MetadataStore,
    MetricStore,
    RunStore,
    WarmPoolHost,
)
from shoal.errors import ConfigError
from shoal.storage.artifacts import FsspecArtifactStore
from shoal.storage.sql import SqlMetadataStore


def _methods(port: type) -> set[str]:
    return {n for n in vars(port) if not n.startswith("_")}


def test_the_sql_store_is_every_store_port(tmp_path: Path) -> None:
    store = SqlMetadataStore.open(f"sqlite:///{tmp_path / 'm.db'}", create=True)
    try:
        for port in (JobStore, MetricStore, RunStore, EndpointStore, MetadataStore):
            assert isinstance(store, port), port.__name__
    finally:
        store.close()


def test_the_store_ports_split_the_metadata_store_by_domain() -> None:
    jobs, metrics, endpoints = _methods(JobStore), _methods(MetricStore), _methods(EndpointStore)
    runs = _methods(RunStore)
    assert not (jobs & runs) and not (jobs & endpoints) and not (runs & endpoints)
    assert not (metrics & runs)  # RunStore inherits them
    assert {"create_job", "update_jobs", "put_job_payloads", "delete_jobs"} <= jobs
    assert {"add_metrics", "metric_summaries"} <= metrics
    assert {"create_run", "link_run_job", "delete_experiment"} <= runs
    assert {"create_endpoint", "put_endpoint_instance"} <= endpoints
    assert issubclass(RunStore, MetricStore)
    assert _methods(MetadataStore) == {"close"}  # the union adds nothing else


def test_the_backends_are_backends(tmp_path: Path) -> None:
    local, ray, memory = LocalBackend(tmp_path / "run"), RayBackend("auto"), MemoryBackend()
    for backend in (local, ray, memory):
        assert isinstance(backend, Backend), backend.name
    # Only the local backend's supervisors serve a warm pool themselves (a Ray node's warm
    # supervisor runs on a local backend too).
    assert [b.name for b in (local, ray, memory) if isinstance(b, WarmPoolHost)] == ["local"]


def test_the_fsspec_store_is_an_artifact_store(tmp_path: Path) -> None:
    store = FsspecArtifactStore.open(str(tmp_path / "artifacts"))
    assert isinstance(store, ArtifactStore)
    assert store.local_path("a/b.txt") == str(tmp_path / "artifacts" / "a" / "b.txt")


def test_a_warm_supervisor_on_a_backend_without_warm_pools_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from shoal import session as session_module

    monkeypatch.setattr(session_module.Session, "_make_backend", lambda self: MemoryBackend())
    session = session_module.Session(home=str(tmp_path / "home"))
    pool = str(tmp_path / "pool")
    with pytest.raises(ConfigError, match=f"backend 'memory' keeps no warm workers.*{pool}"):
        session_module._warm_endpoint(session, pool)
    session.close()
