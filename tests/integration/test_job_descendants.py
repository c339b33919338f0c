"""Processes a job starts end with the job, even those that left its session (a setsid child,
a double fork): the supervisor is a child subreaper and ends every descendant when the job
completes, is stopped or times out (issue #15, item 6)."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest

import shoal
from helpers import wait_until
from shoal import JobTimeoutError, RemoteExecutor, remote
from shoal.backends.procfs import process_state
from shoal.core import JobQuery, JobStatus


@pytest.fixture
def escapees():
    """Pids the test's jobs started outside their session; killed at the end whatever the
    outcome (on code that lets them escape, they would live on)."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def spawn_escapees(pid_file: str, ignore_term: bool = False) -> list[int]:
    """In the job: a setsid child (start_new_session=True) and a double-forked daemon, both
    sleeping for ten minutes; their pids go to *pid_file* as soon as they exist."""
    import os
    import subprocess
    import sys

    sleeper = ("import signal, time\n"
               + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_term else "")
               + "time.sleep(600)")
    child = subprocess.Popen([sys.executable, "-c", sleeper], start_new_session=True,
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:  # the classic daemon: fork, setsid, fork, the middle one exits
        os.setsid()
        grandchild = os.fork()
        if grandchild == 0:
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            os.execv(sys.executable, [sys.executable, "-c", sleeper])
        os.write(w, str(grandchild).encode())
        os._exit(0)
    os.close(w)
    daemon = int(os.read(r, 64))
    os.waitpid(middle, 0)
    pids = [child.pid, daemon]
    with open(pid_file + ".tmp", "w") as f:
        f.write(" ".join(map(str, pids)))
    os.replace(pid_file + ".tmp", pid_file)
    return pids


def read_pids(path: Path) -> list[int]:
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def all_gone(pids: list[int]) -> bool:
    """Every pid has exited and been reaped (no zombie left either)."""
    return all(process_state(pid) is None for pid in pids)


@pytest.mark.parametrize("process", ["fork", "exec"])
def test_escaped_processes_end_when_the_job_completes(tmp_path, escapees, process):
    s = shoal.Session(home=str(tmp_path / "home"), launcher_idle_seconds=60,
                      job_process=process)
    pid_file = str(tmp_path / "pids")
    try:
        job = remote(lambda: spawn_escapees(pid_file), sagemaker_session=s)
        pids = job()
        escapees.extend(pids)
        assert len(pids) == 2
        wait_until(lambda: all_gone(pids), 30, what="the job's escaped processes gone")
    finally:
        s.backend.shutdown_launcher()
        s.close()


def test_escaped_processes_end_when_the_job_is_stopped(session, tmp_path, escapees):
    pid_file = tmp_path / "pids"

    def spawn_and_block():
        import time

        spawn_escapees(str(pid_file))
        while True:
            time.sleep(0.05)

    with RemoteExecutor() as e:
        future = e.submit(spawn_and_block)
        pids = wait_until(lambda: read_pids(pid_file), 120, what="the escapees' pids")
        escapees.extend(pids)
        future.cancel()
        wait_until(lambda: session.jobs.get(future.job_name).is_terminal, 60)
    assert session.jobs.get(future.job_name).status == JobStatus.STOPPED
    wait_until(lambda: all_gone(pids), 30, what="the stopped job's escaped processes gone")


def test_escaped_processes_end_when_the_job_times_out(session, tmp_path, escapees):
    pid_file = tmp_path / "pids"

    @remote(max_runtime_in_seconds=5)
    def spawn_and_overrun():
        import time

        spawn_escapees(str(pid_file))
        time.sleep(600)

    with pytest.raises(JobTimeoutError):
        spawn_and_overrun()
    pids = read_pids(pid_file)
    escapees.extend(pids)
    assert len(pids) == 2
    wait_until(lambda: all_gone(pids), 30, what="the timed-out job's escaped processes gone")


def test_an_escapee_that_ignores_sigterm_is_killed_after_the_grace_period(
        session, tmp_path, escapees):
    pid_file = str(tmp_path / "pids")
    pids = remote(lambda: spawn_escapees(pid_file, ignore_term=True),
                  stop_grace_period_in_seconds=1)()
    escapees.extend(pids)
    wait_until(lambda: all_gone(pids), 30, what="the SIGTERM-proof escapees gone")


def test_each_job_on_a_warm_worker_takes_its_escapees_with_it(session, tmp_path, escapees):
    first, second = str(tmp_path / "first"), str(tmp_path / "second")
    with RemoteExecutor(keep_alive_period_in_seconds=30) as e:
        pids = e.submit(spawn_escapees, first).result(timeout=120)
        escapees.extend(pids)
        wait_until(lambda: all_gone(pids), 30, what="the first job's escapees gone")
        more = e.submit(spawn_escapees, second).result(timeout=120)
        escapees.extend(more)
        wait_until(lambda: all_gone(more), 30, what="the second job's escapees gone")
    handles = {r.handle.get("pid") for r in session.metadata.list_jobs(JobQuery())}
    assert len(handles) == 1  # both ran on one warm worker, which survived the clean-up


@pytest.mark.slow
def test_a_zygote_job_takes_its_escapees_with_it_and_the_zygote_stays(
        session, tmp_path, escapees):
    """An isolated environment's job is forked by that interpreter's zygote, not by the
    supervisor: the job and the zygote are subreapers, and the zygote ends what an ended job
    left (and serves the next job)."""
    req = tmp_path / "requirements.txt"
    req.write_text("")  # an isolated environment holding only cloudpickle
    job = remote(spawn_escapees, dependencies=str(req))
    pids = job(str(tmp_path / "first"))
    escapees.extend(pids)
    wait_until(lambda: all_gone(pids), 30, what="the zygote job's escapees gone")
    more = job(str(tmp_path / "second"))
    escapees.extend(more)
    wait_until(lambda: all_gone(more), 30, what="the second zygote job's escapees gone")
    [pid_file] = (session.home / "run").glob("z-*.pid")
    zygote = int(pid_file.read_text())
    assert process_state(zygote) not in (None, "Z")  # it served both jobs and lives on


def test_calls_handed_to_a_warm_worker_together_leave_nothing_behind(
        session, tmp_path, escapees):
    files = [str(tmp_path / f"call-{i}") for i in range(3)]
    with RemoteExecutor(keep_alive_period_in_seconds=30) as e:
        results = list(e.map(spawn_escapees, files))
    pids = [pid for pair in results for pid in pair]
    escapees.extend(pids)
    assert len(pids) == 6
    wait_until(lambda: all_gone(pids), 30, what="the batch's escapees gone")
    batches = {r.spec.batch and r.spec.batch.id for r in
               session.metadata.list_jobs(JobQuery())}
    assert None not in batches  # they did run as a batch
