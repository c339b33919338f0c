"""Fixtures for tests that run real jobs: a Session under tmp_path and its launcher."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import shoal
from helpers import endpoint_test_session
from ray_cluster import ray_session


def make_session(home: Path, **settings: object) -> shoal.Session:
    settings.setdefault("launcher_idle_seconds", 60)
    return shoal.Session(home=str(home), **settings)


@pytest.fixture
def session(tmp_path: Path) -> Iterator[shoal.Session]:
    s = make_session(tmp_path / "home")
    with shoal.use(s):
        yield s
    if s._backend is not None:
        s.backend.shutdown_launcher()
    s.close()


def server_token(server: Any, user: str, name: str, *extra: str) -> str:
    """A new API token of *user* (created with it) on the real *server*."""
    made = server.cli("tokens", "create", "--user", user, "--name", name, "--create-user",
                      *extra)
    assert made.returncode == 0, made.stderr
    return str(made.stdout.strip())


@pytest.fixture
def team(shoal_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
         ) -> Iterator[shoal.Session]:
    """A client of the shared server: its own (empty) home, a write token of its own user."""
    token = server_token(shoal_server, "alice", f"laptop-{uuid.uuid4().hex[:8]}", "--scope",
                         "write")
    for name in [k for k in os.environ if k.startswith("SHOAL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SHOAL_HOME", str(tmp_path / "client-home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "client-xdg"))
    monkeypatch.setenv("SHOAL_SERVER_URL", shoal_server.url)
    monkeypatch.setenv("SHOAL_TOKEN", token)
    session = shoal.Session()
    with shoal.use(session):
        yield session
    session.close()


RAY = pytest.param("ray", marks=[pytest.mark.ray, pytest.mark.postgres, pytest.mark.s3])


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(params=["local", RAY])
def endpoint_session(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[shoal.Session]:
    """The endpoint contract's session: on the local backend, and on the two-node Ray cluster
    (endpoints on Ray Serve) with PostgreSQL and S3. Deletes what the test left deployed."""
    if request.param == "ray":
        # Serve's proxy binds 127.0.0.1 on a free port (the first deploy on the cluster
        # starts Serve; the records carry the address Serve really uses).
        s = ray_session(request, tmp_path / "home", ray_serve_port=_free_port())
    else:
        s = shoal.Session(home=str(tmp_path / "home"), launcher_idle_seconds=60)
    with endpoint_test_session(s, local=request.param == "local"):
        yield s
