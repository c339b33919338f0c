"""A team server whose backend is Ray: ``shoal server --backend ray --ray-address ...`` (a real
server process) against the suite's real two-node cluster (``ray_cluster``, token auth on).
A client with only the server's URL and a token runs ``@remote``, a batched ``map`` on warm
supervisor actors and a cancel; each job runs as a Ray actor on the cluster, its supervisor
reaching the server's stores over HTTP with its job token, and none of the server's
credentials (stores, the cluster's token) reach it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import wait_until
from shoal.core import JobQuery, JobStatus
from shoal.errors import JobCancelledError

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.mark.timeout(900)
def test_remote_map_and_cancel_through_a_server_run_on_its_ray_cluster(
        ray_cluster, own_shoal_server, tmp_path, monkeypatch):
    import shoal
    from shoal import RemoteExecutor, remote

    home = tmp_path / "server-home"
    server_env = {**{k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")},
                  "SHOAL_HOME": str(home), "XDG_CONFIG_HOME": str(home / "xdg-config")}
    init = subprocess.run([sys.executable, "-m", "shoal.cli", "server", "init"], env=server_env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert init.returncode == 0, init.stderr
    # The cluster's token is the server's alone (its own setting, read in its own process).
    _, url, _ = own_shoal_server("--backend", "ray", "--ray-address", ray_cluster.address,
                                 home=home, env={"SHOAL_RAY_AUTH_TOKEN_FILE":
                                                 str(ray_cluster.token)})
    for name in [k for k in os.environ if k.startswith(("SHOAL_", "RAY_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SHOAL_HOME", str(tmp_path / "client-home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "client-xdg"))
    monkeypatch.setenv("SHOAL_SERVER_URL", url)
    monkeypatch.setenv("SHOAL_TOKEN", init.stdout.strip())
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
