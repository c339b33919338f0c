"""A script that ends after RemoteExecutor.submit() without shutdown() or ``with`` loses
nothing, as with ThreadPoolExecutor; a record is never left pending because its client died
(issue #15, item 4)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from shoal import JobFailedError
from shoal.core import FailureKind, JobQuery, JobStatus
from shoal.remote_function import get_future

TESTS = str(Path(__file__).resolve().parents[1])


def run_script(body: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(body)], capture_output=True,
                          text=True, timeout=300,
                          env={**__import__("os").environ, "PYTHONPATH": TESTS + ":"
                               + __import__("os").environ.get("PYTHONPATH", "")})


def test_a_script_that_ends_after_submit_waits_for_its_calls(session):
    done = run_script(f"""
        import shoal
        from shoal import RemoteExecutor
        s = shoal.Session(home={str(session.home)!r})
        def triple(x):
            import time
            time.sleep(0.5)
            return 3 * x
        e = RemoteExecutor(sagemaker_session=s, max_parallel_jobs=2)
        for i in range(4):
            e.submit(triple, i)
        print("submitted")
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "submitted"
    # Right after the script's exit: every call is a job, it ran, and its record has ended.
    records = session.metadata.list_jobs(JobQuery(name_prefix="triple-"))
    assert len(records) == 4
    assert {r.status for r in records} == {JobStatus.COMPLETED}
    assert sorted(get_future(r.name).result(timeout=5) for r in records) == [0, 3, 6, 9]


def test_a_client_that_dies_before_handing_the_job_over_leaves_no_pending_record(session):
    """The client is killed (SIGKILL, so no atexit runs) after the job was recorded and
    before a supervisor took it: the record ends failed at once, naming the client."""
    done = run_script(f"""
        import os, signal
        import shoal
        from shoal import remote
        s = shoal.Session(home={str(session.home)!r})
        # The crash, injected where it hurts: between recording the job and launching it.
        s.backend.launch = lambda ctx: os.kill(os.getpid(), signal.SIGKILL)
        remote(lambda: 1, sagemaker_session=s, job_name_prefix="orphan")()
    """)
    assert done.returncode == -9, done.stderr
    [record] = session.metadata.list_jobs(JobQuery(name_prefix="orphan"))
    assert record.status == JobStatus.PENDING  # what the dead client left behind
    with pytest.raises(JobFailedError, match="client") as caught:
        get_future(record.name).result(timeout=30)
    record = session.jobs.get(record.name)
    assert record.status == JobStatus.FAILED
    assert record.failure_kind == FailureKind.SUPERVISOR_LOST
    assert "exited before handing the job to a supervisor" in record.failure_reason
    assert record.name in str(caught.value)
