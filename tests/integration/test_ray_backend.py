"""What only a cluster shows: placement on a node, a node lost mid-job, a timeout and a cancel
that reach a supervisor on another node, and stores that other nodes cannot reach."""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest

import shoal
from helpers import Followed, wait_until
from ray_cluster import ray_session
from shoal import RemoteExecutor, remote
from shoal.core import FailureKind, JobQuery, JobStatus
from shoal.errors import ConfigError, JobCancelledError, JobTimeoutError

pytestmark = [pytest.mark.ray]


def _where() -> str:
    import os

    return os.environ["SHOAL_RAY_NODE_ID"]


def _block(seconds: float) -> str:
    print("blocking", flush=True)
    time.sleep(seconds)
    return "woke up"


def _node_with(resource: str) -> str:
    import ray

    [node] = [n["NodeID"] for n in ray.nodes() if n["Alive"] and resource in n["Resources"]]
    return node


@pytest.fixture
def team(request, tmp_path):
    sessions = []

    def make(**settings):
        s = ray_session(request, tmp_path / f"home{len(sessions)}", **settings)
        sessions.append(s)
        return s

    yield make
    for s in sessions:
        s.close()


@pytest.mark.postgres
@pytest.mark.s3
def test_a_custom_resource_places_the_job_on_that_node(team):
    s = team(ray_resources={"node2": 1})
    with shoal.use(s):
        assert remote(_where)() == _node_with("node2")


@pytest.mark.postgres
@pytest.mark.s3
def test_a_forced_timeout_stops_a_blocked_call_within_seconds(team):
    s = team()
    with shoal.use(s):
        started = time.monotonic()
        with pytest.raises(JobTimeoutError):
            remote(_block, max_runtime_in_seconds=3)(600)
    assert time.monotonic() - started < 60


@pytest.mark.postgres
@pytest.mark.s3
def test_cancel_stops_a_blocked_call(team):
    s = team()
    with shoal.use(s), RemoteExecutor() as executor:
        future = executor.submit(_block, 600)
        wait_until(lambda: future.job_name and s.jobs.get(future.job_name).status
                   == JobStatus.RUNNING, 90, what="the job to run")
        wait_until(lambda: b"blocking" in s.jobs.read_log(future.job_name), 30)
        started = time.monotonic()
        # The stop may land before cancel() returns: the future then ends JobCancelledError.
        cancelled = future.cancel()
        record = s.jobs.wait(future.job_name, timeout=60)
        assert cancelled or isinstance(future.exception(timeout=30), JobCancelledError)
    assert record.status == JobStatus.STOPPED
    assert time.monotonic() - started < 30
    # The stop ended the call, not its warm supervisor actor: the actor serves the next call
    # at once, and ends (freeing its resources) when it is retired.
    with shoal.use(s):
        prefix = f"after-{uuid.uuid4().hex[:6]}"
        assert remote(_where, job_name_prefix=prefix)()
    [after] = s.metadata.list_jobs(JobQuery(name_prefix=prefix))
    assert after.handle["actor"] == record.handle["actor"]
    s.backend.retire_warm()
    wait_until(lambda: s.backend.is_alive(record.handle) is False, 30,
               what="the supervisor's actor to end")


@pytest.mark.postgres
@pytest.mark.s3
def test_a_node_lost_mid_job_fails_the_job(team, ray_cluster):
    tag = ray_cluster.add_node("node3")
    s = team(ray_resources={"node3": 1})
    prefix = f"lost-{uuid.uuid4().hex[:6]}"
    with shoal.use(s), RemoteExecutor(job_name_prefix=prefix) as executor:
        future = executor.submit(_block, 600)
        wait_until(lambda: future.job_name and b"blocking" in s.jobs.read_log(future.job_name),
                   90, what="the job to run on node3")
        ray_cluster.kill_node(tag)
        record = s.jobs.wait(future.job_name, timeout=300)
        assert record.status == JobStatus.FAILED
        # Ray's records say the supervisor went with its node (issue #23): node_lost
        assert record.failure_kind == FailureKind.NODE_LOST, record.failure_reason
        with pytest.raises(shoal.errors.JobFailedError, match="lost with its node"):
            future.result()
    [record] = s.metadata.list_jobs(JobQuery(name_prefix=prefix))
    assert record.is_terminal


def test_node_local_stores_are_refused_on_two_nodes(ray_cluster, tmp_path):
    s = shoal.Session(home=str(tmp_path / "home"), backend="ray",
                      ray_address=ray_cluster.address, ray_auth_token_file=str(ray_cluster.token))
    try:
        with shoal.use(s), pytest.raises(ConfigError) as info:
            remote(_where)()
        message = str(info.value)
        assert "SHOAL_ARTIFACT_URL=s3://" in message
        assert "SHOAL_METADATA_URL=postgresql://" in message
        assert s.metadata.list_jobs(JobQuery()) == []  # refused before anything was recorded
    finally:
        s.close()


@pytest.mark.postgres
@pytest.mark.s3
def test_a_job_no_node_can_hold_fails_at_once(team):
    s = team(ray_resources={"nowhere": 1})
    with shoal.use(s), pytest.raises(shoal.errors.JobFailedError,
                                     match="no node of the Ray cluster can hold"):
        remote(_where)()


def _say(x: int) -> int:
    print(f"call {x}", flush=True)
    return 3 * x


@pytest.mark.postgres
@pytest.mark.s3
def test_calls_share_warm_actors_and_each_stays_its_own_job(team):
    # A keep-alive long enough for a loaded machine (the test sessions' 5 s default ran out
    # between the map and the second client under make test); retired at the end.
    s = team(ray_keep_alive_seconds=60)
    other = team(ray_keep_alive_seconds=60)
    prefix = f"warm-{uuid.uuid4().hex[:6]}"
    try:
        with shoal.use(s):
            assert remote(_say, job_name_prefix=prefix)(1) == 3
            with RemoteExecutor(max_parallel_jobs=2, job_name_prefix=prefix) as executor:
                assert list(executor.map(_say, range(40))) == [3 * i for i in range(40)]
        # Another client (its own home) of the same stores is served by the same warm actors.
        with shoal.use(other):
            assert remote(_say, job_name_prefix=f"{prefix}-b")(2) == 6
    finally:
        s.backend.retire_warm()
        other.backend.retire_warm()
    records = s.metadata.list_jobs(JobQuery(name_prefix=f"{prefix}-", limit=100))
    records = [r for r in records if not r.name.startswith(f"{prefix}-b-")]
    assert len(records) == 41
    assert all(r.status == JobStatus.COMPLETED for r in records)
    actors = {r.handle["actor"] for r in records}
    assert all(a.startswith("shoal-warm-") for a in actors) and len(actors) <= 2
    assert all(r.handle["backend"] == "ray" and r.handle["pid"] for r in records)
    for record in records:  # its own log, and its payloads verified under its own key
        x = s.jobs.outcome(record) // 3
        assert s.jobs.read_log(record.name) == f"call {x}\n".encode()
    [record] = s.metadata.list_jobs(JobQuery(name_prefix=f"{prefix}-b"))
    assert record.handle["actor"] in actors


@pytest.mark.postgres
@pytest.mark.s3
def test_without_keep_alive_each_job_gets_an_actor_of_its_own(team):
    s = team(ray_keep_alive_seconds=0)
    prefix = f"cold-{uuid.uuid4().hex[:6]}"
    with shoal.use(s):
        assert remote(_say, job_name_prefix=prefix)(2) == 6
    [record] = s.metadata.list_jobs(JobQuery(name_prefix=prefix))
    assert record.handle["actor"] == f"shoal-{record.name}"
    wait_until(lambda: s.backend.is_alive(record.handle) is False, 30,
               what="the job's own actor to end")


@pytest.mark.postgres
@pytest.mark.s3
def test_a_warm_actor_busy_with_another_client_is_passed_over(team):
    s = team()
    with shoal.use(s), RemoteExecutor() as executor:
        future = executor.submit(_block, 600)
        wait_until(lambda: future.job_name and s.jobs.get(future.job_name).status
                   == JobStatus.RUNNING, 90, what="the blocking job to run")
        busy_actor = s.jobs.get(future.job_name).handle["actor"]
        other = team()  # finds the busy actor by name, is told so, and starts another
        prefix = f"other-{uuid.uuid4().hex[:6]}"
        with shoal.use(other):
            assert remote(_say, job_name_prefix=prefix)(2) == 6
        [record] = s.metadata.list_jobs(JobQuery(name_prefix=prefix))
        assert record.handle["actor"].startswith("shoal-warm-")
        assert record.handle["actor"] != busy_actor
        future.cancel()
        assert s.jobs.wait(future.job_name, timeout=60).status == JobStatus.STOPPED


HOLD_SCRIPT = """
import os, signal, sys, time
if len(sys.argv) > 2 and os.path.exists(sys.argv[2]):  # --marker PATH: a later attempt
    print(f"rank {os.environ['RANK']} retried", flush=True)
    sys.exit(0)
def on_term(signum, frame):
    print(f"rank {os.environ['RANK']} stopping gracefully", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print(f"rank {os.environ['RANK']} pid {os.getpid()} on {os.environ['SHOAL_RAY_NODE_ID']}",
      flush=True)
time.sleep(600)
"""



@pytest.fixture
def ray_client(request, tmp_path, ray_cluster):
    """Sessions that reach the cluster through Ray Client (its ``ray://`` address, with its
    token), not as a driver on a node. This process's Ray connection is one: an earlier
    test's driver connection is closed first, and this one after."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    sessions = []

    def make(**settings):
        s = ray_session(request, tmp_path / f"home{len(sessions)}",
                        ray_address=ray_cluster.client_address, **settings)
        sessions.append(s)
        return s

    yield make
    try:
        for s in sessions:
            s.backend.retire_warm()
            s.close()
    finally:
        ray.shutdown()


@pytest.mark.postgres
@pytest.mark.s3
def test_a_ray_client_address_runs_calls_maps_and_cancels(ray_client, ray_cluster):
    import ray

    assert ray_cluster.client_address.startswith("ray://127.0.0.1:")
    s = ray_client(ray_keep_alive_seconds=60)
    prefix = f"client-{uuid.uuid4().hex[:6]}"
    with shoal.use(s):
        nodes = [remote(_where, job_name_prefix=f"{prefix}-call")() for _ in range(5)]
        assert ray.util.client.ray.is_connected()  # through Ray Client, not as a driver
        with RemoteExecutor(max_parallel_jobs=2, job_name_prefix=f"{prefix}-map") as executor:
            assert list(executor.map(_say, range(20))) == [3 * i for i in range(20)]
            future = executor.submit(_block, 600)
            wait_until(lambda: future.job_name and s.jobs.get(future.job_name).status
                       == JobStatus.RUNNING, 90, what="the blocking job to run")
            wait_until(lambda: b"blocking" in s.jobs.read_log(future.job_name), 30,
                       what="the blocking job's log")
            future.cancel()
            stopped = s.jobs.wait(future.job_name, timeout=60)
    assert stopped.status == JobStatus.STOPPED
    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    calls = sorted(s.metadata.list_jobs(JobQuery(name_prefix=f"{prefix}-call", limit=10)),
                   key=lambda r: r.created_at)
    assert [r.status for r in calls] == [JobStatus.COMPLETED] * 5
    assert [r.handle["node_id"] for r in calls] == nodes and set(nodes) <= alive
    # One client alone: every call went to its one warm actor.
    assert len({r.handle["actor"] for r in calls}) == 1
    mapped = s.metadata.list_jobs(JobQuery(name_prefix=f"{prefix}-map", limit=30))
    mapped = [r for r in mapped if r.name != future.job_name]
    assert len(mapped) == 20 and all(r.status == JobStatus.COMPLETED for r in mapped)
    for record in mapped:  # its own log, and its result verified under its own key
        x = s.jobs.outcome(record) // 3
        assert s.jobs.read_log(record.name) == f"call {x}\n".encode()


@pytest.mark.postgres
@pytest.mark.s3
def test_a_ray_client_address_runs_a_job_on_an_actor_of_its_own(ray_client, ray_cluster):
    s = ray_client(ray_keep_alive_seconds=0, ray_resources={"node2": 1})
    prefix = f"client-cold-{uuid.uuid4().hex[:6]}"
    with shoal.use(s):
        assert remote(_where, job_name_prefix=prefix)() == _node_with("node2")
    [record] = s.metadata.list_jobs(JobQuery(name_prefix=prefix))
    assert record.status == JobStatus.COMPLETED
    assert record.handle["actor"] == f"shoal-{record.name}"
    wait_until(lambda: s.backend.is_alive(record.handle) is False, 30,
               what="the job's own actor to end")


def _rank_pids(log: str) -> dict[int, int]:
    """rank -> pid, from HOLD_SCRIPT's lines."""
    pids = {}
    for line in log.splitlines():
        if "] rank " in line and " pid " in line:
            words = line.partition("] ")[2].split()
            pids[int(words[1])] = int(words[3])
    return pids


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1].startswith("Z")  # a zombie has ended too
    except FileNotFoundError:
        return True


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().split(") ")[1].split()[1])


def _start_two_hosts(s, tmp_path, **options):
    from shoal.pytorch import PyTorch

    script = tmp_path / "hold.py"
    script.write_text(HOLD_SCRIPT)
    est = PyTorch(entry_point=str(script), instance_count=2,
                  distribution={"torch_distributed": {"enabled": True}}, **options)
    est.fit(wait=False)
    name = est.latest_training_job.name
    wait_until(lambda: len(_rank_pids(s.jobs.read_log(name).decode())) == 2, 120,
               what="both hosts' ranks to start")
    return est, name


def _group_state(hex_id: str) -> str:
    import ray

    return ray.util.placement_group_table().get(hex_id, {}).get("state", "REMOVED")


def _wait_left_nothing(pids: dict[int, int], group: str) -> None:
    """The job's ranks on both hosts end, and its placement group is removed."""
    wait_until(lambda: all(_gone(p) for p in pids.values()), 30,
               what="the job's ranks on both hosts to end")
    wait_until(lambda: _group_state(group) == "REMOVED", 30,
               what="the job's placement group to be removed")


@pytest.mark.postgres
@pytest.mark.s3
def test_stopping_a_two_host_job_stops_the_ranks_on_both_nodes(team, tmp_path):
    s = team()
    with shoal.use(s):
        est, name = _start_two_hosts(s, tmp_path)
        record = s.jobs.get(name)
        group = record.handle["placement_group"]
        assert _group_state(group) == "CREATED"
        pids = _rank_pids(s.jobs.read_log(name).decode())
        started = time.monotonic()
        est.latest_training_job.stop()
        record = s.jobs.wait(name, timeout=60)
    assert record.status == JobStatus.STOPPED
    assert time.monotonic() - started < 45
    log = s.jobs.read_log(name).decode()
    # SIGTERM reached the ranks on both nodes (not a kill), and their last words reached the log.
    assert "[algo-1 rank 0] rank 0 stopping gracefully" in log
    assert "[algo-2 rank 1] rank 1 stopping gracefully" in log
    _wait_left_nothing(pids, group)


@pytest.mark.postgres
@pytest.mark.s3
def test_losing_the_second_hosts_actor_retries_the_job_and_leaves_nothing(team, tmp_path):
    s = team()
    marker = tmp_path / "lost-once"
    with shoal.use(s):
        _, name = _start_two_hosts(s, tmp_path, max_retry_attempts=2,
                                   hyperparameters={"marker": str(marker)})
        first = s.jobs.get(name).handle["placement_group"]
        pids = _rank_pids(s.jobs.read_log(name).decode())
        marker.touch()  # the next attempt's ranks finish at once
        # rank 1 -> its host's rank launcher -> the host's Ray actor (worker process): kill
        # the actor's process, as a node going away would.
        os.kill(_parent(_parent(pids[1])), signal.SIGKILL)
        record = s.jobs.wait(name, timeout=120)
    log = s.jobs.read_log(name).decode()
    assert "algo-2: its node or actor was lost" in log
    assert "attempt 2 of 2" in log
    assert "[algo-2 rank 1] rank 1 retried" in log and "[algo-1 rank 0] rank 0 retried" in log
    assert record.status == JobStatus.COMPLETED and record.attempt == 2
    _wait_left_nothing(pids, first)


@pytest.mark.postgres
@pytest.mark.s3
def test_a_lost_supervisor_of_a_two_host_job_frees_its_placement_group(team, tmp_path):
    import ray

    s = team()
    with shoal.use(s):
        _, name = _start_two_hosts(s, tmp_path)
        handle = s.jobs.get(name).handle
        pids = _rank_pids(s.jobs.read_log(name).decode())
        # The supervisor's actor dies (its node gone, say): nobody is left to remove the group.
        ray.kill(ray.get_actor(handle["actor"], namespace=handle["namespace"]),
                 no_restart=True)
        record = s.jobs.wait(name, timeout=90)
    assert record.status == JobStatus.FAILED
    assert record.failure_kind == FailureKind.SUPERVISOR_LOST
    _wait_left_nothing(pids, handle["placement_group"])


@pytest.mark.postgres
@pytest.mark.s3
def test_a_job_needing_more_hosts_than_the_cluster_holds_fails_at_once(team, tmp_path):
    from shoal.pytorch import PyTorch

    script = tmp_path / "train.py"
    script.write_text("print('never runs')\n")
    s = team()
    with shoal.use(s):
        est = PyTorch(entry_point=str(script), instance_count=50,
                      distribution={"torch_distributed": {"enabled": True}})
        started = time.monotonic()
        with pytest.raises(shoal.errors.JobFailedError, match="asks for 50 hosts"):
            est.fit(logs=False)
    assert time.monotonic() - started < 30


def _wait_for_release(path: str) -> str:
    import pathlib

    print("waiting for release", flush=True)
    while not pathlib.Path(path).exists():
        time.sleep(0.05)
    print("released", flush=True)
    return "done"


@pytest.mark.postgres
@pytest.mark.s3
def test_logs_follow_a_job_running_on_another_node(team, ray_cluster, tmp_path):
    """`shoal jobs logs -f` in another process, with only the team's settings, streams a job
    that runs on the second node, and ends when the job does."""
    import sys

    s = team(ray_resources={"node2": 1})
    release = tmp_path / "release"
    with shoal.use(s), RemoteExecutor() as executor:
        future = executor.submit(_wait_for_release, str(release))
        wait_until(lambda: future.job_name is not None, 60, what="the job's name")
        name = future.job_name
        env = {**os.environ, "SHOAL_HOME": str(tmp_path / "cli-home"), "SHOAL_BACKEND": "ray",
               "SHOAL_RAY_ADDRESS": ray_cluster.address,
               "SHOAL_RAY_AUTH_TOKEN_FILE": str(ray_cluster.token),
               "SHOAL_METADATA_URL": s.settings.resolved_metadata_url(),
               "SHOAL_ARTIFACT_URL": s.settings.resolved_artifact_url()}
        with Followed([sys.executable, "-m", "shoal.cli", "jobs", "logs", name, "-f"],
                      env=env) as followed:
            wait_until(lambda: "waiting for release\n" in followed.lines, 90,
                       what="the followed log")
            assert followed.proc.poll() is None  # still following: the job has not ended
            assert s.jobs.get(name).handle  # it runs under an actor on node2
            release.touch()
            assert followed.wait(timeout=60) == 0
            assert "released\n" in followed.lines
            assert f"job {name} completed" in followed.stderr()
        assert future.result(timeout=30) == "done"


@pytest.mark.postgres
@pytest.mark.s3
def test_a_two_host_job_through_a_ray_client_address(ray_client, tmp_path):
    """The placement group is made through Ray Client; the hosts' launchers inside the
    cluster connect to its GCS themselves."""
    from shoal.pytorch import PyTorch

    s = ray_client()
    script = tmp_path / "hosts.py"
    script.write_text("import os\nprint('host', os.environ['SM_CURRENT_HOST'], 'on', "
                      "os.environ['SHOAL_RAY_NODE_ID'], flush=True)\n")
    with shoal.use(s):
        est = PyTorch(entry_point=str(script), instance_count=2,
                      distribution={"torch_distributed": {"enabled": True}})
        est.fit(logs=False)
        record = s.jobs.get(est.latest_training_job.name)
    assert record.status == JobStatus.COMPLETED
    log = s.jobs.read_log(record.name).decode()
    nodes = {line.rsplit(" on ", 1)[1] for line in log.splitlines() if "] host algo-" in line}
    assert len(nodes) == 2, log


@pytest.mark.postgres
@pytest.mark.s3
def test_an_endpoint_through_a_ray_client_address(ray_client, tmp_path):
    """deploy() through Ray Client starts the endpoint's Serve application; the Predictor
    reaches it on Serve's proxy."""
    import numpy as np
    import torch

    from shoal import Model
    from shoal.export.onnx import export

    s = ray_client()
    net = torch.nn.Linear(4, 2)
    export(net, torch.randn(1, 4), tmp_path / "model" / "model.onnx")
    name = f"client-{uuid.uuid4().hex[:8]}"
    with shoal.use(s):
        predictor = Model(model_data=str(tmp_path / "model")).deploy(endpoint_name=name)
        try:
            x = np.ones((3, 4), np.float32)
            with torch.no_grad():
                expected = net(torch.from_numpy(x)).numpy()
            assert np.allclose(predictor.predict(x.tolist()), expected, atol=1e-5)
        finally:
            predictor.delete_endpoint()
        assert s.metadata.find_endpoint(name) is None
