"""A cold client waiting for a job on this host is woken by the supervisor when the job ends
(jobs/_wake.py), instead of reading the record every 50 ms: real launcher and supervisor."""

from __future__ import annotations

import threading
from pathlib import Path

import shoal
from helpers import wait_until
from shoal import remote


def test_the_supervisor_wakes_the_waiting_client_when_the_job_ends(session: shoal.Session,
                                                                   tmp_path: Path) -> None:
    go = tmp_path / "go"
    wake_dir = Path(session.home) / "run" / "wake"

    @remote(sagemaker_session=session)
    def held(path: str) -> str:
        import os
        import time

        while not os.path.exists(path):  # the job's own wait for the test's signal
            time.sleep(0.01)
        return "done"

    reads = []
    real_get_job = session.jobs.metadata.get_job

    def counting_get_job(name: str):  # the real store, counted
        reads.append(name)
        return real_get_job(name)

    session.jobs.metadata.get_job = counting_get_job  # type: ignore[method-assign]
    results: list[str] = []
    caller = threading.Thread(target=lambda: results.append(held(str(go))))
    caller.start()
    # The client binds its wake-up socket before its first read of the record...
    wait_until(lambda: any(wake_dir.glob("w-*")), 60, what="the client's wake-up socket")
    # ...and, woken only by the job's end, reads the record rarely meanwhile: let a second
    # of the client's waiting pass (bounded by the reads themselves, no sleep).
    started = len(reads)
    wait_until(lambda: len(reads) >= started + 4, 60, what="a few reads of the record")
    go.touch()
    caller.join(60)
    assert results == ["done"]
    assert not any(wake_dir.glob("w-*"))  # the client closed its socket
