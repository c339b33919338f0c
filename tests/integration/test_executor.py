"""RemoteExecutor: a real concurrent.futures.Executor over jobs."""

from __future__ import annotations

import concurrent.futures as cf
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from helpers import wait_until
from shoal import JobFailedError, RemoteExecutor
from shoal.core import JobQuery, JobStatus
from shoal.remote_function import get_future, list_futures


def square(x):
    return x * x


def fail_on_three(x):
    if x == 3:
        raise ValueError("three is right out")
    return x


def test_seed_executor_example(session):
    with RemoteExecutor(instance_type="ml.m5.large", max_parallel_jobs=2) as e:
        futures = [e.submit(square, i) for i in range(4)]
    assert [f.result() for f in futures] == [0, 1, 4, 9]
    assert all(isinstance(f, cf.Future) for f in futures)
    assert len(session.metadata.list_jobs(JobQuery(name_prefix="square-"))) == 4


def test_as_completed_wait_callbacks_and_exception(session):
    seen = []
    done_event = threading.Event()
    with RemoteExecutor(max_parallel_jobs=2) as e:
        futures = [e.submit(fail_on_three, i) for i in range(5)]
        futures[0].add_done_callback(lambda f: (seen.append(f.result()), done_event.set()))
        completed = list(cf.as_completed(futures, timeout=60))
        done, not_done = cf.wait(futures, timeout=60)
    assert set(completed) == set(futures) and not not_done and len(done) == 5
    assert done_event.wait(10) and seen == [0]
    assert isinstance(futures[3].exception(), ValueError)
    assert isinstance(futures[3].exception().__cause__, JobFailedError)
    assert [f.result() for i, f in enumerate(futures) if i != 3] == [0, 1, 2, 4]


def test_map_keeps_input_order_and_consumes_lazily(session):
    consumed = []

    def numbers():
        for i in range(6):
            consumed.append(i)
            yield i

    with RemoteExecutor(max_parallel_jobs=2) as e:
        results = e.map(square, numbers())
        assert len(consumed) < 6  # a window ahead of the results, not everything up front
        assert list(results) == [i * i for i in range(6)]


def test_map_timeout(session, tmp_path):
    gate = tmp_path / "gate"

    def slow(x):
        import time

        while not gate.exists():
            time.sleep(0.05)
        return x

    with RemoteExecutor(max_parallel_jobs=1) as e:
        it = e.map(slow, [1, 2], timeout=0.5)
        with pytest.raises(cf.TimeoutError):
            next(it)
        gate.write_text("open")
        e.shutdown(wait=True, cancel_futures=True)


def test_cancel_stops_a_running_job(session, tmp_path):
    started = tmp_path / "started"

    def wait_forever():
        import time

        started.write_text("x")
        while True:
            time.sleep(0.05)

    with RemoteExecutor() as e:
        future = e.submit(wait_forever)
        wait_until(started.exists, timeout=30)
        assert future.running()
        assert future.cancel() is True
        assert future.cancelled()
        with pytest.raises(cf.CancelledError):
            future.result(timeout=1)
        name = future.job_name
        wait_until(lambda: session.jobs.get(name).is_terminal, timeout=30)
    assert session.jobs.get(name).status == JobStatus.STOPPED


def test_shutdown_cancel_futures_cancels_queued_work(session, tmp_path):
    gate = tmp_path / "gate"

    def blocked():
        import time

        while not gate.exists():
            time.sleep(0.02)
        return "ran"

    e = RemoteExecutor(max_parallel_jobs=1)
    first = e.submit(blocked)
    queued = [e.submit(square, i) for i in range(3)]
    wait_until(first.running, timeout=30)
    e.shutdown(wait=False, cancel_futures=True)
    gate.write_text("open")
    assert first.result(timeout=60) == "ran"
    assert all(f.cancelled() for f in queued)
    with pytest.raises(RuntimeError, match="shutdown"):
        e.submit(square, 1)
    e.shutdown(wait=True)


def test_get_future_and_list_futures_from_another_process(session, tmp_path):
    with RemoteExecutor(max_parallel_jobs=2, job_name_prefix="histo") as e:
        futures = [e.submit(square, i) for i in range(3)]
    names = sorted(f.job_name for f in futures)
    script = textwrap.dedent(f"""
        import shoal
        from shoal.remote_function import get_future, list_futures
        s = shoal.Session(home={str(session.home)!r})
        print(get_future({names[0]!r}, sagemaker_session=s).result())
        print(sorted(f.result() for f in list_futures("histo", sagemaker_session=s)))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split("\n")
    first = get_future(names[0]).result()
    assert out[0] == str(first)
    assert out[1] == "[0, 1, 4]"
    assert sorted(f.result() for f in list_futures("histo")) == [0, 1, 4]


def test_job_outlives_the_client_that_submitted_it(session, tmp_path):
    gate = tmp_path / "gate"
    name_file = tmp_path / "name"
    script = textwrap.dedent(f"""
        import os, pathlib, shoal
        from helpers import wait_until
        from shoal import RemoteExecutor
        s = shoal.Session(home={str(session.home)!r})
        def outlive():
            import pathlib, time
            while not pathlib.Path({str(gate)!r}).exists():
                time.sleep(0.02)
            return "survived"
        e = RemoteExecutor(sagemaker_session=s)
        f = e.submit(outlive)
        wait_until(lambda: f.job_name, timeout=60)
        pathlib.Path({str(name_file)!r}).write_text(f.job_name)
        os._exit(0)  # the client dies without waiting
    """)
    env_path = str(Path(__file__).resolve().parents[1])
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120,
                   env={**__import__("os").environ, "PYTHONPATH": env_path})
    name = name_file.read_text()
    assert not session.jobs.get(name).is_terminal
    gate.write_text("open")
    assert get_future(name).result(timeout=60) == "survived"


def test_bad_max_parallel_jobs(session):
    with pytest.raises(ValueError, match="max_parallel_jobs"):
        RemoteExecutor(max_parallel_jobs=0)


def test_map_iterated_after_the_with_block_still_yields_everything(session):
    with RemoteExecutor(max_parallel_jobs=1) as e:
        results = e.map(square, range(8))  # the window holds 4; the rest comes later
    assert list(results) == [i * i for i in range(8)]


def test_map_timeout_cancels_the_job_it_waited_for(session, tmp_path):
    gate = tmp_path / "gate"

    def slow(x):
        import time

        while not gate.exists():
            time.sleep(0.05)
        return x

    with RemoteExecutor(max_parallel_jobs=1) as e:
        it = e.map(slow, [1], timeout=0.5)
        with pytest.raises(cf.TimeoutError):
            next(it)
        wait_until(lambda: session.metadata.list_jobs(JobQuery(name_prefix="slow-")), timeout=30)
        [record] = session.metadata.list_jobs(JobQuery(name_prefix="slow-"))
        wait_until(lambda: session.jobs.get(record.name).is_terminal, timeout=30)
        assert session.jobs.get(record.name).status == JobStatus.STOPPED
        gate.write_text("open")
