"""Root conftest: directory markers, a clean environment, and the S3/PostgreSQL fixtures."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import fresh_postgres_database, wait_until

TESTS = Path(__file__).parent
_SUITES = ("unit", "integration", "e2e", "contract")

# Read once, before the autouse clean_env fixture strips SHOAL_* from each test's environment.
_POSTGRES_URL = os.environ.get("SHOAL_TEST_POSTGRES_URL", "")
_REQUIRE_POSTGRES = (os.environ.get("CI", "").lower() == "true"
                     or os.environ.get("SHOAL_REQUIRE_POSTGRES") == "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test unit/integration/e2e/contract after the directory it lives in."""
    for item in items:
        try:
            parts = item.path.relative_to(TESTS).parts
        except ValueError:
            continue
        if parts and parts[0] in _SUITES:
            item.add_marker(getattr(pytest.mark, parts[0]))


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No SHOAL_* variable leaks in; SHOAL_HOME and the XDG config dir point into tmp_path."""
    for name in list(os.environ):
        if name.startswith("SHOAL_"):
            monkeypatch.delenv(name)
    home = tmp_path / "home"
    monkeypatch.setenv("SHOAL_HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    return home


@pytest.fixture(autouse=True)
def shoal_logger_restored() -> Iterator[None]:
    """Each test starts with the ``shoal`` logger as the library leaves it: an in-process CLI
    call (``logconfig.configure``) sets its level, adds a handler and stops propagation, which
    hid later tests' records from ``caplog`` in the same worker."""
    import logging

    logger = logging.getLogger("shoal")
    saved = (logger.level, list(logger.handlers), logger.propagate)
    yield
    logger.setLevel(saved[0])
    logger.handlers[:] = saved[1]
    logger.propagate = saved[2]


# --- S3 (moto) ----------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(url: str) -> bool:
    import urllib.request

    with urllib.request.urlopen(f"{url}/moto-api/", timeout=1) as r:
        return r.status < 500


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A moto S3 server on a free loopback port, for this session (or xdist worker)."""
    pytest.importorskip("moto.server", reason="moto[server] is not installed")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path_factory.mktemp("moto") / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
    try:
        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {proc.returncode}: "
                                   f"{log_path.read_text(errors='replace')[-2000:]}")
            return _answers(url)

        wait_until(up, 30, what=f"moto server at {url}")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


# --- the team server (shoal server) -------------------------------------------------------

@dataclass(frozen=True)
class ShoalServer:
    url: str
    admin_token: str
    home: Path
    env: dict[str, str]

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``shoal ARGS`` on the server's host (its home), captured."""
        return subprocess.run([sys.executable, "-m", "shoal.cli", *args], env=self.env,
                              capture_output=True, text=True, timeout=120, check=False)


def _server_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    env.update(SHOAL_HOME=str(home), XDG_CONFIG_HOME=str(home / "xdg-config"),
               OMP_NUM_THREADS="1")
    return env


def start_shoal_server(home: Path, *args: str, env: dict[str, str] | None = None,
                       port: int | None = None) -> tuple[subprocess.Popen[bytes], str, Path]:
    """A real ``shoal server`` on a free loopback port (or *port*: a restart on the same
    address), returning process, URL and log path once it answers ``GET /api/v1/version``;
    *env* adds to its environment."""
    import urllib.request

    port = port or _free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = home / f"server-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "shoal.cli", "server", "--port",
                                 str(port), *args], env={**_server_env(home), **(env or {})},
                                stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"shoal server exited with {proc.returncode}: "
                               f"{log_path.read_text(errors='replace')[-2000:]}")
        with urllib.request.urlopen(f"{url}/api/v1/version", timeout=2) as r:
            return r.status == 200

    try:
        wait_until(up, 60, what=f"shoal server at {url}")
    except BaseException:
        stop_process(proc)
        raise
    return proc, url, log_path


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def shoal_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    """One real ``shoal server`` (SQLite in a temporary home, tokens on) for this session or
    xdist worker; its first admin's token made by ``shoal server init``."""
    home = tmp_path_factory.mktemp("server-home")
    env = _server_env(home)
    init = subprocess.run([sys.executable, "-m", "shoal.cli", "server", "init"], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert init.returncode == 0, init.stderr
    token = init.stdout.strip()
    proc, url, _ = start_shoal_server(home)
    try:
        yield ShoalServer(url, token, home, env)
    finally:
        stop_process(proc)


@pytest.fixture
def own_shoal_server(tmp_path_factory: pytest.TempPathFactory
                     ) -> Iterator[Callable[..., tuple[subprocess.Popen[bytes], str, Path]]]:
    """Starts servers of the test's own (``start_shoal_server``'s arguments but the home: a
    fresh one each); stopped at the test's end."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*args: str, env: dict[str, str] | None = None, home: Path | None = None,
              port: int | None = None) -> tuple[subprocess.Popen[bytes], str, Path]:
        # home= and port=: a server restarted where an earlier one ran
        home = home or tmp_path_factory.mktemp("own-server-home")
        proc, url, _ = start_shoal_server(home, *args, env=env, port=port)
        started.append(proc)
        return proc, url, home

    try:
        yield start
    finally:
        for proc in started:
            stop_process(proc)


@pytest.fixture
def s3_bucket_url(moto_server: str, monkeypatch: pytest.MonkeyPatch) -> tuple[str, dict]:
    """A fresh bucket on the moto server: ``("s3://<bucket>/root", storage_options)``."""
    boto3 = pytest.importorskip("boto3")
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_SESSION_TOKEN", "testing"), ("AWS_DEFAULT_REGION", "us-east-1"),
                        ("AWS_CONFIG_FILE", os.devnull),
                        ("AWS_SHARED_CREDENTIALS_FILE", os.devnull)):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    bucket = f"shoal-test-{uuid.uuid4().hex[:16]}"
    client = boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    try:
        client.create_bucket(Bucket=bucket)
    finally:
        client.close()
    options = {"key": "testing", "secret": "testing",
               "client_kwargs": {"endpoint_url": moto_server, "region_name": "us-east-1"}}
    return f"s3://{bucket}/root", options


# --- PostgreSQL ---------------------------------------------------------------------------

def _need_postgres() -> str:
    if _POSTGRES_URL:
        return _POSTGRES_URL
    reason = ("SHOAL_TEST_POSTGRES_URL is not set; scripts/test.sh (make test) starts a "
              "PostgreSQL server and sets it")
    if _REQUIRE_POSTGRES:
        pytest.fail(f"PostgreSQL is required here (CI=true or SHOAL_REQUIRE_POSTGRES=1) but "
                    f"{reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def postgres_server_url() -> str:
    """The server URL from SHOAL_TEST_POSTGRES_URL (skips, or fails on CI, when unset)."""
    return _need_postgres()


@pytest.fixture(scope="session")
def postgres_url(postgres_server_url: str) -> Iterator[str]:
    """An empty database of its own for this session/xdist worker on the test server.

    Tests share it within a worker, so they use unique job names and never assume the
    tables are empty; a worker may still clear them without disturbing the other workers.
    """
    with fresh_postgres_database(postgres_server_url) as url:
        yield url


# --- Ray ----------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Iterator[object]:
    """A two-node Ray cluster on 127.0.0.1 ('shoal ray up'), shared by the xdist workers of
    this run: the first that needs it starts it, the last that used it stops it."""
    pytest.importorskip("ray", reason="ray is not installed (pip install 'shoal[ray]')")
    from ray_cluster import shared_cluster

    base = tmp_path_factory.getbasetemp()
    with shared_cluster(base.parent if worker_id != "master" else base) as cluster:
        yield cluster
