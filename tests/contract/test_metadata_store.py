"""The job half of the metadata store contract (``JobStore``), on SQLite, on PostgreSQL,
and through a real ``shoal server`` process (``HttpJobStore`` over HTTP); then the SQL
store's own matters (schema, processes, URLs)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from setups import SetUp

from helpers import FakeClock, ServerClock, fresh_postgres_database
from shoal.core import (
    FailureKind,
    JobEvent,
    JobName,
    JobQuery,
    JobRecord,
    JobSort,
    JobSpec,
    JobStatus,
    MetadataStore,
)
from shoal.core.ports import JobStore
from shoal.errors import (
    AlreadyExistsError,
    InvalidTransitionError,
    JobNotFound,
    MetadataStoreError,
    SchemaOutOfDateError,
)
from shoal.storage.sql import SCHEMA_REVISION, SqlMetadataStore, upgrade_schema

S = JobStatus
T0 = datetime(2025, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)




@dataclass
class Ctx:
    store: JobStore
    clock: FakeClock | ServerClock
    t0: datetime  # when the test's store started: T0, or a Moment through the server
    setup: SetUp
    prefix: str  # unique per test: the PostgreSQL database is shared by a worker's tests

    def name(self, suffix: str = "") -> JobName:
        return JobName(f"{self.prefix}-{suffix or uuid.uuid4().hex[:8]}")

    def create(self, suffix: str = "", **spec: object) -> JobName:
        name = self.name(suffix)
        self.store.create_job(JobSpec(name=name, **spec), key_salt=f"salt-{name}",  # type: ignore[arg-type]
                              backend="local")
        return name

    def mine(self, **query: object) -> list[str]:
        query.setdefault("limit", 10_000)
        q = JobQuery(name_prefix=self.prefix + "-", **query)  # type: ignore[arg-type]
        return [r.name for r in self.store.list_jobs(q)]


def _sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'meta' / 'shoal.db'}"



@pytest.fixture
def ctx(metadata: SetUp) -> Ctx:
    return Ctx(metadata.store, metadata.clock, metadata.t0, metadata, metadata.prefix)


# --- create / get / find ------------------------------------------------------------------

def test_is_a_job_store(ctx: Ctx) -> None:
    assert isinstance(ctx.store, JobStore)
    assert isinstance(ctx.store, MetadataStore) is not ctx.setup.through_server


def test_create_get_find(ctx: Ctx) -> None:
    name = ctx.name("a")
    spec = JobSpec(name=name, function_name="mod:f", instance_type="ml.m5.large", cpus=2.0,
                   environment_variables={"A": "1"}, tags=(("team", "ml"),),
                   inert_settings={"RoleArn": "arn:x"}, python_version="3.11")
    created = ctx.store.create_job(spec, key_salt="s4lt", backend="local")
    assert created.name == name
    assert created.spec == spec
    assert created.status is S.PENDING
    assert created.created_at == ctx.t0 and created.updated_at == created.created_at
    assert created.started_at is None and created.ended_at is None
    assert created.backend == "local"
    assert created.attempt == 0 and dict(created.handle) == {}
    assert created.failure_kind is None and created.failure_reason is None
    assert created.events == (JobEvent(S.PENDING, ctx.t0, None),)
    assert ctx.store.get_job(name) == created
    assert ctx.store.find_job(name) == created
    assert ctx.store.find_job(ctx.name("missing")) is None


def test_duplicate_name(ctx: Ctx) -> None:
    name = ctx.create("dup")
    with pytest.raises(AlreadyExistsError) as info:
        ctx.store.create_job(JobSpec(name=name), key_salt="x", backend="local")
    assert name in str(info.value) and info.value.details["job"] == name
    assert ctx.store.get_job_key_salt(name) == f"salt-{name}"


def test_get_missing(ctx: Ctx) -> None:
    missing = ctx.name("missing")
    with pytest.raises(JobNotFound) as info:
        ctx.store.get_job(missing)
    assert missing in str(info.value)
    with pytest.raises(JobNotFound):
        ctx.store.get_job_key_salt(missing)
    with pytest.raises(JobNotFound):
        ctx.store.update_job(missing, status=S.STARTING)
    with pytest.raises(JobNotFound):
        ctx.store.set_handle(missing, {"pid": 1})


def test_get_job_key_salt(ctx: Ctx) -> None:
    a, b = ctx.create("a"), ctx.create("b")
    assert ctx.store.get_job_key_salt(a) == f"salt-{a}"
    assert ctx.store.get_job_key_salt(b) == f"salt-{b}"


# --- small payloads (revision 0005) -------------------------------------------------------

def test_job_payloads_round_trip_byte_for_byte_and_replace(ctx: Ctx) -> None:
    a, b = ctx.create("a"), ctx.create("b")
    every_byte = bytes(range(256)) * 3  # a pickle is binary: NUL and high bytes included
    ctx.store.put_job_payloads(a, {"function": (every_byte, b'{"m": 1}'),
                                   "arguments": (b"", b'{"m": 2}')})
    assert ctx.store.get_job_payload(a, "function") == (every_byte, b'{"m": 1}')
    assert ctx.store.get_job_payload(a, "arguments") == (b"", b'{"m": 2}')
    assert ctx.store.get_job_payload(a, "results") is None
    assert ctx.store.get_job_payload(b, "function") is None  # another job's are its own
    ctx.store.put_job_payloads(a, {"function": (b"new", b"{}")})  # replaced, not added
    assert ctx.store.get_job_payload(a, "function") == (b"new", b"{}")
    assert ctx.store.job_payload_bytes(a) == len(b"new{}") + len(b'{"m": 2}')
    assert ctx.store.job_payload_bytes(b) == 0


def test_job_payloads_of_an_unknown_job_are_refused_naming_it(ctx: Ctx) -> None:
    missing = ctx.name("missing")
    with pytest.raises(JobNotFound, match=missing):
        ctx.store.put_job_payloads(missing, {"results": (b"x", b"{}")})
    assert ctx.store.get_job_payload(missing, "results") is None


def test_job_payloads_go_with_their_job_record(ctx: Ctx) -> None:
    """Deleting a job's record deletes its payload rows (ON DELETE CASCADE): what removes
    the record removes the payloads, as a prefix delete removes its files."""
    a, b = ctx.create("a"), ctx.create("b")
    for name in (a, b):
        ctx.store.put_job_payloads(name, {"results": (b"r", b"{}")})
    engine = sa.create_engine(ctx.setup.sql_url())
    try:
        with engine.begin() as conn:
            if engine.dialect.name == "sqlite":
                conn.exec_driver_sql("PRAGMA foreign_keys=ON")
            conn.execute(sa.text("DELETE FROM job_events WHERE job_name = :n"), {"n": a})
            conn.execute(sa.text("DELETE FROM jobs WHERE name = :n"), {"n": a})
    finally:
        engine.dispose()
    assert ctx.store.get_job_payload(a, "results") is None
    assert ctx.store.get_job_payload(b, "results") == (b"r", b"{}")


def test_a_job_stored_with_the_old_extra_mapping_loads_into_the_typed_fields(ctx: Ctx) -> None:
    """A row written before JobSpec had typed parts (``"extra": {"training": ...}``) reads
    back into them, from get_job and list_jobs (issue #18, item 3)."""
    import json

    from helpers import old_shape_spec

    name = ctx.create("old")
    engine = sa.create_engine(ctx.setup.sql_url())
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE jobs SET spec = :s WHERE name = :n"),
                         {"s": json.dumps(old_shape_spec(name)), "n": name})
    finally:
        engine.dispose()
    for record in (ctx.store.get_job(name), *ctx.store.list_jobs(JobQuery(names=(name,)))):
        spec = record.spec
        assert spec.training is not None and spec.training.entry_point == "train.py"
        assert spec.training.channels["train"]["uri"] == "file:///data"
        assert spec.training.checkpoint_s3_uri == "file:///ck"
        assert spec.distribution is not None and spec.distribution.world == 2
        assert spec.run is not None and spec.run.run_name == "r1"
        assert spec.batch is not None and spec.batch.id == "b7"
        assert spec.keep_alive_period_in_seconds == 30.0


# --- update_job ---------------------------------------------------------------------------

def test_lifecycle_timestamps_and_events(ctx: Ctx) -> None:
    name = ctx.create("life")
    t1 = ctx.clock.advance(1.5)
    rec = ctx.store.update_job(name, status=S.STARTING, expected=S.PENDING, reason="launched")
    assert rec.status is S.STARTING and rec.updated_at == t1 and rec.started_at is None
    t2 = ctx.clock.advance(2)
    rec = ctx.store.update_job(name, status=S.RUNNING, expected=S.STARTING)
    assert rec.started_at == t2 and rec.ended_at is None and not rec.is_terminal
    t3 = ctx.clock.advance(10.25)
    rec = ctx.store.update_job(name, status=S.COMPLETED, expected=S.RUNNING, exit_code=0)
    assert rec.status is S.COMPLETED and rec.is_terminal
    assert (rec.created_at, rec.started_at, rec.ended_at, rec.updated_at) == (ctx.t0, t2, t3, t3)
    assert rec.ended_at == rec.updated_at and rec.started_at is not None
    if isinstance(ctx.clock, FakeClock):
        assert rec.duration_seconds == pytest.approx(10.25)
    else:
        assert rec.duration_seconds is not None and rec.duration_seconds > 0
    assert rec.exit_code == 0 and rec.failure_kind is None and rec.failure_reason is None
    assert rec.events == (JobEvent(S.PENDING, ctx.t0), JobEvent(S.STARTING, t1, "launched"),
                          JobEvent(S.RUNNING, t2), JobEvent(S.COMPLETED, t3))
    assert ctx.store.get_job(name) == rec


def test_retry_keeps_the_first_start(ctx: Ctx) -> None:
    name = ctx.create("retry")
    ctx.store.update_job(name, status=S.STARTING)
    t_run = ctx.clock.advance()
    ctx.store.update_job(name, status=S.RUNNING)
    ctx.clock.advance()
    ctx.store.update_job(name, status=S.PENDING, reason="retrying", attempt=1)
    ctx.store.update_job(name, status=S.STARTING)
    ctx.clock.advance()
    rec = ctx.store.update_job(name, status=S.RUNNING)
    assert rec.started_at == t_run and rec.attempt == 1
    assert [e.status for e in rec.events] == [S.PENDING, S.STARTING, S.RUNNING, S.PENDING,
                                              S.STARTING, S.RUNNING]


def test_stop_path(ctx: Ctx) -> None:
    name = ctx.create("stop")
    ctx.store.update_job(name, status=S.STOPPING, reason="user asked")
    t = ctx.clock.advance()
    rec = ctx.store.update_job(name, status=S.STOPPED)
    assert rec.ended_at == t and rec.started_at is None and rec.duration_seconds is None


@pytest.mark.parametrize(("path", "bad"), [
    ((), S.COMPLETED),
    ((), S.RUNNING),
    ((S.STARTING, S.RUNNING, S.COMPLETED), S.RUNNING),
    ((S.FAILED,), S.PENDING),
    ((S.STOPPED,), S.FAILED),
])
def test_forbidden_transition(ctx: Ctx, path: tuple[JobStatus, ...], bad: JobStatus) -> None:
    name = ctx.create("bad")
    for status in path:
        ctx.clock.advance()
        ctx.store.update_job(name, status=status)
    before = ctx.store.get_job(name)
    ctx.clock.advance()
    with pytest.raises(InvalidTransitionError) as info:
        ctx.store.update_job(name, status=bad)
    assert name in str(info.value)
    assert ctx.store.get_job(name) == before


def test_expected_status_mismatch(ctx: Ctx) -> None:
    name = ctx.create("cas")
    before = ctx.store.get_job(name)
    with pytest.raises(InvalidTransitionError) as info:
        ctx.store.update_job(name, status=S.RUNNING, expected=S.STARTING)
    assert info.value.details == {"job": name, "current": "pending", "new": "running"}
    # even though pending -> failed is allowed, a stale expectation must not apply it
    with pytest.raises(InvalidTransitionError):
        ctx.store.update_job(name, status=S.FAILED, expected=S.RUNNING)
    assert ctx.store.get_job(name) == before


def test_expected_attempt_mismatch_changes_nothing_and_want_record_false_returns_none(
        ctx: Ctx) -> None:
    name = ctx.create("attempt")
    ctx.store.update_job(name, status=S.STARTING, attempt=1)
    before = ctx.store.get_job(name)
    with pytest.raises(InvalidTransitionError, match="attempt 1") as info:
        ctx.store.update_job(name, status=S.RUNNING, expected=S.STARTING, expected_attempt=0)
    assert name in str(info.value) and info.value.details["new"] == "running"
    assert ctx.store.get_job(name) == before
    rec = ctx.store.update_job(name, status=S.RUNNING, expected_attempt=1)
    assert rec is not None and rec.status is S.RUNNING
    assert ctx.store.update_job(name, status=S.COMPLETED, want_record=False) is None
    assert ctx.store.get_job(name).status is S.COMPLETED


def test_only_one_of_two_racing_updates_wins(ctx: Ctx) -> None:
    name = ctx.create("race")
    ctx.store.update_job(name, status=S.STARTING)
    ctx.store.update_job(name, status=S.RUNNING)
    barrier = threading.Barrier(2)

    def finish(status: JobStatus) -> str:
        barrier.wait(timeout=30)
        try:
            ctx.store.update_job(name, status=status, expected=S.RUNNING)
        except InvalidTransitionError:
            return "lost"
        return "won"

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(finish, [S.COMPLETED, S.FAILED]))
    assert sorted(results) == ["lost", "won"]
    rec = ctx.store.get_job(name)
    assert rec.is_terminal and rec.events[-1].status is rec.status
    assert len(rec.events) == 4


def test_failure_fields(ctx: Ctx) -> None:
    name = ctx.create("fail")
    ctx.store.update_job(name, status=S.STARTING)
    ctx.store.update_job(name, status=S.RUNNING, env_setup_seconds=1.25,
                         handle={"pid": 4242, "host": "h", "start_ticks": 99})
    t = ctx.clock.advance(3)
    rec = ctx.store.update_job(name, status=S.FAILED, reason="ZeroDivisionError: division by zero",
                               failure_kind=FailureKind.USER_ERROR, exit_code=1, attempt=2)
    assert rec.failure_kind is FailureKind.USER_ERROR
    assert rec.failure_reason == "ZeroDivisionError: division by zero"
    assert rec.exit_code == 1 and rec.attempt == 2 and rec.env_setup_seconds == 1.25
    assert dict(rec.handle) == {"pid": 4242, "host": "h", "start_ticks": 99}
    assert rec.ended_at == t
    assert rec.events[-1] == JobEvent(S.FAILED, t, "ZeroDivisionError: division by zero")
    assert ctx.store.get_job(name) == rec


def test_same_status_update_changes_fields_without_an_event(ctx: Ctx) -> None:
    name = ctx.create("same")
    ctx.store.update_job(name, status=S.STARTING)
    rec = ctx.store.update_job(name, status=S.STARTING, handle={"pid": 1})
    assert dict(rec.handle) == {"pid": 1}
    assert [e.status for e in rec.events] == [S.PENDING, S.STARTING]


def test_set_handle(ctx: Ctx) -> None:
    name = ctx.create("handle")
    ctx.store.set_handle(name, {"backend": "local", "pid": 12, "host": "box", "start_ticks": 7})
    rec = ctx.store.get_job(name)
    assert dict(rec.handle) == {"backend": "local", "pid": 12, "host": "box", "start_ticks": 7}
    assert rec.status is S.PENDING and len(rec.events) == 1


# --- queries ------------------------------------------------------------------------------

def test_list_jobs_filters(ctx: Ctx) -> None:
    names = []
    for i in range(5):
        ctx.clock.advance()
        names.append(ctx.create(f"grp-{i}"))
    t_other = ctx.clock.advance()
    other = ctx.create("other")
    ctx.store.update_job(names[1], status=S.STARTING)
    ctx.store.update_job(names[2], status=S.FAILED, reason="x")
    ctx.store.update_job(names[3], status=S.STOPPED)

    assert ctx.mine() == [other, *reversed(names)]  # newest first
    assert ctx.mine(limit=2) == [other, names[4]]
    assert ctx.mine(statuses=[S.PENDING]) == [other, names[4], names[0]]
    assert ctx.mine(statuses=[S.FAILED, S.STOPPED]) == [names[3], names[2]]
    assert ctx.mine(created_after=t_other) == [other]
    assert ctx.mine(created_after=t_other + timedelta(seconds=1)) == []
    assert [r.name for r in ctx.store.list_jobs(
        JobQuery(name_prefix=f"{ctx.prefix}-grp-", limit=100))] == list(reversed(names))
    assert [r.name for r in ctx.store.list_jobs(
        JobQuery(name_contains=f"{ctx.prefix}-oth", limit=100))] == [other]
    listed = ctx.store.list_jobs(JobQuery(name_prefix=names[2], limit=10))
    assert len(listed) == 1 and listed[0].status is S.FAILED
    assert listed[0].failure_reason == "x"


def test_list_jobs_prefix_is_literal(ctx: Ctx) -> None:
    a = ctx.create("a_b-1")
    ctx.create("aXb-1")
    ctx.create("a%b-1")
    assert [r.name for r in ctx.store.list_jobs(JobQuery(name_prefix=f"{ctx.prefix}-a_b"))] == [a]


def test_list_jobs_same_second_is_ordered_by_name(ctx: Ctx) -> None:
    names = [ctx.create(f"same-{i}") for i in range(3)]  # the clock does not move
    assert ctx.mine() == sorted(names, reverse=True)


def test_list_jobs_pages_by_keyset_without_gaps_or_repeats(ctx: Ctx) -> None:
    names = []
    for i in range(7):
        if i % 3 == 0:  # pairs created in the same instant: the name breaks the tie
            ctx.clock.advance()
        names.append(ctx.create(f"page-{i}"))
    newest_first = ctx.mine()
    assert sorted(newest_first) == sorted(names)
    pages: list[list[str]] = []
    before = None
    while True:
        page = ctx.store.list_jobs(JobQuery(name_prefix=f"{ctx.prefix}-", before=before,
                                            limit=3))
        if not page:
            break
        pages.append([r.name for r in page])
        before = (page[-1].created_at, page[-1].name)
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [n for p in pages for n in p] == newest_first


def test_list_jobs_by_owner(ctx: Ctx) -> None:
    name = ctx.create("owned")
    owner = ctx.store.get_job(name).owner
    assert ctx.mine(owner=owner) == [name]
    assert ctx.mine(owner=f"{owner}-someone-else") == []


def test_list_jobs_by_tags_needs_every_pair_exactly(ctx: Ctx) -> None:
    both = ctx.create("both", tags=(("team", "vision"), ("stage", "prod")))
    team = ctx.create("team", tags=(("team", "vision"), ("stage", "dev")))
    swapped = ctx.create("swapped", tags=(("vision", "team"),))
    # a list of two strings elsewhere in the spec is not a tag
    ctx.create("commands", pre_execution_commands=("team", "vision"))
    accented = ctx.create("accented", tags=(("équipe", "vision \"α\""),))
    assert ctx.mine(tags=[("team", "vision")]) == [team, both]
    assert ctx.mine(tags=[("team", "vision"), ("stage", "prod")]) == [both]
    assert ctx.mine(tags=[("team", "visio")]) == []  # whole values, not prefixes
    assert ctx.mine(tags=[("vision", "team")]) == [swapped]
    assert ctx.mine(tags=[("équipe", 'vision "α"')]) == [accented]
    assert ctx.mine(tags=[("team", "vision")], statuses=[S.PENDING], limit=1) == [team]


def _expected_order(records: list[JobRecord], sort: JobSort, descending: bool) -> list[str]:
    """The documented order: by the sort's value, then newer first, then name; jobs without
    a duration last in either direction."""
    def ran(r: JobRecord) -> float | None:
        return None if r.started_at is None or r.ended_at is None else \
            (r.ended_at - r.started_at).total_seconds()

    if sort is JobSort.DURATION:
        timed = [r for r in records if ran(r) is not None]
        untimed = [r for r in records if ran(r) is None]
        timed.sort(key=lambda r: (ran(r), r.created_at, r.name), reverse=descending)
        untimed.sort(key=lambda r: (r.created_at, r.name), reverse=descending)
        return [r.name for r in timed + untimed]
    value = {JobSort.CREATED: lambda r: (r.created_at, r.name),
             JobSort.NAME: lambda r: (r.name,),
             JobSort.STATUS: lambda r: (r.status.value, r.created_at, r.name)}[sort]
    return [r.name for r in sorted(records, key=value, reverse=descending)]


def test_list_jobs_sorts_every_way_and_pages_by_keyset_without_gaps_or_repeats(ctx: Ctx) -> None:
    names = []
    for i, (suffix, moves, runs_for) in enumerate((
            ("c-quick", (S.STARTING, S.RUNNING, S.COMPLETED), 1.0),
            ("a-slow", (S.STARTING, S.RUNNING, S.FAILED), 5.0),
            ("e-pending", (), 0.0),
            ("b-running", (S.STARTING, S.RUNNING), 0.0),
            ("d-quick", (S.STARTING, S.RUNNING, S.COMPLETED), 1.0),
            ("f-same", (), 0.0),
            ("g-same", (), 0.0))):
        if i < 5:  # the last three are created in the same instant
            ctx.clock.advance()
        names.append(ctx.create(suffix))
        for status in moves:
            if status.is_terminal:
                ctx.clock.advance(runs_for)
            ctx.store.update_job(names[-1], status=status)
    records = [ctx.store.get_job(n) for n in names]
    for sort in JobSort:
        for descending in (True, False):
            expected = _expected_order(records, sort, descending)
            assert ctx.mine(sort=sort, descending=descending) == expected, (sort, descending)
            pages: list[list[str]] = []
            after = None
            while True:
                page = ctx.mine(sort=sort, descending=descending, after=after, limit=3)
                if not page:
                    break
                pages.append(page)
                after = page[-1]
            assert [n for p in pages for n in p] == expected, (sort, descending)
    assert ctx.mine(sort=JobSort.STATUS, statuses=[S.COMPLETED], descending=False) == \
        [names[0], names[4]]  # filters and the order together


def test_list_jobs_by_many_names_keeps_the_asked_order(ctx: Ctx) -> None:
    # more names than one GET /jobs carries: the HTTP client merges its parts' pages
    names = [ctx.name(f"many-{i:03d}") for i in range(150)]
    ctx.store.create_jobs([JobSpec(name=n) for n in reversed(names)],
                          key_salts=["s"] * len(names), backend="local")
    def listed(**query: object) -> list[str]:
        return [r.name for r in ctx.store.list_jobs(JobQuery(names=names, **query))]  # type: ignore[arg-type]

    assert listed(sort=JobSort.NAME, descending=False, limit=1000) == names
    assert listed(sort=JobSort.NAME, descending=False, limit=7) == names[:7]
    assert listed(sort=JobSort.NAME, limit=7) == names[::-1][:7]


def test_list_jobs_after_a_deleted_job_says_to_start_again(ctx: Ctx) -> None:
    first, second = ctx.create("one"), ctx.create("two")
    assert ctx.mine(after=second) == [first]
    ctx.store.update_job(second, status=S.STOPPED)
    ctx.store.delete_jobs([second])
    with pytest.raises(JobNotFound, match="start again from the first page"):
        ctx.mine(after=second)


def test_iter_unfinished(ctx: Ctx) -> None:
    live = {status: ctx.create(f"live-{status}") for status in (S.PENDING, S.STARTING,
                                                                 S.RUNNING, S.STOPPING)}
    ctx.store.update_job(live[S.STARTING], status=S.STARTING)
    for status in (S.STARTING, S.RUNNING):
        ctx.store.update_job(live[S.RUNNING], status=status)
    ctx.store.update_job(live[S.STOPPING], status=S.STOPPING)
    done = [ctx.create("done-completed"), ctx.create("done-failed"), ctx.create("done-stopped")]
    for status in (S.STARTING, S.RUNNING, S.COMPLETED):
        ctx.store.update_job(done[0], status=status)
    ctx.store.update_job(done[1], status=S.FAILED)
    ctx.store.update_job(done[2], status=S.STOPPED)

    unfinished = {r.name: r.status for r in ctx.store.iter_unfinished()
                  if r.name.startswith(ctx.prefix)}
    assert unfinished == {name: status for status, name in live.items()}


# --- concurrency --------------------------------------------------------------------------

def test_threads_create_concurrently(ctx: Ctx) -> None:
    n_threads, per_thread = 8, 25
    barrier = threading.Barrier(n_threads)

    def work(t: int) -> None:
        barrier.wait(timeout=30)
        for i in range(per_thread):
            name = ctx.create(f"thr{t}-{i}")
            ctx.store.update_job(name, status=S.STARTING)

    with ThreadPoolExecutor(n_threads) as pool:
        for fut in [pool.submit(work, t) for t in range(n_threads)]:
            fut.result(timeout=120)
    records = ctx.store.list_jobs(JobQuery(name_prefix=ctx.prefix + "-", limit=10_000))
    assert len(records) == n_threads * per_thread
    assert {r.status for r in records} == {S.STARTING}
    assert all(len(r.events) == 0 for r in records)  # list_jobs does not load events
    assert len(ctx.store.get_job(records[0].name).events) == 2


def test_many_short_lived_threads_do_not_exhaust_connections(ctx: Ctx) -> None:
    """Thread pools come and go (servers, executors); their connections must come back."""
    name = ctx.create("churn")
    errors: list[BaseException] = []

    def read() -> None:
        try:
            ctx.store.get_job(name)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    for _ in range(40):  # more than the engine's pool holds (5 + 10 overflow)
        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(timeout=60)
        assert not t.is_alive(), "a store call hung waiting for a pooled connection"
    assert not errors, errors[0]
    assert ctx.store.get_job(name).name == name


_WORKER = textwrap.dedent("""
    import sys
    from shoal.core import JobName, JobSpec, JobStatus
    from shoal.storage.sql import SqlMetadataStore

    url, prefix, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = SqlMetadataStore.open(url, create=True)
    try:
        for i in range(count):
            name = JobName(f"{prefix}-{i}")
            store.create_job(JobSpec(name=name), key_salt="s", backend="local")
            store.update_job(name, status=JobStatus.STARTING, expected=JobStatus.PENDING)
    finally:
        store.close()
""")


def test_processes_create_concurrently_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh' / 'shoal.db'}"  # no schema yet: all four create it
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, url, f"proc{p}", "25"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for p in range(4)]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        outputs.append((proc.returncode, err.decode(errors="replace")))
    for rc, err in outputs:
        assert "locked" not in err, err
        assert rc == 0, err
    store = SqlMetadataStore.open(url)
    try:
        records = store.list_jobs(JobQuery(limit=10_000))
    finally:
        store.close()
    assert len(records) == 100
    assert {r.status for r in records} == {S.STARTING}


@pytest.mark.postgres
def test_concurrent_schema_creation_on_postgres(postgres_server_url: str) -> None:
    with fresh_postgres_database(postgres_server_url) as url:
        barrier = threading.Barrier(4)
        results: list[object] = []

        def open_and_close() -> None:
            try:
                barrier.wait(timeout=30)
                SqlMetadataStore.open(url, create=True).close()
                results.append("ok")
            except Exception as e:  # reported below
                results.append(e)

        # Daemon threads and a bounded join: a deadlock fails the test instead of hanging it.
        threads = [threading.Thread(target=open_and_close, daemon=True) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads), "schema creation deadlocked"
        assert results == ["ok"] * 4


# --- schema guard -------------------------------------------------------------------------

def test_empty_sqlite_file_without_create(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    with pytest.raises(SchemaOutOfDateError) as info:
        SqlMetadataStore.open(f"sqlite:///{path}")
    assert "shoal db upgrade" in str(info.value)
    assert "no shoal schema" in str(info.value)
    assert info.value.details["expected"] == SCHEMA_REVISION


def _stamp(url: str, revision: str) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE alembic_version SET version_num = :v"), {"v": revision})
    finally:
        engine.dispose()


@pytest.mark.parametrize("create", [False, True])
def test_older_schema_revision(tmp_path: Path, create: bool) -> None:
    url = _sqlite_url(tmp_path)
    SqlMetadataStore.open(url, create=True).close()
    _stamp(url, "0000")
    with pytest.raises(SchemaOutOfDateError) as info:
        SqlMetadataStore.open(url, create=create)
    message = str(info.value)
    assert "0000" in message and SCHEMA_REVISION in message and "shoal db upgrade" in message
    assert info.value.details["revision"] == "0000"


def test_upgrade_of_an_unknown_revision_is_a_store_error(tmp_path: Path) -> None:
    url = _sqlite_url(tmp_path)
    SqlMetadataStore.open(url, create=True).close()
    _stamp(url, "9999")  # written by a newer shoal
    with pytest.raises(MetadataStoreError, match="9999"):
        upgrade_schema(url)


def test_upgrade_schema_is_idempotent(tmp_path: Path) -> None:
    url = _sqlite_url(tmp_path)
    assert upgrade_schema(url) == SCHEMA_REVISION
    assert upgrade_schema(url) == SCHEMA_REVISION
    SqlMetadataStore.open(url).close()


def test_reopen_keeps_data(tmp_path: Path) -> None:
    url = _sqlite_url(tmp_path)
    store = SqlMetadataStore.open(url, create=True)
    try:
        store.create_job(JobSpec(name=JobName("kept")), key_salt="s", backend="local")
    finally:
        store.close()
    store = SqlMetadataStore.open(url)
    try:
        assert store.get_job("kept").status is S.PENDING
    finally:
        store.close()


def test_invalid_url() -> None:
    with pytest.raises(MetadataStoreError, match="invalid metadata URL"):
        SqlMetadataStore.open("not a url at all", create=True)


@pytest.mark.postgres
def test_missing_postgres_database(postgres_server_url: str) -> None:
    url = sa.engine.make_url(postgres_server_url).set(
        password="hunter2-secret", database=f"shoal_missing_{uuid.uuid4().hex[:8]}")
    raw = url.render_as_string(hide_password=False)
    assert "hunter2-secret" in raw
    with pytest.raises(MetadataStoreError) as info:
        SqlMetadataStore.open(raw, create=True)
    err = info.value
    assert not isinstance(err, SchemaOutOfDateError)
    assert url.database in str(err)
    assert "does not exist" in str(err)
    assert "hunter2-secret" not in str(err)
    assert "hunter2-secret" not in repr(err.details)
