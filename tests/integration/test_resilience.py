"""Infrastructure loss on the local backend (issue #23): a supervisor that is killed costs an
attempt, never the job, while max_retry_attempts leaves one."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import shoal
from helpers import wait_until
from shoal.core import FailureKind, JobQuery, JobStatus
from shoal.errors import JobFailedError


def _attempt_then_block(marks: str) -> str:
    """The first attempt blocks (until its supervisor is killed); the next returns."""
    import time

    path = Path(marks)
    with open(path, "a") as f:
        f.write("x")
    if len(path.read_text()) == 1:
        print("first attempt blocking", flush=True)
        while True:
            time.sleep(0.05)
    return f"attempt {len(path.read_text())} done"


def _supervisor_pid(session: shoal.Session, name: str) -> int:
    wait_until(lambda: session.jobs.get(name).handle.get("pid"), 30,
               what=f"the supervisor of {name} to record its pid")
    return int(session.jobs.get(name).handle["pid"])


def test_a_killed_supervisor_is_retried_and_the_record_says_why(session, tmp_path):
    marks = tmp_path / "attempts"
    with shoal.RemoteExecutor(max_retry_attempts=2, job_name_prefix="lost-sup") as executor:
        future = executor.submit(_attempt_then_block, str(marks))
        wait_until(lambda: future.job_name and b"blocking" in session.jobs.read_log(future.job_name), 60,
                   what="the first attempt to run")
        os.kill(_supervisor_pid(session, future.job_name), signal.SIGKILL)
        assert future.result(timeout=120) == "attempt 2 done"
    record = session.jobs.get(future.job_name)
    assert record.status == JobStatus.COMPLETED and record.attempt == 2
    [ended] = [e.reason for e in record.events if "attempt 1 of 2 ended" in (e.reason or "")]
    assert "its supervisor (pid" in ended and "exited without reporting" in ended
    log = session.jobs.read_log(future.job_name).decode()
    assert "first attempt blocking" in log and "attempt 2 of 2" in log  # one log, both runs


def _block() -> None:
    import time

    print("blocking", flush=True)
    while True:
        time.sleep(0.05)


def test_the_last_attempt_lost_fails_the_job_naming_the_supervisor(session):
    with shoal.RemoteExecutor(max_retry_attempts=2, job_name_prefix="lost-twice") as executor:
        future = executor.submit(_block)
        wait_until(lambda: future.job_name, 30, what="the job to be recorded")
        name = future.job_name
        for attempt in (1, 2):
            wait_until(lambda a=attempt: session.jobs.get(name).attempt == a
                       and session.jobs.get(name).status == JobStatus.RUNNING, 60,
                       what=f"attempt {attempt} to run")
            os.kill(_supervisor_pid(session, name), signal.SIGKILL)
            # what 'shoal jobs list' does, and the waiting client every half second
            wait_until(lambda a=attempt: session.jobs.reap() is not None and (
                       session.jobs.get(name).attempt > a or session.jobs.get(name).is_terminal),
                       60,
                       what=f"attempt {attempt} to end")
        with pytest.raises(JobFailedError, match="exited without reporting"):
            future.result(timeout=60)
    [record] = session.metadata.list_jobs(JobQuery(name_prefix="lost-twice"))
    assert record.status == JobStatus.FAILED and record.attempt == 2
    assert record.failure_kind == FailureKind.SUPERVISOR_LOST


# --- the metadata store goes away for a while -------------------------------------------

def _wait_for_file(go: str) -> int:
    import time

    print("waiting for the go", flush=True)
    while not os.path.exists(go):
        time.sleep(0.05)
    print("done", flush=True)
    return 42


TRAIN_UNTIL_GO = """
import os, sys, time
go = sys.argv[sys.argv.index("--go") + 1]
print("loss=0.5", flush=True)
print("waiting for the go", flush=True)
while not os.path.exists(go):
    time.sleep(0.05)
print("loss=0.25", flush=True)  # written while the store is away: kept, then written once
with open(os.path.join(os.environ["SM_MODEL_DIR"], "weights.bin"), "wb") as f:
    f.write(b"w" * 8)
print("done", flush=True)
"""


@pytest.mark.postgres
@pytest.mark.timeout(420)  # an outage of its own (20-90 s) on a busy machine
@pytest.mark.parametrize("backend", ["local", pytest.param(
    "ray", marks=[pytest.mark.ray, pytest.mark.s3])])
def test_a_20_s_database_outage_costs_running_jobs_nothing(own_postgres, tmp_path, request,
                                                           backend):
    """PostgreSQL stopped for 20 s under a running @remote job and a running Estimator (on
    the local backend, and on the suite's Ray cluster with an S3 store): their code runs on
    and ends during the outage; once the store is back every job completes at its first
    attempt, the training job's metrics are there once each, and no record is left
    unfinished (issue #23, item 4)."""
    from shoal.core.experiments import job_owner
    from shoal.estimator import Estimator
    from shoal.storage.sql import upgrade_schema

    upgrade_schema(own_postgres.url)
    if backend == "ray":
        from ray_cluster import ray_session

        s = ray_session(request, tmp_path / "home", metadata_url=own_postgres.url,
                        store_outage_seconds=90)
    else:
        s = shoal.Session(home=str(tmp_path / "home"), metadata_url=own_postgres.url,
                          launcher_idle_seconds=60, store_outage_seconds=90)
    go = tmp_path / "go"
    script = tmp_path / "train.py"
    script.write_text(TRAIN_UNTIL_GO)
    try:
        with shoal.use(s), shoal.RemoteExecutor(job_name_prefix="pg-outage") as executor:
            try:
                est = Estimator(entry_point=str(script), base_job_name="pg-outage-fit",
                                hyperparameters={"go": str(go)},
                                metric_definitions=[{"Name": "loss",
                                                     "Regex": r"loss=([0-9.]+)"}])
                est.fit(wait=False)
                training = est.latest_training_job.name
                future = executor.submit(_wait_for_file, str(go))
                wait_until(lambda: future.job_name, 60, what="the function's job")
                names = [training, future.job_name]
                wait_until(lambda: all(b"waiting" in s.jobs.read_log(n) for n in names), 120,
                           what="the function and the training script to run")
                own_postgres.stop()
                go.touch()  # the jobs end while the store is down: their ends wait for it
                wait_until(lambda: all(b"done" in s.jobs.read_log(n) for n in names), 60,
                           what="the jobs' code to finish")
                time.sleep(20)  # the outage itself: 20 s, as in issue #23
                own_postgres.start()
                assert future.result(timeout=120) == 42
                fitted = s.jobs.wait(training, timeout=120)
            finally:
                go.touch()  # else leaving the executor waits for a job that never ends
        assert fitted.status == JobStatus.COMPLETED and fitted.attempt == 1, \
            fitted.failure_reason
        assert [p.value for p in s.metadata.get_metrics(job_owner(training), "loss")] == [
            0.5, 0.25]
        assert s.artifacts.exists(f"{training}/output/model.tar.gz")
        records = s.metadata.list_jobs(JobQuery(name_prefix="pg-outage"))
        assert sorted(r.name for r in records) == sorted(names)
        assert all(r.status == JobStatus.COMPLETED and r.attempt == 1 for r in records)
        assert not list(s.metadata.iter_unfinished())
    finally:
        go.touch()
        s.close()


@pytest.mark.postgres
@pytest.mark.timeout(300)  # an outage of its own (20-90 s) on a busy machine
def test_an_outage_past_the_limit_fails_the_wait_naming_the_store(own_postgres, tmp_path):
    from shoal.errors import MetadataStoreError
    from shoal.storage.sql import upgrade_schema

    upgrade_schema(own_postgres.url)
    s = shoal.Session(home=str(tmp_path / "home"), metadata_url=own_postgres.url,
                      launcher_idle_seconds=60, store_outage_seconds=3)
    go = tmp_path / "go"
    try:
        with shoal.use(s), shoal.RemoteExecutor(job_name_prefix="pg-gone") as executor:
            future = executor.submit(_wait_for_file, str(go))
            wait_until(lambda: future.job_name and b"waiting" in s.jobs.read_log(
                future.job_name), 60, what="the job to run")
            own_postgres.stop()
            with pytest.raises(MetadataStoreError, match=r"has not answered for 3 s") as e:
                future.result(timeout=120)
            assert f"127.0.0.1:{own_postgres.port}" in str(e.value)
            own_postgres.start()
            go.touch()
            # Once the store is back the supervisor's end is written: nothing is left open.
            wait_until(lambda: s.jobs.get(future.job_name).is_terminal, 120,
                       what="the job's record to end")
    finally:
        go.touch()
        s.close()


# --- the artifact store goes away for a while -------------------------------------------

class _Moto:
    """A moto S3 server of this test's own, which it may stop and start again (moto keeps
    its buckets in memory: a restarted one gets the test's bucket again, empty)."""

    def __init__(self, root: Path) -> None:
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = int(probe.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = root / "moto.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, bucket: str) -> None:
        import sys
        import urllib.request

        import boto3

        with open(self._log, "ab") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

        def up() -> bool:
            with urllib.request.urlopen(f"{self.url}/moto-api/", timeout=1) as r:
                return r.status < 500

        wait_until(up, 30, what=f"moto at {self.url}")
        client = boto3.client("s3", endpoint_url=self.url, region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        client.create_bucket(Bucket=bucket)
        client.close()

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(timeout=30)
            self._proc = None


def _print_until(go: str) -> int:
    import time

    print("ticking", flush=True)
    while not os.path.exists(go):
        time.sleep(0.2)
        print("tick", flush=True)
    print("done", flush=True)
    return 7


@pytest.mark.s3
@pytest.mark.timeout(300)  # an outage of its own (20-90 s) on a busy machine
def test_a_stopped_artifact_store_costs_a_running_job_nothing(tmp_path, monkeypatch):
    pytest.importorskip("moto.server", reason="moto[server] is not installed")
    moto = _Moto(tmp_path)
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_DEFAULT_REGION", "us-east-1"), ("AWS_ENDPOINT_URL_S3", moto.url),
                        ("AWS_CONFIG_FILE", os.devnull),
                        ("AWS_SHARED_CREDENTIALS_FILE", os.devnull)):
        monkeypatch.setenv(name, value)
    # A store opened earlier in this process on another endpoint (as an earlier test's was):
    # the session's store must not reuse its client, which would never see this moto.
    from shoal.storage.artifacts import FsspecArtifactStore

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")
    FsspecArtifactStore.open("s3://outage/root")._fs.s3  # noqa: B018 - its client, made now
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto.url)
    moto.start("outage")
    s = shoal.Session(home=str(tmp_path / "home"), artifact_url="s3://outage/root",
                      launcher_idle_seconds=60, store_outage_seconds=90)
    go = tmp_path / "go"
    try:
        with shoal.use(s), shoal.RemoteExecutor(job_name_prefix="s3-outage") as executor:
            future = executor.submit(_print_until, str(go))
            try:
                wait_until(lambda: future.job_name and b"tick" in s.jobs.read_log(
                    future.job_name), 60, what="the job's log to reach the store")
                moto.stop()
                time.sleep(8)  # the outage itself: several of the log's uploads fail
                go.touch()  # the job ends while the store is away: its last upload waits
                moto.start("outage")  # back (empty: moto forgets); the log is uploaded again
                assert future.result(timeout=120) == 7
            finally:
                go.touch()  # else leaving the executor waits for a job that never ends
        record = s.jobs.get(future.job_name)
        assert record.status == JobStatus.COMPLETED and record.attempt == 1
        log = s.jobs.read_log(future.job_name).decode()
        assert "ticking" in log and "done" in log  # the whole log, from the spool
    finally:
        go.touch()
        moto.stop()
        s.close()


# --- the backend stops answering while a client waits ----------------------------------

class _AwayBackend:
    """The session's real local backend, which can be made not to answer ``is_alive`` as a
    Ray cluster whose head is away does (a stand-in for that here: the Ray test of a dead head,
    test_ray_resilience.py, kills one for real and is slow)."""

    def __init__(self, inner: object) -> None:
        self._inner = inner
        self.away = False

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    def is_alive(self, handle):
        from shoal.errors import BackendUnavailableError

        if self.away:
            raise BackendUnavailableError("the test's cluster does not answer",
                                          address="test-cluster:6379")
        return self._inner.is_alive(handle)


def test_a_future_waits_again_after_the_backend_was_away_and_keeps_the_jobs_end(session,
                                                                               tmp_path):
    from shoal.errors import BackendUnavailableError

    backend = _AwayBackend(session.jobs.backend)
    session.jobs.backend = backend
    session.jobs.backend_wait_seconds = 2
    go = tmp_path / "go"
    try:
        with shoal.RemoteExecutor(job_name_prefix="away-wait") as executor:
            future = executor.submit(_wait_for_file, str(go))
            wait_until(lambda: future.job_name and b"waiting" in session.jobs.read_log(
                future.job_name), 60, what="the job to run")
            backend.away = True
            with pytest.raises(BackendUnavailableError, match="test-cluster:6379"):
                future.result(timeout=60)
            with pytest.raises(BackendUnavailableError):  # still away: the same, bounded
                future.result(timeout=60)
            backend.away = False  # back: the future follows the job to its end
            go.touch()
            assert future.result(timeout=60) == 42
            assert future.exception(timeout=1) is None
    finally:
        go.touch()
