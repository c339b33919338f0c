"""The batch half of the job store contract (many jobs per transaction), on SQLite, on
PostgreSQL and through a real ``shoal server`` (``HttpJobStore``): create_jobs, update_jobs,
set_handles, list_jobs by names."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from setups import SetUp

from helpers import FakeClock, ServerClock
from shoal.core import (
    FailureKind,
    JobChange,
    JobEvent,
    JobName,
    JobQuery,
    JobSpec,
    JobStatus,
    MetadataStore,
)
from shoal.core.jobs import BatchRef
from shoal.core.ports import JobStore
from shoal.errors import AlreadyExistsError, InvalidTransitionError, JobNotFound

S = JobStatus
T0 = datetime(2025, 3, 1, 12, 0, 0, 250000, tzinfo=UTC)




@dataclass
class Ctx:
    store: JobStore
    clock: FakeClock | ServerClock
    t0: datetime  # when the test's store started: T0, or a Moment through the server
    setup: SetUp
    prefix: str  # unique per test: a worker's tests share its PostgreSQL database / server

    def given(self, seconds: float) -> datetime:
        """A time a change is given ``at``, *seconds* after T0 on the fake clock; through
        the server (whose clock is real), as far ahead of now."""
        base = T0 if isinstance(self.clock, FakeClock) else datetime.now(UTC)
        return base + timedelta(seconds=seconds)

    def names(self, n: int, tag: str = "b") -> list[JobName]:
        return [JobName(f"{self.prefix}-{tag}-{i:04d}") for i in range(n)]

    def create(self, n: int, tag: str = "b") -> list[JobName]:
        names = self.names(n, tag)
        self.store.create_jobs([JobSpec(name=n, function_name="m.f") for n in names],
                               key_salts=[f"salt-{n}" for n in names], backend="local")
        return names



@pytest.fixture
def ctx(metadata: SetUp) -> Ctx:
    return Ctx(metadata.store, metadata.clock, metadata.t0, metadata, metadata.prefix)


def test_the_store_declares_the_batch_methods(ctx: Ctx) -> None:
    assert isinstance(ctx.store, JobStore)
    assert isinstance(ctx.store, MetadataStore) is not ctx.setup.through_server
    for method in ("create_jobs", "update_jobs", "set_handles", "get_job_key_salt"):
        assert callable(getattr(ctx.store, method))


# --- create_jobs --------------------------------------------------------------------------

def test_create_jobs_records_each_job_as_create_job_does(ctx: Ctx) -> None:
    names = ctx.names(3)
    specs = [JobSpec(name=n, function_name="m.f", batch=BatchRef("b1", i))
             for i, n in enumerate(names)]
    created = ctx.store.create_jobs(specs, key_salts=["k0", "k1", "k2"], backend="local")
    assert [r.name for r in created] == names
    for record, spec in zip(created, specs, strict=True):
        assert record.spec == spec and record.status is S.PENDING
        assert record.created_at == ctx.t0 and record.updated_at == record.created_at
        assert record.events == (JobEvent(S.PENDING, ctx.t0),)
        assert ctx.store.get_job(record.name) == record
    assert ctx.store.get_job_key_salt(names[2]) == "k2"


def test_create_jobs_is_all_or_nothing(ctx: Ctx) -> None:
    [taken] = ctx.create(1, "taken")
    fresh = ctx.names(2, "fresh")
    with pytest.raises(AlreadyExistsError) as info:
        ctx.store.create_jobs([JobSpec(name=fresh[0]), JobSpec(name=taken),
                               JobSpec(name=fresh[1])], key_salts=["a", "b", "c"], backend="local")
    assert info.value.details["jobs"] == [taken] and taken in str(info.value)
    assert all(ctx.store.find_job(n) is None for n in fresh)
    assert ctx.store.get_job_key_salt(taken) == f"salt-{taken}"


def test_create_jobs_refuses_a_name_twice_in_one_batch(ctx: Ctx) -> None:
    [name] = ctx.names(1)
    with pytest.raises(AlreadyExistsError) as info:
        ctx.store.create_jobs([JobSpec(name=name), JobSpec(name=name)], key_salts=["a", "b"],
                              backend="local")
    assert info.value.details["jobs"] == [name]
    assert ctx.store.find_job(name) is None


def test_create_jobs_of_nothing(ctx: Ctx) -> None:
    assert ctx.store.create_jobs([], key_salts=[], backend="local") == []


# --- update_jobs --------------------------------------------------------------------------

def test_update_jobs_records_each_move_with_its_own_time(ctx: Ctx) -> None:
    ok, bad = ctx.create(2)
    t1, t2, t3 = ctx.given(1), ctx.given(2), ctx.given(5)
    ctx.clock.advance(10)  # the moves happened before they are recorded
    applied = ctx.store.update_jobs([
        JobChange(ok, S.STARTING, expected=S.PENDING, at=t1, attempt=1),
        JobChange(bad, S.STARTING, expected=S.PENDING, at=t1, attempt=1),
        JobChange(ok, S.RUNNING, expected=S.STARTING, at=t2, env_setup_seconds=0.5),
        JobChange(bad, S.RUNNING, expected=S.STARTING, at=t2),
        JobChange(ok, S.COMPLETED, at=t3, exit_code=0),
        JobChange(bad, S.FAILED, at=t3, exit_code=1, failure_kind=FailureKind.USER_ERROR,
                  reason="ValueError: no"),
    ])
    assert applied == [True] * 6
    done = ctx.store.get_job(ok)
    assert done.status is S.COMPLETED and done.attempt == 1 and done.exit_code == 0
    assert (done.started_at, done.ended_at, done.updated_at) == (t2, t3, t3)
    assert done.env_setup_seconds == 0.5 and done.failure_kind is None
    assert done.events == (JobEvent(S.PENDING, ctx.t0), JobEvent(S.STARTING, t1),
                           JobEvent(S.RUNNING, t2), JobEvent(S.COMPLETED, t3))
    failed = ctx.store.get_job(bad)
    assert failed.status is S.FAILED and failed.failure_kind is FailureKind.USER_ERROR
    assert failed.failure_reason == "ValueError: no" and failed.exit_code == 1
    assert failed.events[-1] == JobEvent(S.FAILED, t3, "ValueError: no")


def test_update_jobs_without_times_uses_the_clock(ctx: Ctx) -> None:
    [name] = ctx.create(1)
    now = ctx.clock.advance(3)
    assert ctx.store.update_jobs([JobChange(name, S.STOPPING, reason="asked"),
                                  JobChange(name, S.STOPPED)]) == [True, True]
    record = ctx.store.get_job(name)
    assert record.ended_at == now and record.started_at is None
    assert record.events[1:] == (JobEvent(S.STOPPING, now, "asked"), JobEvent(S.STOPPED, now))


def test_update_jobs_refuses_what_the_status_does_not_allow_and_applies_the_rest(ctx: Ctx) -> None:
    stopping, ended, pending = ctx.create(3)
    ctx.store.update_job(stopping, status=S.STOPPING, reason="stop requested")
    ctx.store.update_job(ended, status=S.FAILED, reason="reaped")
    before = ctx.store.get_job(ended)
    applied = ctx.store.update_jobs([
        JobChange(stopping, S.STARTING, expected=S.PENDING),   # a stop came first
        JobChange(stopping, S.RUNNING, expected=S.STARTING),
        JobChange(stopping, S.COMPLETED, exit_code=0),          # stopping -> completed is allowed
        JobChange(ended, S.COMPLETED),                          # an ended job never changes
        JobChange(pending, S.RUNNING),                          # pending -> running is not a move
        JobChange(pending, S.PENDING),                          # nor is staying where it is
    ])
    assert applied == [False, False, True, False, False, False]
    assert ctx.store.get_job(stopping).status is S.COMPLETED
    assert [e.status for e in ctx.store.get_job(stopping).events] == [S.PENDING, S.STOPPING,
                                                                      S.COMPLETED]
    assert ctx.store.get_job(ended) == before
    assert ctx.store.get_job(pending).status is S.PENDING
    assert len(ctx.store.get_job(pending).events) == 1


def test_update_jobs_never_moves_a_job_back_in_time(ctx: Ctx) -> None:
    [name] = ctx.create(1)
    later = ctx.clock.advance(5)
    ctx.store.update_job(name, status=S.STOPPING)
    ctx.store.update_jobs([JobChange(name, S.STOPPED, at=ctx.t0 - timedelta(seconds=1))])
    record = ctx.store.get_job(name)
    assert record.ended_at == later and record.updated_at == record.ended_at
    assert [e.at for e in record.events] == [ctx.t0, later, later]
    assert record.events[1].at == record.events[2].at


def test_update_jobs_on_a_missing_job_changes_nothing(ctx: Ctx) -> None:
    [name] = ctx.create(1)
    with pytest.raises(JobNotFound):
        ctx.store.update_jobs([JobChange(name, S.STARTING),
                               JobChange(JobName(f"{ctx.prefix}-missing"), S.STARTING)])
    assert ctx.store.get_job(name).status is S.PENDING


def test_update_jobs_and_a_stop_racing_never_lose_a_move(ctx: Ctx) -> None:
    names = ctx.create(40)
    ctx.store.update_jobs([JobChange(n, s) for n in names for s in (S.STARTING, S.RUNNING)])
    barrier = threading.Barrier(2)

    def finish() -> list[bool]:
        barrier.wait(timeout=30)
        return ctx.store.update_jobs([JobChange(n, S.COMPLETED, exit_code=0) for n in names])

    def stop() -> list[str]:
        barrier.wait(timeout=30)
        lost = []
        for n in names:
            try:
                ctx.store.update_job(n, status=S.STOPPING, expected=S.RUNNING)
            except InvalidTransitionError:
                lost.append(n)
        return lost

    with ThreadPoolExecutor(2) as pool:
        finished, stopped = pool.submit(finish), pool.submit(stop)
        assert finished.result(timeout=60) == [True] * len(names)
        lost = stopped.result(timeout=60)
    for n in names:
        record = ctx.store.get_job(n)
        assert record.status is S.COMPLETED
        moves = [e.status for e in record.events]
        assert moves[-1] is S.COMPLETED
        assert (S.STOPPING in moves) == (n not in lost)


# --- handles, secrets, lookups ------------------------------------------------------------

def test_set_handles_tells_each_status_and_leaves_ended_jobs_alone(ctx: Ctx) -> None:
    live, stopping, ended = ctx.create(3)
    ctx.store.update_job(stopping, status=S.STOPPING)
    ctx.store.update_job(ended, status=S.STOPPED)
    handle = {"backend": "local", "pid": 42, "host": "box", "start_ticks": 7}
    statuses = ctx.store.set_handles([live, stopping, ended], handle)
    assert statuses == {live: S.PENDING, stopping: S.STOPPING, ended: S.STOPPED}
    assert dict(ctx.store.get_job(live).handle) == handle
    assert dict(ctx.store.get_job(stopping).handle) == handle
    assert dict(ctx.store.get_job(ended).handle) == {}
    assert len(ctx.store.get_job(live).events) == 1  # a handle is not a transition
    with pytest.raises(JobNotFound):
        ctx.store.set_handles([live, JobName(f"{ctx.prefix}-missing")], handle)


def test_list_jobs_by_names(ctx: Ctx) -> None:
    a, b, c = ctx.create(3)
    ctx.store.update_job(b, status=S.STOPPING)
    assert sorted(r.name for r in ctx.store.list_jobs(JobQuery(names=[a, b]))) == [a, b]
    assert [r.name for r in ctx.store.list_jobs(
        JobQuery(names=[a, b, c], statuses=[S.STOPPING]))] == [b]


def test_batches_larger_than_one_statement(ctx: Ctx) -> None:
    names = ctx.create(1203)  # more names than one IN list holds
    assert set(ctx.store.set_handles(names, {"pid": 1}).values()) == {S.PENDING}
    assert ctx.store.update_jobs([JobChange(n, S.STOPPED) for n in names]) == [True] * len(names)
    stopped = ctx.store.list_jobs(JobQuery(name_prefix=ctx.prefix, statuses=[S.STOPPED],
                                           limit=5000))
    assert len(stopped) == len(names)
