"""The job layer's supervisor mains driven in this process through a WorkerContext (what
``shoal.session`` builds for the entry points backends start): real SQLite and files under
tmp_path, a real persistent executor; the backend is a MemoryBackend, which starts nothing,
so that the test runs the supervisor itself."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

import shoal
from shoal.backends.memory import MemoryBackend
from shoal.core import JobStatus
from shoal.jobs.keys import JOB_SECRETS_VAR, UserKeys
from shoal.jobs.service import JobService
from shoal.remote_function import RemoteOptions


def double(x):
    return 2 * x


@pytest.fixture
def in_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A supervisor in this process takes over its signals and becomes a subreaper: put
    them back afterwards."""
    from shoal.jobs._descendants import become_subreaper

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    for var in ("SHOAL_WARM_POOL_DIR", "SHOAL_KEEP_ALIVE_SECONDS", JOB_SECRETS_VAR):
        monkeypatch.delenv(var, raising=False)
    try:
        yield
    finally:
        signal.set_wakeup_fd(-1)
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        become_subreaper(False)


def test_a_batch_runs_through_the_worker_context(tmp_path, monkeypatch, in_process):
    """The client records a batch (its own JobService, with the user's keys); a second
    session on the same home builds the context, and supervisor_main runs the batch with it:
    every call is its own completed job, with its own result and this supervisor's handle."""
    from shoal.jobs import worker
    from shoal.session import _worker_context

    home = tmp_path / "home"
    client_session = shoal.Session(home=str(home))
    held = MemoryBackend()
    client = JobService(client_session.metadata, client_session.artifacts, held,
                        metrics=client_session.metadata,
                        supervisor_entrypoint="shoal.session:supervisor_main",
                        supervisor_env=client_session.supervisor_env(),
                        keys=UserKeys(client_session.settings.user_secret_path()))
    options = RemoteOptions(keep_alive_period_in_seconds=30)
    specs = [options.build_spec(double, client_session) for _ in range(3)]
    batch = client.submit_batch(specs, double, [((i,), {}) for i in range(3)])
    [launched] = held.launched
    assert launched.entrypoint == "shoal.session:supervisor_main"
    assert launched.args == (launched.job, *batch.names)

    supervisor_session = shoal.Session(home=str(home))
    ctx = _worker_context(supervisor_session)
    assert ctx.home == home and ctx.jobs.keys is not None  # a client's, until it supervises
    monkeypatch.setenv(JOB_SECRETS_VAR, launched.env[JOB_SECRETS_VAR])
    assert worker.supervisor_main(ctx, *launched.args) == 0
    assert ctx.jobs.keys is None  # a supervisor derives no job's key itself

    for i, name in enumerate(batch.names):
        record = client.get(name)
        assert record.status == JobStatus.COMPLETED, record.failure_reason
        assert record.handle["pid"] == os.getpid()
        assert client.outcome(record) == 2 * i
    client_session.close()


def test_a_supervisor_of_the_context_takes_stop_signals_through_its_public_seam(
        tmp_path, in_process):
    """What BatchRun sees of a stop signal: signalled until taken; a warm supervisor that
    was signalled for no job retires later (stop_requested), and says so in its log."""
    from helpers import wait_until
    from shoal.session import _worker_context

    session = shoal.Session(home=str(tmp_path / "home"))
    supervisor = _worker_context(session).supervisor(warm=True)
    assert supervisor.work_root == tmp_path / "home" / "work"
    supervisor.begin(None)
    assert not supervisor.signalled and not supervisor.stop_requested()
    os.kill(os.getpid(), signal.SIGTERM)
    wait_until(lambda: supervisor.signalled, timeout=10)
    os.set_blocking(supervisor.wake_fd, False)
    supervisor.drain_wakeups()
    assert supervisor.take_signal() and not supervisor.take_signal()
    assert not supervisor.stop_requested()
    supervisor.retire_later("no job was asked to stop")
    assert supervisor.stop_requested()
    supervisor.close()
    session.close()
