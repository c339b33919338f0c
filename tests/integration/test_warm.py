"""keep_alive_period_in_seconds: warm workers take the next compatible job, isolated."""

from __future__ import annotations

import collections
import os
import signal
import sys

import pytest

from helpers import wait_until
from shoal import JobFailedError, RemoteExecutor, remote
from shoal.core import JobQuery, JobStatus


def _worker_pid(session, name):
    return session.jobs.get(name).handle["pid"]


def test_second_job_runs_on_the_warm_worker_with_its_own_record(session, capsys):
    @remote(keep_alive_period_in_seconds=30)
    def echo(x):
        print("echo", x)
        return x

    assert echo(1) == 1
    assert echo(2) == 2
    first, second = sorted(session.metadata.list_jobs(JobQuery(name_prefix="echo-")),
                           key=lambda r: r.created_at)
    assert _worker_pid(session, first.name) == _worker_pid(session, second.name)
    assert second.status == JobStatus.COMPLETED
    assert b"echo 2" in session.jobs.read_log(second.name)
    assert b"echo 2" not in session.jobs.read_log(first.name)
    assert "echo 2" in capsys.readouterr().out


def test_the_worker_is_claimable_as_soon_as_its_first_job_is_seen_ending(session):
    """The race behind a second cold start: a client that sees the first job end and calls
    again must find the worker claimable, not still setting up its endpoint."""
    import fcntl

    @remote(keep_alive_period_in_seconds=30)
    def first():
        return 1

    assert first() == 1  # returns once the job's COMPLETED is in the store
    (job,) = session.metadata.list_jobs(JobQuery(name_prefix="first-"))
    pid = _worker_pid(session, job.name)
    claims = list((session.home / "run" / "warm").glob(f"*/{pid}.claim"))
    if not claims:  # a long home puts pools under the private socket directory
        from shoal.backends.rundir import private_socket_dir

        claims = list((private_socket_dir() / "warm").glob(f"*/{pid}.claim"))
    assert len(claims) == 1, "the worker's claim is not there when its job's end shows"
    with open(claims[0]) as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises if the worker still holds it
        fcntl.flock(f, fcntl.LOCK_UN)


def test_state_changes_by_one_job_do_not_reach_the_next(session, tmp_path):
    @remote(keep_alive_period_in_seconds=30)
    def meddle():
        import json
        import os
        import sys

        os.chdir("/")
        os.environ["MEDDLED"] = "yes"
        sys.path.insert(0, "/meddled")
        json.dumps = lambda *a, **k: "monkeypatched"
        return os.getpid()

    @remote(keep_alive_period_in_seconds=30)
    def inspect_state():
        import json
        import os
        import sys

        return (os.environ.get("MEDDLED"), "/meddled" in sys.path, json.dumps([1]),
                os.getcwd() == "/")

    meddle()
    assert inspect_state() == (None, False, "[1]", False)
    names = [r.name for r in session.metadata.list_jobs(JobQuery())]
    assert len({_worker_pid(session, n) for n in names}) == 1  # the same warm worker


_LOCAL_MODULE = """
import importlib
import json
import os
import sys


def probe(x):
    seen = {"json.tool": "json.tool" in sys.modules, "bound": hasattr(json, "tool")}
    importlib.import_module("json.tool")  # a submodule of a package the executor had loaded

    return x, os.getppid(), os.getpid(), seen
"""


def _supervisor_logs(session):
    """What the home's supervisors wrote (a warm executor's discard is said there)."""
    return "".join(p.read_text(errors="replace")
                   for p in sorted((session.home / "run" / "supervisors").glob("*.log")))


def _import_local_module(tmp_path, monkeypatch, name):
    import importlib

    (tmp_path / f"{name}.py").write_text(_LOCAL_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)  # gone again after the test
    return importlib.import_module(name)


@pytest.mark.parametrize("via", ["submit", "map"])
def test_a_function_from_a_local_module_keeps_the_warm_executor(session, tmp_path, monkeypatch,
                                                                via):
    """A function imported from the user's own module (pickled by reference, imported
    again by each job) runs on the same warm executor process call after call, and each
    call finds the module and the submodule it imported gone again. The executor was once
    discarded after every such call (~30 ms each): the import system makes new modules
    with ``type(sys)``, the snapshot's tracked class, so the new module's own ``__spec__``
    counted as a change to a loaded module."""
    mod = _import_local_module(tmp_path, monkeypatch, f"shoal_local_{via}")
    with RemoteExecutor(keep_alive_period_in_seconds=30) as e:
        if via == "submit":  # one call at a time
            out = [e.submit(mod.probe, i).result(timeout=120) for i in range(5)]
        else:
            assert e.submit(mod.probe, 0).result(timeout=120)[0] == 0  # warms a worker
            out = list(e.map(mod.probe, range(6), timeout=120, chunksize=3))
    assert [x for x, *_ in out] == list(range(len(out)))
    assert all(seen == {"json.tool": False, "bound": False} for *_, seen in out), out
    # Calls ran one after another on the same executor process: with the old bug every call
    # got a new one. (A call may find a worker still finishing and start another worker, on
    # a loaded machine, whose first call starts an executor of its own: so not *every* call.)
    calls_per_executor = collections.Counter(executor for _, _, executor, _ in out)
    assert max(calls_per_executor.values()) >= 2, f"an executor per call: {out}"
    assert "executor discarded" not in _supervisor_logs(session)


def test_a_job_that_rebinds_a_loaded_module_still_discards_the_executor(session):
    """What the snapshot cannot undo still retires the executor: a new module bound as
    an attribute of a loaded one under another name is the job's change."""
    @remote(keep_alive_period_in_seconds=30)
    def rebind():
        import json
        import os
        import types

        json.extra = types.ModuleType("json.extra_other")
        return os.getpid()

    @remote(keep_alive_period_in_seconds=30)
    def after():
        import json
        import os

        return os.getpid(), hasattr(json, "extra")

    first = rebind()
    second, leaked = after()
    assert first != second and not leaked
    assert "executor discarded: the job changed attributes of module(s) json" in \
        _supervisor_logs(session)


def test_jobs_that_import_an_extension_module_run_one_after_another(session):
    """numpy's compiled core loads once per process: a warm executor whose job imported it
    is retired rather than forgetting it (the next job's import would fail)."""
    @remote(keep_alive_period_in_seconds=30)
    def total(n):
        import numpy as np

        return int(np.arange(n).sum())

    assert [total(n) for n in (10, 100, 1000)] == [45, 4950, 499500]


def test_a_job_that_crashes_its_process_does_not_take_the_worker_down(session):
    @remote(keep_alive_period_in_seconds=30)
    def crash():
        import os
        import signal

        os.kill(os.getpid(), signal.SIGKILL)

    @remote(keep_alive_period_in_seconds=30)
    def fine():
        return "fine"

    with pytest.raises(JobFailedError, match="SIGKILL"):
        crash()
    assert fine() == "fine"
    names = [r.name for r in session.metadata.list_jobs(JobQuery())]
    assert len({_worker_pid(session, n) for n in names}) == 1


def test_cancel_on_a_warm_worker_stops_only_that_job(session, tmp_path):
    started = tmp_path / "started"

    def block():
        import time

        started.write_text("x")
        while True:
            time.sleep(0.02)

    with RemoteExecutor(keep_alive_period_in_seconds=30) as e:
        assert e.submit(pow, 2, 5).result(timeout=60) == 32  # warms a worker
        future = e.submit(block)
        wait_until(started.exists, timeout=30)
        future.cancel()
        wait_until(lambda: session.jobs.get(future.job_name).is_terminal, timeout=30)
        assert session.jobs.get(future.job_name).status == JobStatus.STOPPED
        # Only the job stopped: the warm worker that ran it is still there, ready for more
        # (the next call may still start another worker if it comes while this one cleans up
        # after the stop, on a loaded machine).
        worker = session.jobs.get(future.job_name).handle
        assert session.backend.is_alive(worker) is True
        assert e.submit(pow, 3, 2).result(timeout=60) == 9
        assert session.backend.is_alive(worker) is True


def test_idle_worker_retires_after_its_keep_alive_period(session):
    @remote(keep_alive_period_in_seconds=1)
    def quick():
        return 1

    quick()
    [record] = session.metadata.list_jobs(JobQuery())
    pid = record.handle["pid"]
    wait_until(lambda: session.backend.is_alive(record.handle) is False, timeout=30)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_killed_warm_worker_fails_its_job_and_the_next_call_starts_a_new_one(session, tmp_path):
    started = tmp_path / "started"

    def block():
        import time

        started.write_text("x")
        while True:
            time.sleep(0.02)

    with RemoteExecutor(keep_alive_period_in_seconds=30) as e:
        future = e.submit(block)
        wait_until(started.exists, timeout=30)
        os.kill(_worker_pid(session, future.job_name), signal.SIGKILL)
        with pytest.raises(JobFailedError, match="supervisor"):
            future.result(timeout=30)
        assert e.submit(pow, 2, 3).result(timeout=60) == 8


def test_sigterm_retires_an_idle_warm_worker(session):
    @remote(keep_alive_period_in_seconds=300)
    def quick():
        return 1

    quick()
    [record] = session.metadata.list_jobs(JobQuery())
    os.kill(record.handle["pid"], signal.SIGTERM)
    wait_until(lambda: session.backend.is_alive(record.handle) is False, timeout=30)
    assert quick() == 1  # the next call starts a new worker


def _pool_of(session, pid):
    """The pool directory in which the warm worker *pid* listens."""
    from shoal.backends.workers import _pool_dirs

    [claim] = [c for d in _pool_dirs(session.home / "run") for c in d.glob(f"{pid}.claim")]
    return claim.parent


def test_a_warm_supervisor_started_without_a_job_takes_stop_signals(session, tmp_path):
    """What a Ray warm actor starts (shoal.session:serve_warm_main), here in a local pool so
    that the local backend hands it jobs and signals it: a SIGTERM that a job's record asks
    for stops that job (JobService.cancel; the CLI's 'jobs stop' on the same home sends the
    same), and one while it is idle retires it. Its old guard ignored every SIGTERM: the
    cancelled job ran on and 'shoal workers stop' could only SIGKILL it."""
    import subprocess
    import sys

    started = tmp_path / "started"

    def block():
        import time

        started.write_text("x")
        while True:
            time.sleep(0.02)

    with RemoteExecutor(keep_alive_period_in_seconds=300) as e:
        first = e.submit(pow, 2, 5)
        assert first.result(timeout=60) == 32
        worker = _worker_pid(session, first.job_name)
        pool = _pool_of(session, worker)
        os.kill(worker, signal.SIGTERM)  # an idle local warm worker retires; ours takes over
        wait_until(lambda: not (pool / f"{worker}.claim").exists(), timeout=30)
        env = {**session.supervisor_env(), "SHOAL_WARM_POOL_DIR": str(pool),
               "SHOAL_KEEP_ALIVE_SECONDS": "300",
               "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        log = open(tmp_path / "warm.log", "wb")  # noqa: SIM115 - the process's log
        proc = subprocess.Popen([sys.executable, "-c", "import sys; from shoal.session import "
                                 "serve_warm_main; sys.exit(serve_warm_main())"], env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_until(lambda: (pool / f"{proc.pid}.claim").exists(), timeout=60)
            future = e.submit(block)
            wait_until(started.exists, timeout=60)
            assert _worker_pid(session, future.job_name) == proc.pid
            future.cancel()  # STOPPING, then SIGTERM to the supervisor's pid
            wait_until(lambda: session.jobs.get(future.job_name).is_terminal, timeout=30)
            assert session.jobs.get(future.job_name).status == JobStatus.STOPPED
            # That stop was asked for: the worker serves on.
            after = e.submit(pow, 3, 2)
            assert after.result(timeout=60) == 9
            assert _worker_pid(session, after.job_name) == proc.pid
            os.kill(proc.pid, signal.SIGTERM)  # idle: it retires
            assert proc.wait(timeout=30) == 0
            assert not (pool / f"{proc.pid}.claim").exists()
            assert "retires: a stop signal came" in (tmp_path / "warm.log").read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
