"""What survives what on Ray (issue #23): a killed supervisor costs an attempt, not the job; a
head that goes away leaves the records readable, every wait bounded, and no record behind
that is not terminal once the cluster answers again."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

import shoal
from helpers import wait_until
from ray_cluster import RayCluster, ray_session, shoal_ray
from shoal import RemoteExecutor
from shoal.core import JobQuery, JobStatus

pytestmark = [pytest.mark.ray, pytest.mark.postgres, pytest.mark.s3]


def _attempt_then_block(marks: str) -> str:
    import time

    path = Path(marks)
    with open(path, "a") as f:
        f.write("x")
    if len(path.read_text()) == 1:
        print("first attempt blocking", flush=True)
        while True:
            time.sleep(0.05)
    return f"attempt {len(path.read_text())} done on {os.environ['SHOAL_RAY_NODE_ID']}"


def test_a_killed_supervisor_worker_is_retried_on_ray(request, tmp_path):
    s = ray_session(request, tmp_path / "home", ray_keep_alive_seconds=0)
    marks = tmp_path / "attempts"
    try:
        with shoal.use(s), RemoteExecutor(max_retry_attempts=2,
                                          job_name_prefix="ray-lost-sup") as executor:
            future = executor.submit(_attempt_then_block, str(marks))
            wait_until(lambda: future.job_name and b"blocking" in s.jobs.read_log(
                future.job_name), 120, what="the first attempt to run")
            handle = s.jobs.get(future.job_name).handle
            where = s.backend.describe(handle)
            assert where is not None
            # The actor's worker process (the supervisor's parent) dies, as a crash would.
            worker = int(Path(f"/proc/{where['pid']}/stat").read_text()
                         .rpartition(")")[2].split()[1])
            os.kill(worker, signal.SIGKILL)
            assert future.result(timeout=180).startswith("attempt 2 done")
        record = s.jobs.get(future.job_name)
        assert record.status == JobStatus.COMPLETED and record.attempt == 2
        [ended] = [e.reason for e in record.events if "attempt 1 of 2 ended" in (e.reason or "")]
        assert f"Ray actor {handle['actor']}" in ended and "pid 0" not in ended
        # Its node lives on: the record says the supervisor's process alone was lost.
        assert f"was killed while its node, node {where['node_id']}" in ended, ended
        assert "still runs" in ended and "declared dead" not in ended
        log = s.jobs.read_log(future.job_name).decode()
        assert "first attempt blocking" in log and "attempt 2 of 2" in log
    finally:
        s.close()


# --- the head goes away -----------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


_CLIENT = textwrap.dedent("""
    import json, sys, time
    import shoal
    from shoal import RemoteExecutor
    from shoal.errors import BackendUnavailableError

    def block():
        import time
        print("blocking", flush=True)
        time.sleep(600)

    cfg = json.loads(sys.argv[1])
    s = shoal.Session(**cfg["session"])
    s.jobs.backend_wait_seconds = 10
    with shoal.use(s):
        ex = RemoteExecutor(job_name_prefix=cfg["prefix"])
        future = ex.submit(block)
        while not (future.job_name and b"blocking" in s.jobs.read_log(future.job_name)):
            time.sleep(0.2)
        print("RUNNING", future.job_name, flush=True)
        sys.stdin.readline()  # the test kills the head meanwhile
        t0 = time.monotonic()
        try:
            future.result(timeout=300)
            print("RESULT unexpected", flush=True)
        except BackendUnavailableError as e:
            print("UNAVAILABLE", round(time.monotonic() - t0), str(e), flush=True)
        # waiting again is allowed, and ends the same way while the head is away
        try:
            s.jobs.wait(future.job_name, timeout=120)
        except BackendUnavailableError as e:
            print("AGAIN", str(e).splitlines()[0], flush=True)
        import os
        os._exit(0)
""")


@pytest.mark.timeout(420)  # a cluster of its own, nodes killed and declared dead
def test_a_dead_head_leaves_records_readable_and_waits_bounded(request, tmp_path):
    from shoal.storage.sql import upgrade_schema

    postgres_url = request.getfixturevalue("postgres_url")
    url, _ = request.getfixturevalue("s3_bucket_url")
    moto = request.getfixturevalue("moto_server")
    upgrade_schema(postgres_url)
    cluster = tmp_path / "cluster"  # a cluster of its own: the suite's keeps its head
    port = _free_port()
    shoal_ray(cluster, "up", "--port", str(port), "--num-cpus", "1",
              "--client-port", str(_free_port()))
    address = f"127.0.0.1:{port}"
    settings = {"home": str(tmp_path / "home"), "backend": "ray", "ray_address": address,
                "ray_auth_token_file": str(cluster / "ray" / "auth_token"),
                "metadata_url": postgres_url, "artifact_url": url, "ray_keep_alive_seconds": 0}
    env = {**os.environ, "AWS_ENDPOINT_URL_S3": moto}
    prefix = f"headless-{uuid.uuid4().hex[:6]}"
    client = subprocess.Popen(
        [sys.executable, "-c", _CLIENT, json.dumps({"session": settings, "prefix": prefix})],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=env)
    try:
        line = ""
        while not line.startswith("RUNNING"):
            line = client.stdout.readline()
            assert line, "the client ended before its job ran"
        name = line.split()[1]
        shoal_ray(cluster, "down", "--force")  # the head (GCS, raylet, the supervisor) dies
        client.stdin.write("go\n")
        client.stdin.flush()
        out, _ = client.communicate(timeout=240)
    finally:
        if client.poll() is None:
            client.kill()
    [unavailable] = [ln for ln in out.splitlines() if ln.startswith("UNAVAILABLE")]
    seconds = int(unavailable.split()[1])
    assert seconds < 90 and address in unavailable and name in unavailable
    assert any(ln.startswith("AGAIN") and address in ln for ln in out.splitlines()), out
    # The CLI reads the records from the metadata store within seconds, liveness unknown.
    cli_env = {**env, "SHOAL_BACKEND": "ray", "SHOAL_RAY_ADDRESS": address,
               "SHOAL_METADATA_URL": postgres_url, "SHOAL_ARTIFACT_URL": url,
               "SHOAL_RAY_AUTH_TOKEN_FILE": settings["ray_auth_token_file"]}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "shoal.cli", "--home", settings["home"],
                           "jobs", "list", "--json"], env=cli_env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 60
    [listed] = [j for j in json.loads(done.stdout) if j["name"] == name]
    assert listed["status"] == "running" and address in done.stderr
    # The head comes back (a new cluster at that address): the record ends at once.
    shoal_ray(cluster, "up", "--port", str(port), "--num-cpus", "1",
              "--client-port", str(_free_port()))
    try:
        done = subprocess.run([sys.executable, "-m", "shoal.cli", "--home", settings["home"],
                               "jobs", "describe", name, "--json"], env=cli_env,
                              capture_output=True, text=True, timeout=180, check=False)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["status"] == "failed"
    finally:
        shoal_ray(cluster, "down", "--force")
    s = shoal.Session(home=settings["home"], metadata_url=postgres_url, artifact_url=url)
    try:
        records = s.metadata.list_jobs(JobQuery(name_prefix=prefix))
        assert records and all(r.is_terminal for r in records)
    finally:
        s.close()


# --- a node goes away -------------------------------------------------------------------

@pytest.fixture
def own_cluster(tmp_path):
    """A cluster of its own (a 1-CPU head) for a test that kills nodes: the suite's cluster
    runs other tests' jobs and Serve replicas meanwhile, on whichever node has a free CPU,
    and a node killed there took them with it.

    This process's Ray connection, left open on the suite's cluster by an earlier test, is
    closed first: a process has one, and a session uses the one already open whatever its
    address, so the test's jobs went to the suite's cluster, where no node has their
    resource, and never started."""
    pytest.importorskip("ray", reason="ray is not installed (pip install 'shoal[ray]')")
    import ray

    if ray.is_initialized():
        ray.shutdown()
    cluster = RayCluster(tmp_path / "own-cluster")
    cluster.home.mkdir(parents=True)
    port = _free_port()
    shoal_ray(cluster.home, "up", "--port", str(port), "--num-cpus", "1")
    cluster.address = f"127.0.0.1:{port}"
    try:
        yield cluster
    finally:
        import ray

        if ray.is_initialized():  # the next test's session connects afresh
            ray.shutdown()
        with contextlib.suppress(RuntimeError):
            cluster.stop()


def own_session(request, home: Path, cluster: RayCluster, **settings: object) -> shoal.Session:
    return ray_session(request, home, ray_address=cluster.address,
                       ray_auth_token_file=str(cluster.token), **settings)


@pytest.fixture
def spare_nodes(own_cluster):
    """Three 1-CPU nodes of the test's own cluster that advertise ``{"pairhost": 1}``: a job
    asking for it lands on them, and one of them may be killed."""
    return [own_cluster.add_node("pairhost") for _ in range(3)]


def _group_state(hex_id: str) -> str:
    import ray

    return ray.util.placement_group_table().get(hex_id, {}).get("state", "REMOVED")


def _tag_of(ray_cluster, node_id: str) -> str:
    """The 'shoal ray up' tag of the node Ray knows as *node_id* (by its temp dir)."""
    import ray

    [entry] = [n for n in ray.nodes() if n["NodeID"] == node_id]
    [tag] = [n["tag"] for n in ray_cluster.nodes()
             if entry["ObjectStoreSocketName"].startswith(n["temp_dir"])]
    return tag


HOLD_SCRIPT = """
import os, signal, sys, time
if len(sys.argv) > 2 and os.path.exists(sys.argv[2]):  # --marker PATH: a later attempt
    print(f"rank {os.environ['RANK']} retried", flush=True)
    sys.exit(0)
print(f"rank {os.environ['RANK']} pid {os.getpid()} on {os.environ['SHOAL_RAY_NODE_ID']}",
      flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(420)  # a cluster of its own, nodes killed and declared dead
def test_a_lost_second_node_retries_the_job_on_live_nodes(request, tmp_path, own_cluster,
                                                          spare_nodes):
    from shoal.pytorch import PyTorch

    ray_cluster = own_cluster
    s = own_session(request, tmp_path / "home", own_cluster, ray_resources={"pairhost": 1},
                    ray_keep_alive_seconds=0)
    script = tmp_path / "hold.py"
    script.write_text(HOLD_SCRIPT)
    marker = tmp_path / "lost-once"
    try:
        with shoal.use(s):
            est = PyTorch(entry_point=str(script), instance_count=2, max_retry_attempts=2,
                          distribution={"torch_distributed": {"enabled": True}},
                          hyperparameters={"marker": str(marker)})
            est.fit(wait=False)
            name = est.latest_training_job.name

            def second_host() -> str | None:
                record = s.jobs.get(name)
                assert not record.is_terminal, f"{name} ended: {record.failure_reason}"
                for line in s.jobs.read_log(name).decode().splitlines():
                    if "[algo-2 rank 1] rank 1 pid" in line:
                        return line.split()[-1]
                return None

            wait_until(second_host, 180, what="the second host's rank to start")
            lost = second_host()
            marker.touch()  # the next attempt's ranks finish at once
            killed_at = time.monotonic()
            ray_cluster.kill_node(_tag_of(ray_cluster, lost))
            record = s.jobs.wait(name, timeout=300)
            took = time.monotonic() - killed_at
            group = record.handle.get("placement_group") or s.jobs.get(name).handle.get(
                "placement_group")
            wait_until(lambda: _group_state(group) == "REMOVED", 60,
                       what="the job's placement group to be removed")
        log = s.jobs.read_log(name).decode()
        assert record.status == JobStatus.COMPLETED and record.attempt == 2, log
        assert f"node {lost} is declared dead" in log
        retried_on = [ln.rsplit(" ", 1)[-1] for ln in log.splitlines()
                      if "algo-2: starting on node" in ln]
        assert len(retried_on) == 2 and retried_on[-1] != lost  # live capacity, not the dead
        [ended] = [e.reason for e in record.events if "attempt 1 failed" in (e.reason or "")]
        assert f"algo-2 (node {lost})" in ended
        print(f"killed node -> retried attempt done elsewhere: {took:.1f} s")
    finally:
        s.close()


def _block_on_first_attempt(marks: str) -> str:
    import time

    path = Path(marks)
    if not path.exists():
        path.write_text(os.environ["SHOAL_RAY_NODE_ID"])
        print("first attempt blocking", flush=True)
        time.sleep(600)
    return os.environ["SHOAL_RAY_NODE_ID"]


@pytest.mark.timeout(420)  # a cluster of its own, nodes killed and declared dead
def test_a_single_host_job_on_a_lost_node_is_retried_elsewhere(request, tmp_path, own_cluster,
                                                                spare_nodes):
    ray_cluster = own_cluster
    s = own_session(request, tmp_path / "home", own_cluster, ray_resources={"pairhost": 1},
                    ray_keep_alive_seconds=0)
    marks = tmp_path / "first-node"
    try:
        with shoal.use(s), RemoteExecutor(max_retry_attempts=2,
                                          job_name_prefix="ray-lost-node") as executor:
            future = executor.submit(_block_on_first_attempt, str(marks))

            def blocking() -> bool:
                if future.done():
                    future.result()  # a job that could not start says why, at once
                return bool(future.job_name) and b"blocking" in s.jobs.read_log(
                    future.job_name)

            wait_until(blocking, 180, what="the first attempt to run")
            first = marks.read_text()
            ray_cluster.kill_node(_tag_of(ray_cluster, first))
            assert future.result(timeout=300) != first
        record = s.jobs.get(future.job_name)
        assert record.status == JobStatus.COMPLETED and record.attempt == 2
        [ended] = [e.reason for e in record.events if "attempt 1 of 2 ended" in (e.reason or "")]
        # The node, not only the supervisor's process, was lost: the record says which.
        assert f"was lost with its node: node {first}" in ended, ended
        assert "is declared dead" in ended and "still runs" not in ended
    finally:
        s.close()


@pytest.mark.timeout(420)  # a cluster of its own, a node killed and declared dead
def test_a_single_host_jobs_last_attempt_lost_with_its_node_fails_as_node_lost(
        request, tmp_path, own_cluster):
    from shoal.core import FailureKind
    from shoal.errors import JobFailedError

    tag = own_cluster.add_node("pairhost")  # the only node the job may run on
    s = own_session(request, tmp_path / "home", own_cluster, ray_resources={"pairhost": 1},
                    ray_keep_alive_seconds=0)
    marks = tmp_path / "first-node"
    try:
        with shoal.use(s), RemoteExecutor(job_name_prefix="ray-last-node") as executor:
            future = executor.submit(_block_on_first_attempt, str(marks))

            def blocking() -> bool:
                if future.done():
                    future.result()  # a job that could not start says why, at once
                return bool(future.job_name) and b"blocking" in s.jobs.read_log(
                    future.job_name)

            wait_until(blocking, 180, what="the job to run")
            node = marks.read_text()
            own_cluster.kill_node(tag)
            with pytest.raises(JobFailedError, match="lost with its node"):
                future.result(timeout=300)
        record = s.jobs.get(future.job_name)
        assert record.status == JobStatus.FAILED and record.attempt == 1
        assert record.failure_kind == FailureKind.NODE_LOST, record.failure_reason
        assert f"node {node}" in record.failure_reason and "declared dead" in \
            record.failure_reason
        assert all(r.is_terminal for r in s.metadata.list_jobs(
            JobQuery(name_prefix="ray-last-node")))
    finally:
        s.close()


# --- a warm actor of the same client holds the slot its next job needs -------------------

def _where() -> str:
    return os.environ["SHOAL_RAY_NODE_ID"]


def test_a_clients_own_idle_warm_actor_makes_room_for_its_next_job(request, tmp_path):
    from shoal.pytorch import PyTorch

    # node2 has one CPU: the warm actor of the first call holds it while it idles (600 s).
    s = ray_session(request, tmp_path / "home", ray_resources={"node2": 1},
                    ray_keep_alive_seconds=600)
    script = tmp_path / "train.py"
    script.write_text("import os\nprint('ran on', os.environ['SHOAL_RAY_NODE_ID'])\n")
    try:
        with shoal.use(s):
            warm_node = shoal.remote(_where, job_name_prefix="warm-first")()
            est = PyTorch(entry_point=str(script), instance_count=1, max_run=300)
            est.fit(wait=False)
            name = est.latest_training_job.name
            record = s.jobs.wait(name, timeout=150)  # not the 600 s the actor would idle
        assert record.status == JobStatus.COMPLETED
        assert f"ran on {warm_node}" in s.jobs.read_log(name).decode()
    finally:
        s.backend.retire_warm()
        s.close()


@pytest.mark.timeout(420)  # a cluster of its own, nodes killed and declared dead
def test_a_node_whose_raylet_dies_leaves_no_process_behind(own_cluster):
    from shoal.backends.ray_cluster import _processes_under

    ray_cluster = own_cluster
    tag = ray_cluster.add_node("doomed")
    [node] = [n for n in ray_cluster.nodes() if n["tag"] == tag]
    temp = Path(node["temp_dir"])

    def names() -> list[str]:
        out = []
        for pid in _processes_under(temp):
            with contextlib.suppress(OSError):
                out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                           .decode(errors="replace"))
        return out

    try:
        wait_until(lambda: any("log_monitor.py" in n for n in names()), 60,
                   what="the node's log monitor to start")
        [raylet] = [pid for pid in _processes_under(temp)
                    if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
                    .endswith(b"/raylet")]
        os.kill(raylet, signal.SIGKILL)  # the node crashes; nobody runs 'shoal ray down'
        try:
            wait_until(lambda: not names(), 60, what="every process of the dead node to end")
        except TimeoutError as e:
            raise AssertionError(f"left running: {[n[:160] for n in names()]}") from e
    finally:
        ray_cluster.kill_node(tag)
