"""One contract suite for the job backends: the same calls on the local backend and on a
real two-node Ray cluster (PostgreSQL metadata, S3 artifacts, as a team runs it).

Nothing in a test says which backend it runs on; only the ``backend_session`` fixture does.
"""

from __future__ import annotations

import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import shoal
from helpers import DDP_SCRIPT, rank_lines
from ray_cluster import ray_session
from shoal import Estimator, RemoteExecutor, remote
from shoal.core import JobQuery, JobStatus
from shoal.errors import JobFailedError
from shoal.experiments import Run
from shoal.pytorch import PyTorch

RAY = pytest.param("ray", marks=[pytest.mark.ray, pytest.mark.postgres, pytest.mark.s3])


@pytest.fixture(params=["local", RAY])
def backend_session(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[shoal.Session]:
    if request.param == "ray":
        s = ray_session(request, tmp_path / "home")
    else:
        s = shoal.Session(home=str(tmp_path / "home"), launcher_idle_seconds=60)
    with shoal.use(s):
        yield s
    if request.param == "local" and s._backend is not None:
        s.backend.shutdown_launcher()
    s.close()


def _double(x: int) -> int:
    print(f"doubling {x}")
    return 2 * x


def _fail() -> None:
    raise KeyError("missing in the job")


def _in_run(steps: int) -> tuple[str, str]:
    from shoal.experiments import load_run

    with load_run() as run:
        for step in range(steps):
            run.log_metric("loss", 1.0 / (step + 1), step=step)
        run.log_parameter("steps", steps)
        return run.experiment_name, run.run_name


def test_trivial_call_and_its_log(backend_session):
    prefix = f"double-{uuid.uuid4().hex[:6]}"
    assert remote(_double, job_name_prefix=prefix)(21) == 42
    [record] = backend_session.metadata.list_jobs(JobQuery(name_prefix=prefix))
    assert record.status == JobStatus.COMPLETED
    assert record.handle["backend"] == backend_session.backend.name
    assert b"doubling 21" in backend_session.jobs.read_log(record.name)


def test_the_users_exception_is_reraised(backend_session):
    with pytest.raises(KeyError, match="missing in the job") as info:
        remote(_fail)()
    assert isinstance(info.value.__cause__, shoal.errors.JobFailedError)


def test_executor_map(backend_session):
    with RemoteExecutor(max_parallel_jobs=3) as executor:
        assert list(executor.map(_double, [1, 2, 3, 4])) == [2, 4, 6, 8]


def test_estimator_fit(backend_session, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import os\nopen(os.path.join(os.environ['SM_MODEL_DIR'], 'm.txt'), 'w')"
                      ".write('trained')\nprint('loss=0.25')\n")
    est = Estimator(entry_point=str(script), hyperparameters={"epochs": 1},
                    metric_definitions=[{"Name": "loss", "Regex": r"loss=([0-9.]+)"}])
    est.fit(logs=False)
    record = backend_session.jobs.get(est.latest_training_job.name)
    assert record.status == JobStatus.COMPLETED
    assert est.model_data.endswith("/output/model.tar.gz")
    assert backend_session.metadata.get_metrics(f"job:{record.name}", "loss")[0].value == 0.25


def test_load_run_in_a_job_is_the_callers_run(backend_session):
    experiment = f"contract-{uuid.uuid4().hex[:8]}"  # PostgreSQL is shared by a worker's tests
    with Run(experiment_name=experiment, run_name="r1"):
        assert remote(_in_run)(5) == (experiment, "r1")
    record = backend_session.metadata.get_run(experiment, "r1")
    assert record.parameters == {"steps": 5}
    owner = record.metrics_owner
    assert [p.step for p in backend_session.metadata.get_metrics(owner, "loss")] == list(range(5))


def test_torch_distributed_training_on_two_hosts(backend_session, tmp_path):
    """instance_count=2: on Ray, two nodes (a placement group), rank 0's node the master."""
    pytest.importorskip("torch")
    src = tmp_path / "src"
    src.mkdir()
    (src / "ddp.py").write_text(DDP_SCRIPT)
    est = PyTorch(entry_point="ddp.py", source_dir=str(src), instance_count=2,
                  distribution={"torch_distributed": {"enabled": True}})
    est.fit(logs=False)
    record = backend_session.jobs.get(est.latest_training_job.name)
    assert record.status == JobStatus.COMPLETED
    ranks = rank_lines(backend_session.jobs.read_log(record.name).decode())
    assert set(ranks) == {"[algo-1 rank 0]", "[algo-2 rank 1]"}
    assert all(r["world"] == 2 and r["sum"] == 3.0 for r in ranks.values())  # 1 + 2
    # the two hosts' lines reach the log in either order: compare by rank, not by position
    assert {tag: r["host"] for tag, r in ranks.items()} == {"[algo-1 rank 0]": "algo-1",
                                                             "[algo-2 rank 1]": "algo-2"}
    assert len({r["master"] for r in ranks.values()}) == 1
    nodes = {r["node"] for r in ranks.values()}
    assert len(nodes) == (2 if backend_session.backend.name == "ray" else 1)
    assert est.model_data.endswith("/output/model.tar.gz")


def test_a_failing_rank_fails_the_job_and_stops_the_others(backend_session, tmp_path):
    script = tmp_path / "one_fails.py"
    script.write_text(textwrap.dedent("""
        import os, sys, time
        rank = int(os.environ["RANK"])
        if rank == 1:
            print("rank 1 giving up", flush=True)
            sys.exit(7)
        print("rank 0 waiting", flush=True)
        time.sleep(120)
        print("rank 0 finished", flush=True)
    """))
    est = PyTorch(entry_point=str(script), instance_count=2,
                  distribution={"torch_distributed": {"enabled": True}})
    with pytest.raises(JobFailedError):
        est.fit(logs=False)
    record = backend_session.jobs.get(est.latest_training_job.name)
    assert record.status == JobStatus.FAILED and record.exit_code == 7
    log = backend_session.jobs.read_log(record.name).decode()
    assert "[algo-2 rank 1] rank 1 giving up" in log
    assert "exited with code 7; stopping the other ranks" in log
    assert "rank 0 finished" not in log  # rank 0 was stopped, not waited for
    assert "exited with code 7" in record.failure_reason


def _all_reduce(x: float) -> tuple[int, int, float]:
    import os

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.tensor([x * (dist.get_rank() + 1)])
    dist.all_reduce(t)
    out = (dist.get_rank(), dist.get_world_size(), t.item(), os.environ["LOCAL_RANK"])
    dist.destroy_process_group()
    return out


def test_remote_function_with_torchrun_returns_rank_zero_result(backend_session):
    pytest.importorskip("torch")
    f = remote(instance_count=2, use_torchrun=True)(_all_reduce)
    rank, world, total, local = f(1.5)
    assert (rank, world, total, local) == (0, 2, 4.5, "0")  # 1.5 * 1 + 1.5 * 2
    f2 = remote(use_torchrun=True, nproc_per_node=2)(_all_reduce)
    assert f2(1.0)[1:3] == (2, 3.0)
