"""Infrastructure loss on the local backend (issue #23): a supervisor that is killed costs an
attempt, never the job, while max_retry_attempts leaves one."""

from __future__ import annotations

import os
import signal
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
