"""The Supervisor in this process, on jobs submitted through JobService to a MemoryBackend:
the test starts the supervisor the backend was asked for, with the environment it was given.
The job's code runs in a real child interpreter (``fork=False``: no fork of pytest)."""

from __future__ import annotations

import operator
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import flip_stored_byte, memory_job_service
from shoal.backends.memory import MemoryBackend
from shoal.core import FailureKind, JobName, JobSpec, JobStatus
from shoal.errors import JobCancelledError, JobFailedError
from shoal.jobs._descendants import _is_subreaper, become_subreaper
from shoal.jobs.driver import Supervisor
from shoal.jobs.keys import JOB_SECRETS_VAR
from shoal.jobs.service import JobService
from shoal.jobs.slots import SlotPool


@pytest.fixture
def in_process() -> Iterator[None]:
    """Supervisor.run sets SIGTERM/SIGINT handlers, a wakeup fd and the subreaper flag of the
    process it runs in, as a supervisor process should; pytest gets its own back after."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    subreaper = _is_subreaper()
    try:
        yield
    finally:
        signal.set_wakeup_fd(-1)
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        become_subreaper(subreaper)


def _submit(svc: JobService, name: str, *args: object) -> JobName:
    spec = JobSpec(name=JobName(name), function_name="operator.truediv",
                   stop_grace_period_in_seconds=5)
    return svc.submit_function(spec, operator.truediv, args, {}).name


def _supervise(svc: JobService, root: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> int:
    """Run the supervisor *svc*'s backend was asked to start for *name*, as its entry point
    would: its own JobService (no user secret), the secret handed over in its environment."""
    backend = svc.backend
    assert isinstance(backend, MemoryBackend)
    ctx = backend.context(name)
    assert ctx.args == (name,)
    monkeypatch.setenv(JOB_SECRETS_VAR, ctx.env[JOB_SECRETS_VAR])
    own = memory_job_service(root, backend=backend, keys=False)
    supervisor = Supervisor(own, work_root=root / "work", slots=SlotPool(root / "slots", 1),
                            fork=False, run_dir=root / "run")
    return supervisor.run(name)


@pytest.mark.usefixtures("in_process")
def test_a_function_job_that_returns_completes_with_its_result(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    svc = memory_job_service(tmp_path)
    name = _submit(svc, "divide-7", 7, 2)
    assert _supervise(svc, tmp_path, name, monkeypatch) == 0
    record = svc.wait(name, timeout=5)
    assert (record.status, record.exit_code, record.attempt) == (JobStatus.COMPLETED, 0, 1)
    assert [e.status for e in record.events] == [JobStatus.PENDING, JobStatus.STARTING,
                                                 JobStatus.RUNNING, JobStatus.COMPLETED]
    assert svc.outcome(record) == 3.5


@pytest.mark.usefixtures("in_process")
def test_what_ran_under_the_process_before_it_supervised_outlives_the_job(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that supervises in place ends what the job left, not its own earlier
    children: in one pytest process this ended the session's shoal server."""
    earlier = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                               stdin=subprocess.DEVNULL)
    try:
        svc = memory_job_service(tmp_path)
        name = _submit(svc, "divide-8", 8, 2)
        assert _supervise(svc, tmp_path, name, monkeypatch) == 0
        assert svc.wait(name, timeout=5).status == JobStatus.COMPLETED
        assert earlier.poll() is None, "the supervisor ended a process that was not the job's"
    finally:
        earlier.kill()
        earlier.wait(timeout=10)


@pytest.mark.usefixtures("in_process")
def test_a_function_job_that_raises_fails_with_the_exception(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    svc = memory_job_service(tmp_path)
    name = _submit(svc, "divide-0", 1, 0)
    _supervise(svc, tmp_path, name, monkeypatch)
    record = svc.wait(name, timeout=5)
    assert (record.status, record.failure_kind) == (JobStatus.FAILED, FailureKind.USER_ERROR)
    assert "ZeroDivisionError" in (record.failure_reason or "")
    with pytest.raises(ZeroDivisionError) as raised:
        svc.outcome(record)
    assert any("Remote traceback" in note for note in raised.value.__notes__)


@pytest.mark.usefixtures("in_process")
def test_a_tampered_payload_is_refused_unread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    svc = memory_job_service(tmp_path)
    name = _submit(svc, "divide-t", 7, 2)
    where = flip_stored_byte(svc, name, "arguments")
    _supervise(svc, tmp_path, name, monkeypatch)
    record = svc.wait(name, timeout=5)
    assert (record.status, record.failure_kind) == (JobStatus.FAILED, FailureKind.INTEGRITY), \
        f"arguments changed in the {where}: {record.failure_reason}"
    assert "arguments" in (record.failure_reason or "")
    with pytest.raises(JobFailedError):
        svc.outcome(record)


@pytest.mark.usefixtures("in_process")
def test_a_job_stopped_before_its_supervisor_ran_ends_stopped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    svc = memory_job_service(tmp_path)
    name = _submit(svc, "divide-s", 7, 2)
    assert svc.cancel(name).status == JobStatus.STOPPING
    assert isinstance(svc.backend, MemoryBackend) and svc.backend.stop_requests == [name]
    assert _supervise(svc, tmp_path, name, monkeypatch) == 0
    record = svc.wait(name, timeout=5)
    assert record.status == JobStatus.STOPPED
    assert record.events[-1].reason == "stopped before it started"
    with pytest.raises(JobCancelledError):
        svc.outcome(record)
