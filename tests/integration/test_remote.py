"""@remote end to end on the local backend: real launcher, supervisors and job processes."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import numpy as np
import pytest

import shoal
from helpers import wait_until
from shoal import JobFailedError, JobTimeoutError, remote
from shoal.core import FailureKind, JobQuery, JobStatus
from shoal.errors import InvalidArgumentError, PicklingError, ResourceUnavailableError


def test_seed_divide_returns_the_result_and_records_a_completed_job(session, capsys):
    @remote(instance_type="ml.m5.xlarge")
    def divide(x, y):
        print("dividing", x, "by", y)
        return x / y

    assert divide(2, 3.0) == 2 / 3.0
    assert "dividing 2 by 3.0" in capsys.readouterr().out  # the job's log streams to the caller
    [record] = session.metadata.list_jobs(JobQuery(name_prefix="divide-"))
    assert record.status == JobStatus.COMPLETED
    assert record.spec.instance_type == "ml.m5.xlarge"
    assert record.spec.cpus == 4
    assert [e.status for e in session.jobs.get(record.name).events] == [
        JobStatus.PENDING, JobStatus.STARTING, JobStatus.RUNNING, JobStatus.COMPLETED]
    assert record.started_at is not None and record.ended_at is not None


def test_seed_matrix_multiply_with_numpy(session):
    @remote(instance_type="ml.m5.large")
    def matrix_multiply(a, b):
        return np.matmul(a, b)

    out = matrix_multiply(np.array([[1, 0], [0, 1]]), np.array([1, 2]))
    assert (out == np.array([1, 2])).all()


def test_bare_decorator_and_keyword_arguments(session):
    @remote
    def add(a, *, b=1):
        return a + b

    assert add(1, b=41) == 42


def test_user_exception_is_reraised_with_remote_traceback_and_job_cause(session):
    @remote
    def boom(x):
        raise KeyError(f"missing {x}")

    with pytest.raises(KeyError) as info:
        boom("thing")
    exc = info.value
    cause = exc.__cause__
    assert isinstance(cause, JobFailedError)
    job = cause.details["job"]
    assert job.startswith("boom-")
    assert cause.details["log_uri"].endswith(f"{job}/logs/output.log")
    notes = "".join(getattr(exc, "__notes__", []))
    assert "Remote traceback" in notes and "raise KeyError" in notes
    record = session.jobs.get(job)
    assert record.status == JobStatus.FAILED
    assert record.failure_kind == FailureKind.USER_ERROR
    assert "KeyError" in record.failure_reason


class Unpicklable(Exception):
    def __init__(self, message):
        super().__init__(message)
        self.lock = threading.Lock()


def test_unpicklable_exception_becomes_job_failed_error_with_traceback(session):
    @remote
    def raise_odd():
        raise Unpicklable("odd failure")

    with pytest.raises(JobFailedError) as info:
        raise_odd()
    assert "odd failure" in str(info.value)
    assert "Unpicklable" in info.value.details["traceback"]


def test_unpicklable_closure_names_the_object_and_creates_no_job(session):
    lock = threading.Lock()

    @remote
    def uses_lock():
        return lock.locked()

    with pytest.raises(PicklingError) as info:
        uses_lock()
    assert "closure variable 'lock'" in str(info.value)
    assert session.metadata.list_jobs(JobQuery()) == []


def test_unpicklable_argument_names_the_argument_and_creates_no_job(session):
    @remote
    def identity(x):
        return x

    with pytest.raises(PicklingError, match="argument 0"):
        identity(threading.Lock())
    assert session.metadata.list_jobs(JobQuery()) == []


def test_max_runtime_kills_the_job_and_raises_job_timeout(session, tmp_path):
    never = tmp_path / "never"

    @remote(max_runtime_in_seconds=1)
    def hang():
        import time

        while not never.exists():
            time.sleep(0.05)

    with pytest.raises(JobTimeoutError) as info:
        hang()
    job = info.value.details["job"]
    record = session.jobs.get(job)
    assert record.status == JobStatus.FAILED
    assert record.failure_kind == FailureKind.TIMEOUT
    assert "max_runtime_in_seconds=1" in record.failure_reason


def test_job_killed_from_outside_fails_naming_the_signal(session, tmp_path):
    pid_file, release = tmp_path / "pid", tmp_path / "release"

    def report_and_wait():
        import os
        import time

        pid_file.write_text(str(os.getpid()))
        while not release.exists():
            time.sleep(0.05)

    with shoal.RemoteExecutor() as executor:
        future = executor.submit(report_and_wait)
        wait_until(pid_file.exists, timeout=30)
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        with pytest.raises(JobFailedError, match="SIGKILL"):
            future.result(timeout=30)
    record = session.jobs.get(future.job_name)
    assert record.failure_kind == FailureKind.SIGNAL


def test_supervisor_killed_is_reaped_and_the_caller_does_not_hang(session, tmp_path):
    started = tmp_path / "started"

    def wait_forever():
        import time

        started.write_text("x")
        while True:
            time.sleep(0.05)

    with shoal.RemoteExecutor() as executor:
        future = executor.submit(wait_forever)
        wait_until(started.exists, timeout=30)
        handle = session.jobs.get(future.job_name).handle
        os.kill(handle["pid"], signal.SIGKILL)
        with pytest.raises(JobFailedError, match="supervisor"):
            future.result(timeout=30)
    record = session.jobs.get(future.job_name)
    assert record.status == JobStatus.FAILED
    assert record.failure_kind == FailureKind.SUPERVISOR_LOST


def test_retry_after_infrastructure_failure(session, tmp_path):
    marker = tmp_path / "first-attempt-done"

    @remote(max_retry_attempts=2)
    def flaky():
        import os
        import signal

        if not marker.exists():
            marker.write_text("x")
            os.kill(os.getpid(), signal.SIGKILL)  # looks like the machine killed it
        return "second time lucky"

    assert flaky() == "second time lucky"
    [record] = session.metadata.list_jobs(JobQuery(name_prefix="flaky-"))
    assert record.attempt == 2
    statuses = [e.status for e in session.jobs.get(record.name).events]
    assert statuses.count(JobStatus.STARTING) == 2


def test_environment_variables_and_thread_limits_reach_the_job(session):
    @remote(instance_type="ml.m5.large", environment_variables={"GREETING": "hello"})
    def read_env():
        import os

        return os.environ["GREETING"], os.environ["OMP_NUM_THREADS"], "SHOAL_JOB_KEY" in os.environ

    greeting, threads, key_visible = read_env()
    assert greeting == "hello"
    assert threads == str(min(2, os.cpu_count()))
    assert key_visible is False  # the HMAC key never reaches user code


def test_memory_limit_of_the_instance_type_is_enforced(session):
    @remote(instance_type="ml.t3.medium")  # 4 GiB
    def allocate():
        return len(bytearray(6 * 1024**3))

    with pytest.raises(MemoryError):
        allocate()


def test_gpu_instance_type_fails_at_submission_without_gpus(session):
    if list(Path("/dev").glob("nvidia[0-9]*")):
        pytest.skip("this machine has a GPU")

    @remote(instance_type="ml.g5.xlarge")
    def on_gpu():
        return 1

    with pytest.raises(ResourceUnavailableError, match="allow_cpu_fallback"):
        on_gpu()
    assert session.metadata.list_jobs(JobQuery()) == []


def test_gpu_instance_type_runs_on_cpu_when_the_user_opts_in(session):
    if list(Path("/dev").glob("nvidia[0-9]*")):
        pytest.skip("this machine has a GPU")

    @remote(instance_type="ml.g5.xlarge", allow_cpu_fallback=True)
    def on_cpu():
        return "cpu"

    assert on_cpu() == "cpu"
    [record] = session.metadata.list_jobs(JobQuery(name_prefix="on-cpu-"))
    assert "ran on CPU" in (record.spec.gpu_fallback or "")
    assert record.spec.gpus == 0


def test_unknown_and_not_yet_supported_arguments_are_refused(session):
    with pytest.raises(TypeError, match="instance_typ"):
        remote(instance_typ="ml.m5.large")
    with pytest.raises(InvalidArgumentError, match="keep_alive_period_in_seconds"):
        remote(keep_alive_period_in_seconds=7200)
    with pytest.raises(InvalidArgumentError, match="spark_config"):
        remote(spark_config={"k": "v"})
    with pytest.raises(InvalidArgumentError, match="max_runtime_in_seconds"):
        remote(max_runtime_in_seconds=0)


def test_unknown_instance_type_is_refused_before_any_job(session):
    @remote(instance_type="ml.m5.huge")
    def f():
        return 1

    with pytest.raises(InvalidArgumentError, match="ml.m5.huge"):
        f()
    assert session.metadata.list_jobs(JobQuery()) == []


def test_inert_sagemaker_settings_are_kept_and_reported_once(session, caplog):
    @remote(role="arn:aws:iam::111122223333:role/SageMakerRole", image_uri="img:latest")
    def f():
        return 1

    with caplog.at_level("WARNING", logger="shoal.session"):
        assert f() == 1
        assert f() == 1
    records = session.metadata.list_jobs(JobQuery(name_prefix="f-"))
    assert all(r.spec.inert_settings["role"].endswith("SageMakerRole") for r in records)
    role_warnings = [r for r in caplog.records if "role=" in r.getMessage()]
    assert len(role_warnings) == 1


@pytest.mark.parametrize("settings", [{"launch_mode": "spawn"}, {"job_process": "exec"}],
                         ids=["spawned-supervisor", "exec-job-process"])
def test_other_process_modes_run_the_same_job(tmp_path, settings):
    from conftest import make_session

    s = make_session(tmp_path / "home", **settings)
    try:
        @remote(sagemaker_session=s)
        def pid_and_value(x):
            import os

            return os.getpid(), x * 2

        pid, value = pid_and_value(21)
        assert value == 42 and pid != os.getpid()
    finally:
        s.backend.shutdown_launcher()
        s.close()


def test_secret_environment_values_are_masked_in_the_job_log(session, capsys):
    @remote(environment_variables={"API_TOKEN": "tok-12345-secret", "PLAIN": "visible-value"})
    def leak():
        import os

        print("token is", os.environ["API_TOKEN"], "plain is", os.environ["PLAIN"])
        return os.environ["API_TOKEN"]

    assert leak() == "tok-12345-secret"  # the job itself sees the real value
    [record] = session.metadata.list_jobs(JobQuery(name_prefix="leak-"))
    log = session.jobs.read_log(record.name).decode()
    assert "tok-12345-secret" not in log and "token is ****" in log
    assert "visible-value" in log
    assert "tok-12345-secret" not in capsys.readouterr().out


def test_a_job_that_closes_its_output_still_obeys_max_runtime(session, tmp_path):
    never = tmp_path / "never"

    @remote(max_runtime_in_seconds=2)
    def silent_forever():
        import os
        import time

        os.close(1)
        os.close(2)
        while not never.exists():
            time.sleep(0.05)

    with pytest.raises(JobTimeoutError):
        silent_forever()
