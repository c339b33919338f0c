"""Issue #22 item 2: ``CheckpointLocation`` as SageMaker's remote-function examples use it: the
function receives a local directory that starts with the stored checkpoints; its supervisor
syncs it to the URI while the function runs and when it has ended (completed, stopped, timed
out, killed), so a later job or a retried attempt resumes from it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import shoal
from helpers import wait_until
from shoal import JobTimeoutError
from shoal.core import JobQuery, JobStatus
from shoal.remote_function import CheckpointLocation, RemoteExecutor, RemoteOptions, remote


def test_a_remote_function_resumes_from_its_checkpoints(session, tmp_path):
    checkpoints = (tmp_path / "bucket" / "checkpoints").as_uri()

    @remote(instance_type="ml.m5.large")
    def train(epochs: int, checkpoint_path: CheckpointLocation) -> tuple[int, str]:
        state = os.path.join(checkpoint_path, "epoch.txt")
        start = int(open(state).read()) if os.path.exists(state) else 0
        for _ in range(epochs):
            start += 1
        with open(state, "w") as f:
            f.write(str(start))
        return start, os.fspath(checkpoint_path)

    first, local = train(2, CheckpointLocation(checkpoints))
    assert first == 2 and local != str(tmp_path / "bucket" / "checkpoints")  # a job-local dir
    assert (tmp_path / "bucket" / "checkpoints" / "epoch.txt").read_text() == "2"
    second, _ = train(3, CheckpointLocation(checkpoints))
    assert second == 5  # started from the uploaded checkpoint
    spec, _ = RemoteOptions().build_job(train.__wrapped__, session,
                                        call_args=(1, CheckpointLocation(checkpoints)))
    assert spec.checkpoint_s3_uri == checkpoints  # on the record, like CheckpointConfig


# --- synced while the job runs, as an estimator's checkpoints are --------------------------

@pytest.fixture
def fast_sync(tmp_path):
    """A session whose supervisors sync checkpoints every 0.2 s (default 5 s)."""
    from conftest import make_session

    s = make_session(tmp_path / "home", checkpoint_sync_seconds=0.2)
    with shoal.use(s):
        yield s
    if s._backend is not None:
        s.backend.shutdown_launcher()
    s.close()


def _stored(uri_dir: Path, name: str) -> str | None:
    path = uri_dir / name
    return path.read_text() if path.is_file() else None


def test_checkpoints_reach_the_uri_while_the_job_runs_and_stay_after_a_stop(fast_sync, tmp_path):
    bucket = tmp_path / "bucket" / "stopped-run"
    release = tmp_path / "never"

    def train(checkpoint_path: CheckpointLocation) -> None:
        import time

        for step in (1, 2, 3):
            with open(os.path.join(checkpoint_path, "step.txt"), "w") as f:
                f.write(str(step))
        while not release.exists():  # a long epoch, cut short by the stop below
            time.sleep(0.05)

    with RemoteExecutor(instance_type="ml.m5.xlarge") as executor:
        future = executor.submit(train, CheckpointLocation(bucket.as_uri()))
        wait_until(lambda: _stored(bucket, "step.txt") == "3", timeout=60,
                   what="step.txt synced to the checkpoint URI while the job runs")
        record = fast_sync.jobs.get(future.job_name)
        assert record.status == JobStatus.RUNNING  # synced mid-run, not at the end
        assert future.cancel() is True
        wait_until(lambda: fast_sync.jobs.get(future.job_name).is_terminal, timeout=60)
    assert fast_sync.jobs.get(future.job_name).status == JobStatus.STOPPED
    assert _stored(bucket, "step.txt") == "3"


def test_a_job_that_times_out_keeps_its_checkpoints(fast_sync, tmp_path):
    bucket = tmp_path / "bucket" / "timed-out"
    release = tmp_path / "never"

    @remote(max_runtime_in_seconds=6)
    def train(checkpoint_path: CheckpointLocation) -> None:
        import time

        with open(os.path.join(checkpoint_path, "model.ckpt"), "w") as f:
            f.write("weights after epoch 1")
        while not release.exists():
            time.sleep(0.05)

    with pytest.raises(JobTimeoutError):
        train(CheckpointLocation(bucket.as_uri()))
    assert _stored(bucket, "model.ckpt") == "weights after epoch 1"


def test_a_retried_attempt_resumes_from_the_checkpoints_of_the_killed_one(fast_sync, tmp_path):
    bucket = tmp_path / "bucket" / "spot"

    @remote(max_retry_attempts=2)
    def train(epochs: int, checkpoint_path: CheckpointLocation) -> int:
        import signal

        state = os.path.join(checkpoint_path, "epoch.txt")
        start = int(open(state).read()) if os.path.exists(state) else 0
        for epoch in range(start + 1, epochs + 1):
            with open(state, "w") as f:
                f.write(str(epoch))
            if epoch == 2 and start == 0:  # the instance goes away mid-training
                os.kill(os.getpid(), signal.SIGKILL)
        return start

    assert train(4, CheckpointLocation(bucket.as_uri())) == 2  # attempt 2 resumed at epoch 2
    assert _stored(bucket, "epoch.txt") == "4"
    [record] = fast_sync.metadata.list_jobs(JobQuery())
    assert record.attempt == 2 and record.status == JobStatus.COMPLETED
