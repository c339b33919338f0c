"""A real Ray cluster on 127.0.0.1 for the ray backend's tests, run through 'shoal ray'.

Two nodes: the head (2 CPUs) and a second node (1 CPU) that advertises ``{"node2": 1}``. Both
have their own temporary directories; 'shoal ray down' stops exactly their processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import shoal

__all__ = ["RayCluster", "ray_session", "shared_cluster", "shoal_ray"]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def shoal_ray(home: Path, *args: str, timeout: float = 180) -> str:
    done = subprocess.run([sys.executable, "-m", "shoal.cli", "--home", str(home), "ray", *args],
                          capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"shoal ray {' '.join(args)} failed ({done.returncode}):\n"
                           f"{done.stdout}\n{done.stderr}")
    return done.stdout


@dataclass
class RayCluster:
    home: Path
    address: str = ""

    @property
    def token(self) -> Path:
        return self.home / "ray" / "auth_token"

    def nodes(self) -> list[dict]:
        return json.loads((self.home / "ray" / "nodes.json").read_text())

    @property
    def client_address(self) -> str:
        """The head's Ray Client address (``ray://127.0.0.1:PORT``)."""
        [head] = [n for n in self.nodes() if n["head"]]
        return head["client_address"]

    def start(self) -> RayCluster:
        self.home.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        shoal_ray(self.home, "up", "--port", str(port), "--num-cpus", "2",
                  "--client-port", str(_free_port()))
        self.address = f"127.0.0.1:{port}"
        self.add_node("node2")
        return self

    def add_node(self, resource: str) -> str:
        """Start a 1-CPU node advertising ``{resource: 1}``; return its tag."""
        shoal_ray(self.home, "up", "--address", self.address, "--num-cpus", "1",
                  "--resources", json.dumps({resource: 1}))
        return self.nodes()[-1]["tag"]

    def kill_node(self, tag: str) -> None:
        shoal_ray(self.home, "down", "--node", tag, "--force")

    def stop(self) -> None:
        shoal_ray(self.home, "down")


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[Path]:
    with open(root / "ray-cluster.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield root / "ray-cluster.json"


@contextlib.contextmanager
def shared_cluster(root: Path) -> Iterator[RayCluster]:
    """One cluster for every pytest process that shares *root* (the xdist workers of a run):
    started by the first to enter, stopped by the last to leave."""
    with _locked(root) as state:
        info = json.loads(state.read_text()) if state.exists() else None
        if info is None:
            cluster = RayCluster(root / f"ray-{uuid.uuid4().hex[:6]}" / "home")
            cluster.start()
            info = {"home": str(cluster.home), "address": cluster.address, "users": 0}
        info["users"] += 1
        state.write_text(json.dumps(info))
    try:
        yield RayCluster(Path(info["home"]), info["address"])
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        with _locked(root) as state:
            info = json.loads(state.read_text())
            info["users"] -= 1
            if info["users"] <= 0:
                state.unlink()
                RayCluster(Path(info["home"]), info["address"]).stop()
            else:
                state.write_text(json.dumps(info))


def ray_session(request: pytest.FixtureRequest, home: Path, **settings: object) -> shoal.Session:
    """A session on the test cluster with the team stores (each test its own bucket)."""
    from shoal.storage.sql import upgrade_schema

    postgres_url = request.getfixturevalue("postgres_url")
    url, _options = request.getfixturevalue("s3_bucket_url")
    monkeypatch = request.getfixturevalue("monkeypatch")
    # botocore reads the endpoint from the environment, which the supervisors inherit.
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", request.getfixturevalue("moto_server"))
    upgrade_schema(postgres_url)
    # Warm supervisor actors hold their CPUs while idle, and the test cluster has three: a
    # test's own calls reuse them, the next tests (and Serve replicas) get the CPUs soon.
    settings.setdefault("ray_keep_alive_seconds", 5)
    if "ray_address" not in settings:  # the suite's cluster (a test may bring its own)
        cluster = request.getfixturevalue("ray_cluster")
        settings["ray_address"] = cluster.address  # or cluster.client_address (ray://)
        settings.setdefault("ray_auth_token_file", str(cluster.token))
    settings.setdefault("metadata_url", postgres_url)  # or a test's own server's
    return shoal.Session(home=str(home), backend="ray", artifact_url=url, **settings)
