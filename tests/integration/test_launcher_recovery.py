"""The local launcher (fork server): it dies, the next call starts one new launcher; several
first calls at once start exactly one (issue #15, item 5)."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import shoal
from helpers import wait_until
from shoal import RemoteExecutor, remote
from shoal.backends.procfs import process_state
from shoal.core import JobStatus


def launchers(sock: str) -> list[int]:
    """Processes listening on *sock* (or on the name it binds first): the launchers. Its
    forked supervisors share its command line but close its socket, so they do not count."""
    inodes = set()
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        listening = int(fields[3], 16) & 0x10000  # __SO_ACCEPTCON
        if len(fields) >= 8 and fields[7] in (sock, sock + ".tmp") and listening:
            inodes.add(f"socket:[{fields[6]}]")
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
            links = {os.readlink(f"/proc/{entry}/fd/{fd}") for fd in fds}
        except OSError:
            continue
        if links & inodes:
            found.append(int(entry))
    return found


def gone(pid: int) -> bool:
    return process_state(pid) in (None, "Z", "X")


def test_the_launcher_killed_mid_job_the_job_finishes_and_the_next_call_starts_one(
        session, tmp_path):
    gate = tmp_path / "gate"

    def wait_for_gate():
        import time

        while not gate.exists():
            time.sleep(0.02)
        return "finished"

    @remote
    def plus_one(x):
        return x + 1

    backend = session.backend
    sock = backend.launcher_socket_path()
    with RemoteExecutor() as e:
        future = e.submit(wait_for_gate)
        wait_until(lambda: future.job_name and
                   session.jobs.get(future.job_name).status == JobStatus.RUNNING, 120,
                   what="the job running")
        [launcher] = launchers(sock)
        os.kill(launcher, signal.SIGKILL)
        wait_until(lambda: gone(launcher), 30, what="the launcher gone")
        gate.write_text("open")
        assert future.result(timeout=120) == "finished"
    assert plus_one(41) == 42  # the next call starts a new launcher
    assert plus_one(1) == 2   # ...and the one after it uses that launcher
    [new] = launchers(sock)
    assert new != launcher
    log = (session.home / "run" / "launcher.log").read_text(errors="replace")
    assert "Traceback" not in log, log


def test_concurrent_first_calls_start_exactly_one_launcher(tmp_path):
    """Several sessions of one home call at once, after the last launcher was killed -9 (its
    socket file left behind): all calls succeed and one launcher serves them all."""
    home = tmp_path / "home"
    first = shoal.Session(home=str(home), launcher_idle_seconds=60)
    sessions = [first] + [shoal.Session(home=str(home), launcher_idle_seconds=60)
                          for _ in range(4)]
    try:
        def double(x):
            return 2 * x

        assert remote(double, sagemaker_session=first)(1) == 2
        sock = first.backend.launcher_socket_path()
        [old] = launchers(sock)
        os.kill(old, signal.SIGKILL)
        wait_until(lambda: gone(old), 30, what="the launcher gone")
        assert os.path.exists(sock)  # the dead launcher's socket stays behind

        barrier = threading.Barrier(len(sessions))
        results: dict[int, object] = {}

        def call(i: int, s: shoal.Session) -> None:
            f = remote(double, sagemaker_session=s)
            barrier.wait(timeout=60)
            try:
                results[i] = f(i)
            except Exception as e:  # reported by the assertion below
                results[i] = e

        threads = [threading.Thread(target=call, args=(i, s)) for i, s in enumerate(sessions)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert results == {i: 2 * i for i in range(len(sessions))}
        assert len(launchers(sock)) == 1
        log = (home / "run" / "launcher.log").read_text(errors="replace")
        assert "Traceback" not in log, log
    finally:
        first.backend.shutdown_launcher()
        for s in sessions:
            s.close()
