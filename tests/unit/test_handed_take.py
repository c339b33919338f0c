"""A batch handed to a warm worker with its take, and recorded by its claimer
(``backends/_warm.py``: what a team server does for a worker of its local backend), over a
real worker endpoint and a real claim on Unix sockets; and key leases
(``core/leases.py``), by which a team server's client derives its new jobs' secrets.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from shoal.backends._warm import WarmEndpoint, claim_worker, take_request
from shoal.backends.rundir import private_socket_dir
from shoal.core.jobs import JobName, JobRecord, JobSpec, JobStatus
from shoal.core.leases import LEASE_PREFIX, lease_of, lease_secret, leased_job_secret, leased_salt
from shoal.core.ports import HandedTake
from shoal.serialization.keys import job_secret


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Path]:
    path = private_socket_dir() / "test-handed-take" / tmp_path.name
    path.mkdir(parents=True, exist_ok=True)
    yield path
    for f in path.iterdir():
        f.unlink()
    path.rmdir()


def _record() -> JobRecord:
    at = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
    return JobRecord(name=JobName("f-1"), spec=JobSpec(name=JobName("f-1"), function_name="m.f",
                                                       environment_variables={"A": "1"}),
                     status=JobStatus.PENDING, created_at=at, updated_at=at, owner="ada")


class _Worker:
    """A real ``WarmEndpoint`` taking one job on a thread; what it got is kept."""

    def __init__(self, pool: Path) -> None:
        self.endpoint = WarmEndpoint(pool).open()
        self.request = None
        self.statuses = None
        self.recorded: list = []
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.request = self.endpoint.next_job(30.0)
        if self.request is not None and self.request.take is not None:  # as BatchRun does
            self.statuses = self.endpoint.take_statuses(30.0)
        self.ready.set()
        if self.statuses is not None:
            self.recorded.append(self.endpoint.record(
                [{"name": "f-1", "status": "completed"}], {"_batches/b/b.out": b"result"}))
            self.recorded.append(self.endpoint.record([{"name": "f-1", "status": "failed"}], {}))
        self.endpoint.job_done()

    def close(self) -> None:
        self.thread.join(timeout=30)
        self.endpoint.close()


def test_a_handed_take_reaches_the_worker_and_its_changes_come_back_to_the_claimer(pool):
    worker = _Worker(pool)
    take = HandedTake(_record(), b"\x00calls\xff" * 1000)
    claim = claim_worker(pool, {"job": "b", "env": {}, "batch": ["f-1"],
                                "take": take_request(take)})
    try:
        assert claim is not None and claim.takes_inline
        assert claim.worker_handle["pid"] == os.getpid()
        claim.give_statuses({"f-1": JobStatus.PENDING}, claim.worker_handle)
        assert worker.ready.wait(30)
        assert worker.request is not None and worker.request.take == take  # record and bytes
        assert worker.statuses == ({"f-1": JobStatus.PENDING}, claim.worker_handle)
        # The worker's first change and its file come to the claimer, which records them.
        message, data = claim.read(30.0)
        assert message["record"] == [{"name": "f-1", "status": "completed"}]
        assert message["files"] == [["_batches/b/b.out", 6]] and data == b"result"
        claim.answer({"applied": [True]})
        # A refusal: the worker hears None (and records through its stores instead).
        message, data = claim.read(30.0)
        assert message["record"] == [{"name": "f-1", "status": "failed"}] and data == b""
        claim.answer({"error": {"code": "PERMISSION_DENIED", "message": "not yours"}})
        assert claim.read(30.0) == ({"done": True}, b"")
    finally:
        if claim is not None:
            claim.close()
        worker.close()
    assert worker.recorded == [[True], None]


def test_a_claimer_that_records_no_handle_runs_nothing(pool):
    worker = _Worker(pool)
    claim = claim_worker(pool, {"job": "b", "env": {}, "batch": ["f-1"],
                                "take": take_request(HandedTake(_record(), b"c"))})
    try:
        assert claim is not None and claim.takes_inline
        claim.give_statuses(None, claim.worker_handle, why="the store is away")
        assert worker.ready.wait(30)
        assert worker.statuses is None and worker.recorded == []
        assert claim.read(30.0) == ({"done": True}, b"")
    finally:
        claim.close()
        worker.close()


def test_a_hand_over_without_a_take_is_taken_as_before(pool):
    worker = _Worker(pool)
    claim = claim_worker(pool, {"job": "b", "env": {}, "batch": ["f-1"]})
    try:
        assert claim is not None and not claim.takes_inline
        with pytest.raises(RuntimeError, match="not handed a take"):
            claim.give_statuses({}, claim.worker_handle)
        assert worker.ready.wait(30)
        assert worker.request is not None and worker.request.take is None
        assert worker.statuses is None and worker.recorded == []
    finally:
        claim.close()
        worker.close()


def test_a_job_record_travels_as_json_unchanged():
    record = _record()
    assert JobRecord.from_json(record.to_json()) == record


USER = bytes(range(32))


def test_a_leased_jobs_secret_is_the_one_the_server_derives():
    lease = "ab" * 16
    salt = leased_salt(lease)
    assert salt.startswith(f"{LEASE_PREFIX}{lease}.") and lease_of(salt) == lease
    mine = leased_job_secret(lease_secret(USER, lease), "f-1", salt)
    assert mine == job_secret(USER, "f-1", salt)  # what POST /keys/job-secret answers
    assert mine != job_secret(USER, "f-2", salt)
    other = "cd" * 16  # another lease's secret derives nothing of this one's jobs
    assert leased_job_secret(lease_secret(USER, other), "f-1", salt) != mine
    assert job_secret(bytes(32), "f-1", salt) != mine  # nor another user's secret


@pytest.mark.parametrize("salt", ["lease.", "lease.XYZ.1", "lease.ab", "lease..1",
                                  "0123abcd", "lease.ab.", ""])
def test_a_salt_that_names_no_lease_is_derived_as_any_other(salt):
    assert lease_of(salt) is None
    if salt:
        assert len(job_secret(USER, "f-1", salt)) == 64
    with pytest.raises(ValueError):
        lease_secret(USER, "not hex!")


def test_the_server_records_a_workers_changes_on_its_job_tokens_terms(tmp_path):
    """``ServerJobs.record_for`` (the claim's recorder): the batch's own jobs only, files
    only where its job token writes, nothing once its jobs have ended; errors come back as
    the answer, so the worker records through its stores instead (whose answer counts)."""
    pytest.importorskip("fastapi")
    from shoal.core.ports import JobQuery
    from shoal.server._launches import ServerJobs
    from shoal.server._signals import Signals
    from shoal.session import Session

    session = Session(home=str(tmp_path / "home"))
    try:
        jobs = ServerJobs(session, "http://127.0.0.1:1", Signals())
        names = ["f-1", "f-2", "g-1"]
        session.metadata.create_jobs([JobSpec(name=JobName(n), function_name="m.f")
                                      for n in names], key_salts=["s"] * 3, backend="local",
                                     owner="ada")
        token = jobs.tokens.verify(jobs.tokens.mint("ada", ["f-1", "f-2"], "b1"))

        def record(changes, files=()):
            data = b"".join(d for _, d in files)
            return jobs.record_for(token, {"record": changes,
                                           "files": [[k, len(d)] for k, d in files]}, data)

        other = record([{"name": "g-1", "status": "starting"}])
        assert other["error"]["code"] == "PERMISSION_DENIED" and "g-1" in \
            other["error"]["message"]
        outside = record([{"name": "f-1", "status": "starting"}], [("g-1/x", b"1")])
        assert outside["error"]["code"] == "PERMISSION_DENIED" and "g-1/x" in \
            outside["error"]["message"]
        bad = record([{"name": "f-1", "status": "no such status"}])
        assert bad["error"]["code"] == "INVALID_ARGUMENT"
        assert record([{"name": "f-1", "status": "starting", "expected": "pending"},
                       {"name": "f-1", "status": "running", "expected": "starting"},
                       {"name": "f-1", "status": "completed", "expected": "running"},
                       {"name": "f-2", "status": "failed", "expected": "starting"}],
                      [("f-1/results/payload.pkl", b"ok")]) == {"applied": [True] * 3 + [False]}
        assert session.artifacts.get_bytes("f-1/results/payload.pkl") == b"ok"
        assert record([{"name": "f-2", "status": "stopped"}]) == {"applied": [True]}
        # Both jobs have ended: the token writes nothing more.
        ended = record([{"name": "f-1", "status": "failed"}], [("f-1/late", b"x")])
        assert ended["error"]["code"] == "PERMISSION_DENIED" and "ended" in \
            ended["error"]["message"]
        assert not session.artifacts.exists("f-1/late")
        statuses = {r.name: r.status for r in session.metadata.list_jobs(JobQuery(names=names))}
        assert statuses == {"f-1": "completed", "f-2": "stopped", "g-1": "pending"}
    finally:
        session.close()
