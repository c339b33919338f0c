"""A team server whose backend is Ray: ``shoal server --backend ray --ray-address ...`` (a real
server process) against the suite's real two-node cluster (``ray_cluster``, token auth on).
A client with only the server's URL and a token runs ``@remote``, a batched ``map`` on warm
supervisor actors and a cancel; each job runs as a Ray actor on the cluster, its supervisor
reaching the server's stores over HTTP with its job token, and none of the server's
credentials (stores, the cluster's token) reach it. ``Model.deploy`` through the server runs
the endpoint as a Ray Serve application on the cluster, invoked through the server's route;
a two-host training job runs its ranks on both nodes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from helpers import linear_onnx, wait_until
from shoal.core import JobQuery, JobStatus
from shoal.errors import JobCancelledError

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class RayServer:
    url: str
    home: Path
    env: dict[str, str]  # the server host's (shoal tokens create ... there)
    admin_token: str

    def token(self, user: str) -> str:
        """A new write token of *user* (created with it), made on the server's host."""
        made = subprocess.run(
            [sys.executable, "-m", "shoal.cli", "tokens", "create", "--user", user, "--name",
             f"laptop-{uuid.uuid4().hex[:8]}", "--create-user", "--scope", "write"],
            env=self.env, capture_output=True, text=True, timeout=120, check=False)
        assert made.returncode == 0, made.stderr
        return made.stdout.strip()


#: Credentials in the server's environment that nothing it starts may get.
SERVER_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "AKIASERVER", "AWS_SECRET_ACCESS_KEY": "server-secret",
                      "PGPASSWORD": "pg-secret", "TEAM_API_TOKEN": "team-token"}


@pytest.fixture
def ray_server(ray_cluster, own_shoal_server, tmp_path) -> RayServer:
    """``shoal server --backend ray`` on the suite's cluster, over its own SQLite and file://
    stores under its home, with credentials of its own (``SERVER_CREDENTIALS``); its Serve
    proxy (started by its first deploy, unless another test started Serve on the cluster
    already) on a free port."""
    home = tmp_path / "server-home"
    server_env = {**{k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")},
                  "SHOAL_HOME": str(home), "XDG_CONFIG_HOME": str(home / "xdg-config")}
    init = subprocess.run([sys.executable, "-m", "shoal.cli", "server", "init"], env=server_env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert init.returncode == 0, init.stderr
    # The cluster's token is the server's alone (its own setting, read in its own process).
    _, url, _ = own_shoal_server("--backend", "ray", "--ray-address", ray_cluster.address,
                                 home=home, env={"SHOAL_RAY_AUTH_TOKEN_FILE":
                                                 str(ray_cluster.token),
                                                 "SHOAL_RAY_SERVE_PORT": str(_free_port()),
                                                 **SERVER_CREDENTIALS})
    return RayServer(url, home, server_env, init.stdout.strip())


def _client_env(tmp_path: Path, url: str, token: str, who: str) -> dict[str, str]:
    """A client's whole shoal setting: the server's URL and a token (no store, no cluster)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHOAL_", "RAY_"))}
    env.update(SHOAL_HOME=str(tmp_path / f"{who}-home"),
               XDG_CONFIG_HOME=str(tmp_path / f"{who}-xdg"), SHOAL_SERVER_URL=url,
               SHOAL_TOKEN=token)
    return env


@pytest.fixture
def client(monkeypatch) -> Iterator[object]:
    """``client(env)``: this process becomes that client (its environment), with a session
    in use; closed at the end."""
    import shoal

    made: list[object] = []

    def start(env: dict[str, str]) -> shoal.Session:
        for name in [k for k in os.environ if k.startswith(("SHOAL_", "RAY_"))]:
            monkeypatch.delenv(name)
        for name in ("SHOAL_HOME", "XDG_CONFIG_HOME", "SHOAL_SERVER_URL", "SHOAL_TOKEN"):
            monkeypatch.setenv(name, env[name])
        session = shoal.Session()
        use = shoal.use(session)
        use.__enter__()
        made.append((session, use))
        return session

    yield start
    for session, use in reversed(made):
        use.__exit__(None, None, None)
        session.close()


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shoal.cli", *args], env=env,
                          capture_output=True, text=True, timeout=180, check=False)


@pytest.mark.timeout(900)
def test_remote_map_and_cancel_through_a_server_run_on_its_ray_cluster(
        ray_server, tmp_path, monkeypatch):
    import shoal
    from shoal import RemoteExecutor, remote

    url = ray_server.url
    for name in [k for k in os.environ if k.startswith(("SHOAL_", "RAY_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SHOAL_HOME", str(tmp_path / "client-home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "client-xdg"))
    monkeypatch.setenv("SHOAL_SERVER_URL", url)
    monkeypatch.setenv("SHOAL_TOKEN", ray_server.admin_token)
    # Warm actors hold a CPU while idle (the cluster has three): short, but past a loaded map.
    monkeypatch.setenv("SHOAL_RAY_KEEP_ALIVE_SECONDS", "20")

    @remote
    def where(x):
        import os

        print("on node", os.environ["SHOAL_RAY_NODE_ID"], flush=True)
        return (x * 2, os.environ["SHOAL_RAY_NODE_ID"], os.environ["SHOAL_TOKEN"][:7],
                os.environ["SHOAL_SERVER_URL"],
                sorted(k for k in os.environ if k.startswith(("RAY_AUTH", "AWS_"))
                       or k in ("SHOAL_METADATA_URL", "SHOAL_ARTIFACT_URL")))

    def square(x):
        return x * x

    def blocked(path):
        import os
        import time

        with open(path, "w") as f:
            f.write(str(os.getpid()))
        print("blocking", flush=True)
        while not os.path.exists(path + ".release"):  # until stopped (or the test is over)
            time.sleep(0.05)

    pid_file = tmp_path / "blocked.pid"
    session = shoal.Session()
    try:
        with shoal.use(session):
            assert session.jobs.backend.name == "ray"
            value, node, token, server_url, credentials = where(21)
            assert value == 42 and token == "shoalj_" and server_url == url
            assert credentials == []  # no store credential, no cluster token
            [record] = session.jobs.metadata.list_jobs(JobQuery(name_prefix="where-"))
            assert record.status == JobStatus.COMPLETED and record.handle["backend"] == "ray"
            assert record.handle["actor"].startswith("shoal-") and record.handle["pid"] > 0
            assert f"on node {node}".encode() in session.jobs.read_log(record.name)
            assert not (tmp_path / "client-home" / "work").exists()  # nothing ran here

            with RemoteExecutor(max_parallel_jobs=1, job_name_prefix="sq") as e:
                assert list(e.map(square, range(16))) == [x * x for x in range(16)]
            squares = session.jobs.metadata.list_jobs(JobQuery(name_prefix="sq-", limit=100))
            assert len(squares) == 16 and all(r.status == JobStatus.COMPLETED for r in squares)
            assert all(r.spec.batch is not None for r in squares)  # handed over as batches
            actors = {r.handle["actor"] for r in squares}
            assert len(actors) == 1 and actors.pop().startswith("shoal-warm-")

            with RemoteExecutor(job_name_prefix="blk") as e:
                future = e.submit(blocked, str(pid_file))
                wait_until(lambda: future.job_name and b"blocking" in
                           session.jobs.read_log(future.job_name), 180,
                           what="the blocked job running on the cluster")
                pid = int(pid_file.read_text())
                record = session.jobs.get(future.job_name)
                assert record.handle["actor"].startswith("shoal-warm-")
                session.jobs.cancel(record.name)
                assert session.jobs.wait(record.name, timeout=120).status == JobStatus.STOPPED
                with pytest.raises(JobCancelledError):
                    future.result(timeout=60)
            # stopped on the cluster: the job's process is gone (its warm actor stays, idle)
            wait_until(lambda: not os.path.exists(f"/proc/{pid}"), 60,
                       what=f"the job's process {pid} to end")
    finally:
        (tmp_path / "blocked.pid.release").touch()  # a failed test leaves no job blocked
        session.close()


# --- endpoints: Ray Serve applications started by the server ---------------------------------

W = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0], [0.5, -1.0]], dtype=np.float32)
B = np.array([0.25, -0.5], dtype=np.float32)

ENV_HANDLER = """
import os

def model_fn(model_dir):
    return None

def predict_fn(data, model):
    return {k: os.environ.get(k) for k in sorted(os.environ)}
"""

_SERVE_APPS = """
import json, logging, sys, warnings
warnings.simplefilter("ignore")
import ray
ray.init(address=sys.argv[1], log_to_driver=False, configure_logging=False,
         logging_level=logging.WARNING)
from ray.serve.context import _get_global_client
client = _get_global_client(raise_if_no_controller_running=False)
details = client.get_serve_details() if client is not None else {}
print(json.dumps(sorted(details.get("applications") or {})))
"""


def _serve_applications(cluster) -> list[str]:
    """The Serve applications on the cluster, as a driver of its own sees them."""
    from shoal.backends.ray_cluster import ray_env

    done = subprocess.run([sys.executable, "-c", _SERVE_APPS, cluster.address],
                          env=ray_env(cluster.token), capture_output=True, text=True,
                          timeout=180, check=False)
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.timeout(900)
def test_an_endpoint_through_a_ray_server_runs_on_ray_serve(ray_server, ray_cluster, client,
                                                            tmp_path):
    from shoal.core.endpoints import EndpointStatus
    from shoal.endpoints import EndpointService
    from shoal.errors import EndpointFailedError
    from shoal.model import Model

    model = tmp_path / "onnx-model"
    model.mkdir()
    linear_onnx(model / "model.onnx", W, B)
    alice = _client_env(tmp_path, ray_server.url, ray_server.token("alice"), "alice")
    session = client(alice)
    name = f"serve-{uuid.uuid4().hex[:8]}"
    predictor = Model(model_data=str(model)).deploy(endpoint_name=name)
    try:
        x = np.array([[1, 2, 3, 4], [0, 0, 0, 0]], dtype=np.float32)
        assert np.allclose(predictor.predict(x.tolist()), x @ W + B)
        assert predictor._client is None  # through the server's route, never Serve's proxy

        record = predictor.describe()
        assert record.status == EndpointStatus.IN_SERVICE and record.owner == "alice"
        assert record.supervisor["backend"] == "ray-serve"
        assert record.supervisor["application"] == f"shoal-{name}"
        assert record.urls and all(u.endswith(f"/endpoints/{name}") for u in record.urls)
        assert f"shoal-{name}" in _serve_applications(ray_cluster)
        # The model went up to the server's store; nothing of it is in the client's home.
        assert record.model_data.startswith(f"file://{ray_server.home}/artifacts/endpoints/")
        assert not (tmp_path / "alice-home" / "endpoints").exists()

        described = _cli(alice, "endpoints", "describe", name, "--json")
        assert described.returncode == 0, described.stderr
        shown = json.loads(described.stdout)
        assert shown["status"] == "InService" and shown["owner"] == "alice"
        invoked = _cli(alice, "endpoints", "invoke", name, "--body", "[[0, 0, 0, 1]]")
        assert invoked.returncode == 0, invoked.stderr
        assert np.allclose(json.loads(invoked.stdout), W[3:4] + B)

        # Bob may call it but not delete it: 403 naming its owner, and it keeps serving.
        bob = _client_env(tmp_path, ray_server.url, ray_server.token("bob"), "bob")
        refused = _cli(bob, "endpoints", "delete", name)
        assert refused.returncode != 0
        assert "'bob' may not delete endpoint" in refused.stderr, refused.stderr
        assert "'alice'" in refused.stderr
        by_bob = _cli(bob, "endpoints", "invoke", name, "--body", "[[1, 0, 0, 0]]")
        assert by_bob.returncode == 0, by_bob.stderr
        assert np.allclose(json.loads(by_bob.stdout), W[0:1] + B)
    finally:
        deleted = _cli(alice, "endpoints", "delete", name)
    assert deleted.returncode == 0, deleted.stderr
    assert EndpointService.for_session(session).find(name) is None
    assert f"shoal-{name}" not in _serve_applications(ray_cluster)  # no Serve app left
    assert not session.artifacts.list_keys(f"endpoints/{name}/model")
    # The replica wrote its log through the server as it stopped (logs outlive endpoints).
    [log] = session.artifacts.list_keys(f"endpoints/{name}/logs/")
    assert b"started on node" in session.artifacts.get_bytes(log)

    # The deployer's code goes up and the replica fetches it through the server too; the
    # model server (the deployer's code, on a node) gets none of the server's credentials.
    code = tmp_path / "env-handler"
    code.mkdir()
    (code / "serve.py").write_text(ENV_HANDLER)
    predictor = Model(model_data=str(model), entry_point="serve.py", source_dir=str(code),
                      env={"MY_OWN_TOKEN": "the deployer's"}).deploy(endpoint_name=f"{name}-env")
    try:
        seen = predictor.predict([[0, 0, 0, 0]])
    finally:
        predictor.delete_endpoint()
    assert seen["MY_OWN_TOKEN"] == "the deployer's"
    for variable, value in SERVER_CREDENTIALS.items():
        # The server's values never; a name the node's own environment sets (the suite's
        # cluster may hold the S3 tests' AWS_* settings) keeps the node's value.
        assert seen.get(variable) != value and value not in seen.values(), variable
    # No setting of the server's (its stores, home, URL, a token): the node's own stay.
    assert not {"SHOAL_METADATA_URL", "SHOAL_ARTIFACT_URL", "SHOAL_SERVER_URL",
                "SHOAL_TOKEN"} & seen.keys()
    assert not [v for v in seen.values() if v and (str(ray_server.home) in v
                                                   or v.startswith(("shoal_", "shoale_")))]

    # A model that cannot load: Serve fails the application, the reason reaches the record
    # (through the server) and the failed replicas' logs reach the server's store.
    (code / "serve.py").write_text("def model_fn(model_dir):\n"
                                   "    raise RuntimeError('boom while loading the model')\n")
    failing = f"{name}-boom"
    with pytest.raises(EndpointFailedError, match="boom while loading the model"):
        Model(model_data=str(model), entry_point="serve.py",
              source_dir=str(code)).deploy(endpoint_name=failing)
    service = EndpointService.for_session(session)
    assert service.get(failing).status == EndpointStatus.FAILED
    logs = session.artifacts.list_keys(f"endpoints/{failing}/logs/")
    assert any(b"boom while loading" in session.artifacts.get_bytes(k) for k in logs), logs
    service.delete(failing)
    assert service.find(failing) is None
    assert f"shoal-{failing}" not in _serve_applications(ray_cluster)


# --- a job on two hosts ------------------------------------------------------------------------

_TWO_HOSTS = r'''
import json, os

def environ(pid):
    with open(f"/proc/{pid}/environ", "rb") as f:
        return dict(e.decode(errors="replace").partition("=")[::2]
                    for e in f.read().split(b"\0") if e)

def parent(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(") ", 1)[1].split()[1])

def cmdline(pid):
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()

# This rank and its ancestors up to the Ray worker of its host's actor (host 1's supervisor
# actor, host 2's rank host): every process of the job on this host. A process that set its
# title (the supervisors, setproctitle) shows its title where its environment was: skipped.
chain, pid = [], os.getpid()
while pid > 1 and not cmdline(pid).startswith(b"ray::"):
    env = environ(pid)
    if "PATH" in env:
        chain.append({"pid": pid, "env": env, "cmd": cmdline(pid).split(b"\0")[:3]})
    pid = parent(pid)
seen = {
    "rank": int(os.environ["RANK"]), "host": os.environ["SM_CURRENT_HOST"],
    "node": os.environ["SHOAL_RAY_NODE_ID"], "world": int(os.environ["WORLD_SIZE"]),
    "reached_ray_worker": pid > 1, "processes": len(chain),
    "launcher": any(b"shoal.jobs._ranks" in p["cmd"] for p in chain),
    "store_or_aws": sorted({k for p in chain for k in p["env"]
                            if k.startswith("AWS_") or k in ("SHOAL_METADATA_URL",
                                                             "SHOAL_ARTIFACT_URL")}),
    "rank_ray_auth": sorted(k for k in os.environ if k.startswith("RAY_AUTH")),
    # the node's own setting (a path), which the host launchers connect to the cluster with
    "chain_ray_auth": sorted({k for p in chain for k in p["env"] if k.startswith("RAY_AUTH")}),
    "token_prefix": os.environ["SHOAL_TOKEN"][:7],
}
print("SEEN", json.dumps(seen), flush=True)
if seen["rank"] == 0:
    with open(os.path.join(os.environ["SM_MODEL_DIR"], "ranks.txt"), "w") as f:
        f.write("written by rank 0\n")
'''


@pytest.mark.timeout(900)
def test_a_two_host_job_through_a_ray_server_runs_a_rank_on_each_node(
        ray_server, ray_cluster, client, tmp_path):
    import tarfile

    from shoal.pytorch import PyTorch

    session = client(_client_env(tmp_path, ray_server.url, ray_server.token("carol"), "carol"))
    script = tmp_path / "two_hosts.py"
    script.write_text(_TWO_HOSTS)
    est = PyTorch(entry_point=str(script), instance_count=2,
                  distribution={"torch_distributed": {"enabled": True}})
    est.fit(logs=False)
    name = est.latest_training_job.name
    record = session.jobs.get(name)
    log = session.jobs.read_log(name).decode()
    assert record.status == JobStatus.COMPLETED, log
    assert record.owner == "carol" and record.handle["backend"] == "ray"
    assert record.handle.get("placement_group"), record.handle
    seen = {}
    for line in log.splitlines():
        if "SEEN " in line:
            found = json.loads(line.partition("SEEN ")[2])
            seen[found["rank"]] = (line.partition("]")[0] + "]", found)
    assert sorted(seen) == [0, 1], log
    assert seen[0][0] == "[algo-1 rank 0]" and seen[1][0] == "[algo-2 rank 1]"
    ranks = [found for _, found in seen.values()]
    assert {r["host"] for r in ranks} == {"algo-1", "algo-2"}
    assert len({r["node"] for r in ranks}) == 2  # one rank on each node of the cluster
    for r in ranks:
        assert r["world"] == 2 and r["token_prefix"] == "shoalj_"
        assert r["reached_ray_worker"] and r["processes"] >= 2 and r["launcher"], r
        assert r["store_or_aws"] == [] and r["rank_ray_auth"] == []
    # The token itself is in no process of the job. Only the first host's rank launcher has
    # the node's path to it (as every process Ray starts on the node has), for the launcher
    # of the second host's ranks, which connects to the cluster; the second host none.
    assert set(seen[0][1]["chain_ray_auth"]) <= {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH"}
    assert seen[1][1]["chain_ray_auth"] == []
    assert ray_cluster.token.read_text().strip() not in log
    # What rank 0 wrote is the job's model, in the server's store.
    model = tmp_path / "model.tar.gz"
    session.artifacts.get_file(f"{name}/output/model.tar.gz", model)
    with tarfile.open(model) as tar:
        member = tar.extractfile("ranks.txt")
        assert member is not None and member.read() == b"written by rank 0\n"
