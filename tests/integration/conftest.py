"""Fixtures for tests that run real jobs: a Session under tmp_path and its launcher."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
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


# --- a PostgreSQL server a test may stop (outages) -----------------------------------

class OwnPostgres:
    """A PostgreSQL server of this test's own (scripts/postgres.sh), which it may stop."""

    def __init__(self, root: Path) -> None:
        script = Path(__file__).resolve().parents[2] / "scripts" / "postgres.sh"
        self.root = root
        self.url = subprocess.run(["bash", str(script), "start", str(root)], check=True,
                                  capture_output=True, text=True, timeout=120).stdout.strip()
        self.port = int(self.url.rpartition(":")[2].partition("/")[0])
        self._bin = Path(shutil.which("pg_ctl") or "pg_ctl").parent
        for found in sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl")):
            self._bin = found.parent

    def _pg_ctl(self, *args: str) -> None:
        argv = [str(self._bin / "pg_ctl"), "-D", str(self.root / "data"), *args]
        if os.getuid() == 0:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        subprocess.run(argv, check=True, capture_output=True, timeout=120)

    def stop(self) -> None:
        self._pg_ctl("-m", "immediate", "stop")

    def start(self) -> None:
        self._pg_ctl("-l", str(self.root / "server.log"), "-w", "-t", "60", "-o",
                     f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                     "-c fsync=off -c max_connections=200", "start")


@pytest.fixture
def own_postgres(postgres_server_url: str) -> Iterator[OwnPostgres]:
    """Where the suite has PostgreSQL (make test), a server of this test's own to stop."""
    if not (shutil.which("pg_ctl") or list(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))):
        pytest.skip("PostgreSQL's server programs are not installed (scripts/postgres.sh "
                    "installs them)")
    # Under /tmp as scripts/test.sh does: the server's user must reach the directory.
    root = Path(tempfile.mkdtemp(prefix="shoal-own-pg."))
    try:
        server = OwnPostgres(root)
        try:
            yield server
        finally:
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                server.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
