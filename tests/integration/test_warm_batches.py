"""Batches on warm workers: calls handed over together, each still a real job.

Each test queues calls behind a "gate" call, so that they reach the worker in one hand-over.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import wait_until
from shoal import JobFailedError, JobTimeoutError, RemoteExecutor
from shoal.core import FailureKind, JobQuery, JobStatus
from shoal.errors import PayloadIntegrityError
from shoal.remote_function import get_future
from shoal.serialization import deserialize

S = JobStatus


def square(x):
    return x * x


def shout(i):
    print(f"call {i}")
    return i * i


def fail_on(i):
    if i in (2, 4):
        raise ValueError(str(i))
    return i


def hold(started, gate):
    import pathlib
    import time

    pathlib.Path(started).write_text("x")
    while not pathlib.Path(gate).exists():
        time.sleep(0.01)
    return "gate"


def step(i, where):
    """Call 0 waits for <where>/go; every call leaves <where>/ran-<i>."""
    import pathlib
    import time

    root = pathlib.Path(where)
    (root / f"ran-{i}").write_text("x")
    while i == 0 and not (root / "go").exists():
        time.sleep(0.01)
    return i


def crash_on_two(i):
    import os
    import signal

    if i == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return i


def sleepy(i):
    import time

    if i == 1:
        time.sleep(60)
    return i


def behind_a_gate(e, tmp_path, fn, calls):
    """Submit *calls* while a gate call runs, then open the gate: they wait in the queue and
    reach the worker together."""
    started, gate = tmp_path / "gate-started", tmp_path / "gate-open"
    first = e.submit(hold, str(started), str(gate))
    wait_until(started.exists, timeout=60)
    futures = [e.submit(fn, *args) for args in calls]
    gate.write_text("open")
    assert first.result(timeout=60) == "gate"
    return futures


def _records(session, futures):
    return [session.jobs.get(f.job_name) for f in futures]


def test_batched_calls_are_real_jobs(session, tmp_path):
    with RemoteExecutor(keep_alive_period_in_seconds=30) as e:
        futures = behind_a_gate(e, tmp_path, shout, [(i,) for i in range(8)])
        assert [f.result(timeout=60) for f in futures] == [i * i for i in range(8)]
    records = _records(session, futures)
    assert len({r.spec.batch.id for r in records}) == 1  # one hand-over
    assert len({r.handle["pid"] for r in records}) == 1
    keys = [session.jobs.payload_key(r.name) for r in records]
    assert len(set(keys)) == len(keys)  # each job its own key
    for i, (record, key) in enumerate(zip(records, keys, strict=True)):
        assert record.status is S.COMPLETED and record.spec.batch.index == i
        assert [ev.status for ev in record.events] == [S.PENDING, S.STARTING, S.RUNNING,
                                                       S.COMPLETED]
        times = [ev.at for ev in record.events]
        assert times == sorted(times)
        assert record.created_at <= record.started_at <= record.ended_at
        assert record.attempt == 1 and record.exit_code == 0
        # Its own log, its own signed payloads and result.
        assert session.jobs.read_log(record.name) == f"call {i}\n".encode()
        assert deserialize(session.jobs.get_payload(record.name, "arguments"), key,
                           what="arguments") == ((i,), {})
        function = deserialize(session.jobs.get_payload(record.name, "function"), key,
                               what="function")
        assert function.__name__ == "shout"
        result = session.jobs.get_payload(record.name, "results")
        assert deserialize(result, key, what="result") == i * i
        with pytest.raises(PayloadIntegrityError):
            deserialize(result, keys[(i + 1) % len(keys)], what="result")
        assert get_future(record.name).result(timeout=30) == i * i


def test_batched_jobs_from_another_process_and_the_cli(session, tmp_path):
    with RemoteExecutor(keep_alive_period_in_seconds=30) as e:
        futures = behind_a_gate(e, tmp_path, shout, [(i,) for i in range(4)])
        assert [f.result(timeout=60) for f in futures] == [0, 1, 4, 9]
    name = futures[3].job_name
    assert session.jobs.get(name).spec.batch is not None
    script = textwrap.dedent(f"""
        import shoal
        from shoal.remote_function import get_future
        s = shoal.Session(home={str(session.home)!r})
        print(get_future({name!r}, sagemaker_session=s).result())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.strip() == "9"
    env = {**os.environ, "SHOAL_HOME": str(session.home)}
    cli = [sys.executable, "-m", "shoal.cli", "jobs"]
    described = subprocess.run([*cli, "describe", name], capture_output=True, text=True,
                               timeout=120, env=env, stdin=subprocess.DEVNULL)
    assert described.returncode == 0, described.stderr
    assert name in described.stdout and "completed" in described.stdout
    logs = subprocess.run([*cli, "logs", name], capture_output=True, text=True, timeout=120,
                          env=env, stdin=subprocess.DEVNULL)
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.strip() == "call 3"


def test_a_call_that_raises_fails_only_its_own_job(session, tmp_path):
    with RemoteExecutor(keep_alive_period_in_seconds=30) as e:
        futures = behind_a_gate(e, tmp_path, fail_on, [(i,) for i in range(6)])
        for i, future in enumerate(futures):
            if i in (2, 4):
                error = future.exception(timeout=60)
                assert isinstance(error, ValueError) and str(error) == str(i)
                assert isinstance(error.__cause__, JobFailedError)
                assert future.job_name in str(error.__cause__)
            else:
                assert future.result(timeout=60) == i
    records = _records(session, futures)
    assert len({r.spec.batch.id for r in records}) == 1
    for i, record in enumerate(records):
        if i in (2, 4):
            assert record.status is S.FAILED
            assert record.failure_kind is FailureKind.USER_ERROR
            assert record.failure_reason == f"ValueError: {i}"
            assert b"ValueError" in session.jobs.read_log(record.name)
        else:
            assert record.status is S.COMPLETED


def test_map_raises_the_first_exception_in_input_order(session):
    with RemoteExecutor(max_parallel_jobs=2, keep_alive_period_in_seconds=30) as e:
        seen = []
        with pytest.raises(ValueError) as info:
            for value in e.map(fail_on, range(40)):
                seen.append(value)
        assert str(info.value) == "2" and seen == [0, 1]
        assert list(e.map(square, range(30))) == [i * i for i in range(30)]
    batched = [r for r in session.metadata.list_jobs(JobQuery(name_prefix="square-", limit=100))
               if r.spec.batch is not None]
    assert batched  # calls that waited were handed over together


def test_cancel_of_a_call_that_has_not_started(session, tmp_path):
    with RemoteExecutor(keep_alive_period_in_seconds=30) as e:
        futures = behind_a_gate(e, tmp_path, step, [(i, str(tmp_path)) for i in range(8)])
        wait_until((tmp_path / "ran-0").exists, timeout=60)
        # Call 6 is not with the executor yet: it stops at once. Call 1 already waits in the
        # executor's short queue: it is skipped when its turn comes.
        assert futures[6].cancel() and futures[1].cancel()
        wait_until(lambda: session.jobs.get(futures[6].job_name).status is S.STOPPED,
                   timeout=30)
        assert session.jobs.get(futures[1].job_name).status is S.STOPPING
        (tmp_path / "go").write_text("go")
        assert [futures[i].result(timeout=60) for i in (0, 2, 3, 4, 5, 7)] == [0, 2, 3, 4, 5, 7]
        wait_until(lambda: session.jobs.get(futures[1].job_name).is_terminal, timeout=30)
    records = _records(session, futures)
    assert len({r.spec.batch.id for r in records}) == 1
    for i, record in enumerate(records):
        if i in (1, 6):
            assert futures[i].cancelled()
            assert [ev.status for ev in record.events] == [S.PENDING, S.STOPPING, S.STOPPED]
            assert record.started_at is None
            assert not (tmp_path / f"ran-{i}").exists()  # it never ran
        else:
            assert record.status is S.COMPLETED
    assert len({r.handle["pid"] for r in records}) == 1  # the worker served on


def test_a_killed_worker_leaves_no_job_of_its_batch_unfinished(session, tmp_path):
    with RemoteExecutor(keep_alive_period_in_seconds=30) as e:
        futures = behind_a_gate(e, tmp_path, step, [(i, str(tmp_path)) for i in range(5)])
        wait_until((tmp_path / "ran-0").exists, timeout=60)
        pid = wait_until(lambda: session.jobs.get(futures[0].job_name).handle.get("pid"),
                         timeout=30)
        os.kill(pid, signal.SIGKILL)
        for future in futures:
            with pytest.raises(JobFailedError, match=str(pid)):
                future.result(timeout=60)
        assert e.submit(square, 3).result(timeout=60) == 9  # a new worker
    for record in _records(session, futures):
        assert record.status is S.FAILED
        assert record.failure_kind is FailureKind.SUPERVISOR_LOST
        assert str(pid) in (record.failure_reason or "")
    assert [r.name for r in session.metadata.iter_unfinished()] == []


def test_a_call_that_kills_its_process_fails_only_its_own_job(session, tmp_path):
    with RemoteExecutor(keep_alive_period_in_seconds=30) as e:
        futures = behind_a_gate(e, tmp_path, crash_on_two, [(i,) for i in range(5)])
        with pytest.raises(JobFailedError, match="SIGKILL"):
            futures[2].result(timeout=60)
        assert [futures[i].result(timeout=60) for i in (0, 1, 3, 4)] == [0, 1, 3, 4]
    records = _records(session, futures)
    assert records[2].failure_kind is FailureKind.SIGNAL
    assert len({r.handle["pid"] for r in records}) == 1


def test_a_call_past_its_max_runtime_times_out_alone(session, tmp_path):
    with RemoteExecutor(keep_alive_period_in_seconds=30, max_runtime_in_seconds=1) as e:
        futures = behind_a_gate(e, tmp_path, sleepy, [(i,) for i in range(3)])
        with pytest.raises(JobTimeoutError):
            futures[1].result(timeout=60)
        assert futures[0].result(timeout=60) == 0 and futures[2].result(timeout=60) == 2
    assert session.jobs.get(futures[1].job_name).failure_kind is FailureKind.TIMEOUT


def test_chunksize_bounds_each_hand_over(session):
    with RemoteExecutor(keep_alive_period_in_seconds=30) as e:
        with pytest.raises(ValueError, match="chunksize"):
            e.map(square, [1], chunksize=0)
        assert list(e.map(square, range(6), chunksize=1)) == [i * i for i in range(6)]
        one_by_one = session.metadata.list_jobs(JobQuery(name_prefix="square-", limit=100))
        assert not any(r.spec.batch is not None for r in one_by_one)
        assert list(e.map(square, range(12), chunksize=3)) == [i * i for i in range(12)]
    sizes: dict[str, int] = {}
    for r in session.metadata.list_jobs(JobQuery(name_prefix="square-", limit=100)):
        if r.spec.batch is not None:
            sizes[r.spec.batch.id] = sizes.get(r.spec.batch.id, 0) + 1
    assert sizes and max(sizes.values()) <= 3


def test_without_a_warm_pool_nothing_is_batched(session):
    with RemoteExecutor(max_parallel_jobs=2) as e:
        assert list(e.map(square, range(6))) == [i * i for i in range(6)]
    records = session.metadata.list_jobs(JobQuery(name_prefix="square-", limit=100))
    assert len(records) == 6 and not any(r.spec.batch is not None for r in records)


def test_batch_payloads_are_shared_not_per_job(session, tmp_path):
    with RemoteExecutor(keep_alive_period_in_seconds=30) as e:
        futures = behind_a_gate(e, tmp_path, square, [(i,) for i in range(5)])
        assert [f.result(timeout=60) for f in futures] == [0, 1, 4, 9, 16]
    root = Path(session.artifacts.local_path("x")).parent
    batch = session.jobs.get(futures[0].job_name).spec.batch.id
    assert len(list((root / "_functions").iterdir())) >= 1
    assert (root / "_batches" / batch[:6] / f"{batch}.calls.pkl").exists()
    assert (root / "_batches" / batch[:6] / f"{batch}.outcomes-1.pkl").exists()
    for future in futures:  # nothing written per job for a silent, successful call
        assert not (root / future.job_name).exists()
