"""The experiment half of the metadata store contract (experiments, runs, metrics), on SQLite,
on PostgreSQL, and through a real ``shoal server`` process (``HttpRunStore`` over HTTP)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from helpers import FakeClock, fresh_postgres_database, wait_until
from shoal.client import HttpRunStore
from shoal.core import (
    MetadataStore,
    MetricPoint,
    RunArtifact,
    RunStatus,
    job_owner,
    run_owner,
)
from shoal.core.downsample import thin_rows
from shoal.core.ports import RunStore
from shoal.errors import (
    AlreadyExistsError,
    ExperimentNotFound,
    InvalidArgumentError,
    RunNotFound,
    SchemaOutOfDateError,
)
from shoal.storage.sql import SCHEMA_REVISION, SqlMetadataStore, schema, upgrade_schema

T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)


class RealClock:
    """The server's clock cannot be set: ``advance`` waits until time has moved on (so the
    order of two writes is still defined), and times are checked to lie within the test."""

    def __init__(self) -> None:
        self.start = datetime.now(UTC)

    def advance(self, seconds: float = 1.0) -> None:
        before = time.time()
        wait_until(lambda: time.time() > before + 0.002, 5, interval=0.001,
                   what="the clock to move")


@dataclass
class Ctx:
    store: RunStore
    clock: FakeClock | RealClock
    prefix: str  # unique per test: a worker's tests share its PostgreSQL database / server

    def exp(self, suffix: str = "e") -> str:
        name = f"{self.prefix}-{suffix}"
        self.store.ensure_experiment(name)
        return name

    def at(self, seconds: float = 0.0) -> Any:
        """What a time *seconds* after the test's start compares equal to: exactly T0 + that
        on the fake clock; any moment of the test through the server."""
        if isinstance(self.clock, FakeClock):
            return T0 + timedelta(seconds=seconds)
        return _During(self.clock.start)


class _During:
    def __init__(self, start: datetime) -> None:
        self._start = start

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, datetime) and other.tzinfo is not None
                and self._start <= other <= datetime.now(UTC))

    def __repr__(self) -> str:
        return f"<a time after {self._start:%H:%M:%S.%f}>"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres),
                        "server"])
def ctx(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Ctx]:
    prefix = f"t{uuid.uuid4().hex[:10]}"
    if request.param == "server":
        server = request.getfixturevalue("shoal_server")
        http = HttpRunStore.open(server.url, server.admin_token)
        try:
            yield Ctx(http, RealClock(), prefix)
        finally:
            for e in http.list_experiments():
                if e.name.startswith(prefix):
                    http.delete_experiment(e.name)
            http.close()
        return
    url = (f"sqlite:///{tmp_path / 'meta' / 'shoal.db'}" if request.param == "sqlite"
           else str(request.getfixturevalue("postgres_url")))
    clock = FakeClock(T0)
    store = SqlMetadataStore.open(url, clock=clock, create=True)
    try:
        yield Ctx(store, clock, prefix)
    finally:
        try:
            store.delete_all()
        finally:
            store.close()


def test_is_still_a_metadata_store(ctx: Ctx) -> None:
    assert isinstance(ctx.store, RunStore)
    assert isinstance(ctx.store, MetadataStore) is isinstance(ctx.store, SqlMetadataStore)


# --- experiments --------------------------------------------------------------------------

def test_ensure_experiment_is_idempotent_and_keeps_the_first_display_name(ctx: Ctx) -> None:
    name = f"{ctx.prefix}-exp"
    first = ctx.store.ensure_experiment(name, display_name="First", tags={"team": "ml"})
    ctx.clock.advance()
    again = ctx.store.ensure_experiment(name, display_name="Second")
    assert first == again
    assert (again.name, again.display_name, dict(again.tags)) == (name, "First", {"team": "ml"})
    assert again.created_at == ctx.at() and again.run_count == 0
    assert ctx.store.get_experiment(name) == first


def test_list_experiments_newest_first_with_run_counts(ctx: Ctx) -> None:
    older = ctx.exp("older")
    ctx.clock.advance()
    newer = ctx.exp("newer")
    ctx.store.create_run(older, "r1")
    ctx.store.create_run(older, "r2")
    mine = [e for e in ctx.store.list_experiments() if e.name.startswith(ctx.prefix)]
    assert [(e.name, e.run_count) for e in mine] == [(newer, 0), (older, 2)]


def test_missing_experiment(ctx: Ctx) -> None:
    name = f"{ctx.prefix}-nope"
    assert ctx.store.find_experiment(name) is None
    with pytest.raises(ExperimentNotFound, match=name):
        ctx.store.get_experiment(name)
    with pytest.raises(ExperimentNotFound, match=name):
        ctx.store.list_runs(name)
    with pytest.raises(ExperimentNotFound, match=name):
        ctx.store.create_run(name, "r")


# --- runs ---------------------------------------------------------------------------------

def test_create_and_get_run(ctx: Ctx) -> None:
    exp = ctx.exp()
    created = ctx.store.create_run(exp, "run-1", display_name="Run one", tags={"k": "v"})
    assert created.status is RunStatus.IN_PROGRESS
    got = ctx.store.get_run(exp, "run-1")
    assert got == created
    assert got.metrics_owner == run_owner(exp, "run-1") == f"run:{exp}/run-1"
    assert (got.display_name, dict(got.tags), got.created_at, got.ended_at) == (
        "Run one", {"k": "v"}, ctx.at(), None)


def test_duplicate_run_names_both_names(ctx: Ctx) -> None:
    exp = ctx.exp()
    ctx.store.create_run(exp, "dup")
    with pytest.raises(AlreadyExistsError) as info:
        ctx.store.create_run(exp, "dup")
    assert exp in str(info.value) and "dup" in str(info.value)
    assert info.value.details == {"experiment": exp, "run": "dup"}
    other = ctx.exp("other")
    ctx.store.create_run(other, "dup")  # run names are unique within an experiment only


def test_missing_run(ctx: Ctx) -> None:
    exp = ctx.exp()
    assert ctx.store.find_run(exp, "ghost") is None
    for call in (lambda: ctx.store.get_run(exp, "ghost"),
                 lambda: ctx.store.end_run(exp, "ghost", status=RunStatus.COMPLETED),
                 lambda: ctx.store.set_run_parameters(exp, "ghost", {"a": 1}),
                 lambda: ctx.store.link_run_job(exp, "ghost", "job-1")):
        with pytest.raises(RunNotFound) as info:
            call()
        assert "ghost" in str(info.value) and exp in str(info.value)


def test_parameters_upsert_and_keep_their_types(ctx: Ctx) -> None:
    exp = ctx.exp()
    ctx.store.create_run(exp, "r")
    ctx.store.set_run_parameters(exp, "r", {"lr": 0.1, "epochs": 3, "opt": "adam",
                                           "amp": True})
    ctx.store.set_run_parameters(exp, "r", {"lr": 0.01, "layers": 4})
    params = ctx.store.get_run(exp, "r").parameters
    assert params == {"lr": 0.01, "epochs": 3, "opt": "adam", "amp": True, "layers": 4}
    assert type(params["epochs"]) is int and type(params["amp"]) is bool


def test_tags_artifacts_and_jobs(ctx: Ctx) -> None:
    exp = ctx.exp()
    ctx.store.create_run(exp, "r", tags={"a": "1"})
    ctx.store.set_run_tags(exp, "r", {"a": "2", "b": "3"})
    ctx.store.add_run_artifact(exp, "r", RunArtifact("model", "file:///m.tar.gz",
                                                     media_type="application/gzip"))
    ctx.clock.advance()
    ctx.store.add_run_artifact(exp, "r", RunArtifact("data", "s3://b/d.csv", is_output=False))
    ctx.clock.advance()
    # The same name and direction replaces the earlier value.
    ctx.store.add_run_artifact(exp, "r", RunArtifact("model", "file:///m2.tar.gz",
                                                     artifact_type="Model"))
    ctx.store.link_run_job(exp, "r", "job-b")
    ctx.clock.advance()
    ctx.store.link_run_job(exp, "r", "job-a")
    ctx.store.link_run_job(exp, "r", "job-b")  # idempotent
    run = ctx.store.get_run(exp, "r")
    assert dict(run.tags) == {"a": "2", "b": "3"}
    assert run.artifacts == (
        RunArtifact("data", "s3://b/d.csv", None, False, None),
        RunArtifact("model", "file:///m2.tar.gz", None, True, "Model"),
    )
    assert run.jobs == ("job-b", "job-a")
    assert [r.run_name for r in ctx.store.runs_for_job("job-a")] == ["r"]
    assert ctx.store.runs_for_job(f"{ctx.prefix}-unlinked") == []


def test_end_and_resume(ctx: Ctx) -> None:
    exp = ctx.exp()
    ctx.store.create_run(exp, "r")
    ctx.clock.advance(5)
    ctx.store.end_run(exp, "r", status=RunStatus.FAILED)
    run = ctx.store.get_run(exp, "r")
    assert run.status is RunStatus.FAILED and run.ended_at == ctx.at(5)
    assert run.ended_at is not None and run.ended_at > run.created_at
    ctx.store.resume_run(exp, "r")
    run = ctx.store.get_run(exp, "r")
    assert run.status is RunStatus.IN_PROGRESS and run.ended_at is None
    with pytest.raises(InvalidArgumentError, match="end status"):
        ctx.store.end_run(exp, "r", status=RunStatus.IN_PROGRESS)


def test_list_runs_oldest_first_with_their_children(ctx: Ctx) -> None:
    exp = ctx.exp()
    for i in range(3):
        ctx.store.create_run(exp, f"r{i}")
        ctx.store.set_run_parameters(exp, f"r{i}", {"i": i})
        ctx.clock.advance()
    ctx.exp("empty")
    runs = ctx.store.list_runs(exp)
    assert [(r.run_name, r.parameters["i"]) for r in runs] == [("r0", 0), ("r1", 1), ("r2", 2)]
    assert ctx.store.list_runs(f"{ctx.prefix}-empty") == []


# --- metrics ------------------------------------------------------------------------------

def test_metrics_round_trip_in_time_then_step_order(ctx: Ctx) -> None:
    owner = run_owner(ctx.exp(), "r")
    ctx.store.add_metrics(owner, [
        MetricPoint("loss", 0.5, 10.0, 2),
        MetricPoint("loss", 0.9, 10.0, 1),
        MetricPoint("acc", 0.7, 11.0),
        MetricPoint("loss", 0.4, 9.0, None),
    ])
    ctx.store.add_metrics(owner, [MetricPoint("loss", 0.1, 12.0, 3)])
    assert ctx.store.get_metrics(owner, "loss") == [
        MetricPoint("loss", 0.4, 9.0, None), MetricPoint("loss", 0.9, 10.0, 1),
        MetricPoint("loss", 0.5, 10.0, 2), MetricPoint("loss", 0.1, 12.0, 3)]
    assert [p.name for p in ctx.store.get_metrics(owner)] == ["acc"] + ["loss"] * 4
    assert ctx.store.metric_names(owner) == ["acc", "loss"]
    assert ctx.store.get_metrics(owner, "missing") == []
    assert ctx.store.get_metrics(job_owner(f"{ctx.prefix}-job")) == []


def test_metric_summaries(ctx: Ctx) -> None:
    owner = job_owner(f"{ctx.prefix}-job")
    ctx.store.add_metrics(owner, [MetricPoint("loss", v, float(i), i)
                                  for i, v in enumerate([4.0, 1.0, 3.0, 2.0])])
    ctx.store.add_metrics(owner, [MetricPoint("acc", 0.5, 1.0)])
    [acc, loss] = ctx.store.metric_summaries(owner)
    assert (acc.name, acc.count, acc.last) == ("acc", 1, 0.5)
    assert (loss.name, loss.count, loss.min, loss.max, loss.avg, loss.last) == (
        "loss", 4, 1.0, 4.0, 2.5, 2.0)
    assert ctx.store.metric_summaries(f"{owner}-none") == []


def test_owners_are_separate(ctx: Ctx) -> None:
    a, b = job_owner(f"{ctx.prefix}-a"), job_owner(f"{ctx.prefix}-b")
    ctx.store.add_metrics(a, [MetricPoint("m", 1.0, 1.0)])
    ctx.store.add_metrics(b, [MetricPoint("m", 2.0, 1.0)])
    assert [p.value for p in ctx.store.get_metrics(a)] == [1.0]
    assert [p.value for p in ctx.store.get_metrics(b)] == [2.0]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_point_stores_nothing_of_its_batch(ctx: Ctx, value: float) -> None:
    owner = job_owner(f"{ctx.prefix}-job")
    with pytest.raises(InvalidArgumentError, match="'bad'"):
        ctx.store.add_metrics(owner, [MetricPoint("good", 1.0, 1.0),
                                      MetricPoint("bad", value, 2.0)])
    assert ctx.store.get_metrics(owner) == []


def test_large_steps_and_empty_batches(ctx: Ctx) -> None:
    owner = job_owner(f"{ctx.prefix}-job")
    ctx.store.add_metrics(owner, [])
    ctx.store.add_metrics(owner, [MetricPoint("m", 1.5, 1.0, 2**40)])
    assert ctx.store.get_metrics(owner) == [MetricPoint("m", 1.5, 1.0, 2**40)]


def test_ten_thousand_points_in_one_batch_round_trip_in_order(ctx: Ctx) -> None:
    # How fast: bench/metrics.py (a timed assertion here failed on a busy machine).
    owner = run_owner(ctx.exp(), "r")
    points = [MetricPoint("loss", 1.0 / (i + 1), 1000.0 + i * 0.001, i) for i in range(10_000)]
    ctx.store.add_metrics(owner, points[:10])  # the connection is open, as in a real run
    ctx.store.add_metrics(owner, points[10:])
    assert ctx.store.get_metrics(owner, "loss") == points


# --- migration from 0001 ------------------------------------------------------------------

def _database_at_0001(url: str) -> None:
    """A database as shoal 0.1 (schema revision 0001) left it, with one job."""
    from alembic import command
    from alembic.config import Config

    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            cfg = Config()
            cfg.set_main_option("script_location", str(Path(schema.__file__).parent / "migrations"))
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "0001")
            conn.execute(sa.text(
                "INSERT INTO jobs (name, status, spec, secret, backend, created_at, updated_at) "
                "VALUES ('old-job', 'completed', :spec, 's', 'local', 1, 2)"),
                {"spec": '{"name": "old-job"}'})
            conn.commit()
    finally:
        engine.dispose()


def test_a_0001_database_upgrades_and_keeps_its_jobs(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    _database_at_0001(url)
    with pytest.raises(SchemaOutOfDateError, match="0001"):
        SqlMetadataStore.open(url)
    assert upgrade_schema(url) == SCHEMA_REVISION
    store = SqlMetadataStore.open(url)
    try:
        assert store.get_job("old-job").status == "completed"
        store.ensure_experiment("after-upgrade")
        store.create_run("after-upgrade", "r")
        store.add_metrics(run_owner("after-upgrade", "r"), [MetricPoint("m", 1.0, 1.0)])
        assert store.metric_names(run_owner("after-upgrade", "r")) == ["m"]
    finally:
        store.close()


# --- thinned reads (metric_buckets, revisions 0008 and 0009) -----------------------------

def _spiky(n: int, spike: int, dip: int) -> list[float]:
    return [100.0 if i == spike else -100.0 if i == dip else (i % 7) / 7 for i in range(n)]


def test_metric_buckets_returns_a_short_series_whole_in_step_order(ctx: Ctx) -> None:
    owner = run_owner(ctx.exp(), "r")
    ctx.store.add_metrics(owner, [MetricPoint("loss", float(v), 100.0 - v, v)
                                  for v in (3, 1, 2, 0)])
    got = ctx.store.metric_buckets(owner, "loss", 10)
    assert (got.name, got.count, got.x_is_step) == ("loss", 4, True)
    assert [p.step for p in got.points] == [0, 1, 2, 3]
    assert [p.timestamp for p in got.points] == [100.0, 99.0, 98.0, 97.0]
    none = ctx.store.metric_buckets(owner, "missing", 10)
    assert (none.count, none.points) == (0, ())


def test_metric_buckets_thins_a_long_series_keeping_its_spike_and_dip(ctx: Ctx) -> None:
    owner = job_owner(f"{ctx.prefix}-job")
    n, buckets = 5000, 20  # more than METRIC_BLOCK * buckets: read from the blocks
    values = _spiky(n, spike=3217, dip=1403)
    stored = [MetricPoint("loss", v, 1000.0 + i, i) for i, v in enumerate(values)]
    # Batches that end inside blocks, so blocks are completed by later writes.
    for lo, hi in ((0, 37), (37, 1403), (1403, 1404), (1404, 4999), (4999, n)):
        ctx.store.add_metrics(owner, stored[lo:hi])
    got = ctx.store.metric_buckets(owner, "loss", buckets)
    assert (got.count, got.x_is_step) == (n, True)
    assert 2 * buckets >= len(got.points) >= buckets
    assert set(got.points) <= set(stored)
    steps = [p.step for p in got.points]
    assert steps == sorted(steps)
    assert stored[3217] in got.points and stored[1403] in got.points
    # Spread over the whole series, not its start.
    assert steps[0] is not None and steps[-1] is not None
    assert steps[0] < n // buckets and steps[-1] >= n - n // buckets


def test_metric_buckets_of_points_without_steps_are_by_time(ctx: Ctx) -> None:
    owner = job_owner(f"{ctx.prefix}-job")
    n = 2000
    ctx.store.add_metrics(owner, [MetricPoint("m", v, float(n - i), None if i == 5 else i)
                                  for i, v in enumerate(_spiky(n, spike=700, dip=1500))])
    got = ctx.store.metric_buckets(owner, "m", 8)
    assert (got.count, got.x_is_step) == (n, False)
    times = [p.timestamp for p in got.points]
    assert times == sorted(times) and len(times) <= 16
    assert {p.value for p in got.points} >= {100.0, -100.0}


def test_a_deleted_run_takes_its_thinned_series_with_it(ctx: Ctx) -> None:
    exp = ctx.exp()
    ctx.store.create_run(exp, "r")
    owner = run_owner(exp, "r")
    ctx.store.add_metrics(owner, [MetricPoint("m", float(i), 1.0 + i, i) for i in range(500)])
    assert ctx.store.delete_run(exp, "r")
    ctx.store.create_run(exp, "r")
    ctx.store.add_metrics(owner, [MetricPoint("m", 7.0, 1.0, 0), MetricPoint("m", 8.0, 2.0, 1)])
    got = ctx.store.metric_buckets(owner, "m", 1)
    assert got.count == 2 and [p.value for p in got.points] == [7.0, 8.0]


def _reference(points: list[MetricPoint], size: int, buckets: int) -> list[MetricPoint]:
    """What a read of level *size* must give: each block of *size* points (by position) as
    its first lowest and first highest point, thinned to *buckets* (``core.downsample``)."""
    rows: list[tuple[float, float, int | None]] = []
    for start in range(0, len(points), size):
        block = points[start:start + size]
        lo = min(block, key=lambda p: p.value)  # min/max return the first of equals
        hi = max(block, key=lambda p: p.value)
        rows.append((lo.value, lo.timestamp, lo.step))
        if hi is not lo:
            rows.append((hi.value, hi.timestamp, hi.step))
    return list(thin_rows(points[0].name, rows, buckets, count=len(points),
                          x_is_step=True).points)


def test_metric_buckets_reads_the_coarsest_level_with_a_block_per_column(ctx: Ctx) -> None:
    owner = job_owner(f"{ctx.prefix}-job")
    n = 20_000
    values = _spiky(n, spike=12_345, dip=777)
    stored = [MetricPoint("loss", v, 1000.0 + i, i) for i, v in enumerate(values)]
    other = [MetricPoint("acc", -v, 1000.0 + i, i) for i, v in enumerate(values[:3000])]
    # Batches that end inside blocks of every level, and one that holds two series.
    cuts = [0, 37, 777, 778, 4100, 4101, 12_000, 12_345, 12_346, n]
    for lo, hi in zip(cuts, cuts[1:], strict=False):
        ctx.store.add_metrics(owner, stored[lo:hi] + (other if lo == 4100 else []))
    # The coarsest level with a block per pixel column is read: blocks of 4,096 points for
    # 4 columns (4 blocks of 4,096 < 20,000 < 4 x 16,384) ... every point for 2,000.
    for buckets, size in ((4, 4096), (10, 1024), (50, 256), (300, 64), (1000, 16),
                          (2000, 1)):
        got = ctx.store.metric_buckets(owner, "loss", buckets)
        assert (got.count, got.x_is_step) == (n, True)
        assert list(got.points) == _reference(stored, size, buckets), buckets
        assert stored[12_345] in got.points and stored[777] in got.points, buckets
        assert buckets <= len(got.points) <= 2 * buckets
    acc = ctx.store.metric_buckets(owner, "acc", 10)
    assert list(acc.points) == _reference(other, 256, 10)


def test_points_stored_before_0008_are_thinned_after_the_upgrades_on_sqlite(
        tmp_path: Path) -> None:
    _check_thinned_after_the_upgrades(f"sqlite:///{tmp_path / 'old.db'}")


@pytest.mark.postgres
def test_points_stored_before_0008_are_thinned_after_the_upgrades_on_postgres(
        postgres_server_url: str) -> None:
    with fresh_postgres_database(postgres_server_url) as url:
        _check_thinned_after_the_upgrades(url)


def _check_thinned_after_the_upgrades(url: str) -> None:
    """Points stored at revision 0007 (no blocks, no spans, no last points): 0008 fills the
    blocks, 0009 the spans (from the blocks) and the last points; reads then match those of
    the same points written after the upgrade, at every level."""
    from alembic import command
    from alembic.config import Config

    values = _spiky(3000, spike=2001, dip=999)
    sa_engine = sa.create_engine(url)
    try:
        with sa_engine.connect() as conn:
            cfg = Config()
            cfg.set_main_option("script_location", str(Path(schema.__file__).parent / "migrations"))
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "0007")
            conn.execute(sa.text("INSERT INTO metrics (owner, name, value, step, timestamp) "
                                 "VALUES ('job:old', 'loss', :v, :s, :t)"),
                         [{"v": v, "s": i, "t": 10.0 + i} for i, v in enumerate(values)])
            # Two points at the same time: the one added last is the last.
            conn.execute(sa.text("INSERT INTO metrics (owner, name, value, step, timestamp) "
                                 "VALUES ('job:old', 'acc', :v, 1, 5.0)"), [{"v": 0.5}, {"v": 0.7}])
            conn.commit()
    finally:
        sa_engine.dispose()
    assert upgrade_schema(url) == SCHEMA_REVISION
    store = SqlMetadataStore.open(url)
    try:
        # The same points written after the upgrade, in batches that split blocks.
        points = [MetricPoint("loss", v, 10.0 + i, i) for i, v in enumerate(values)]
        for lo, hi in ((0, 100), (100, 1111), (1111, 3000)):
            store.add_metrics("job:new", points[lo:hi])
        for buckets in (1, 10, 40, 150, 500):  # levels 1024, 256, 64, 16 and the points
            old = store.metric_buckets("job:old", "loss", buckets)
            new = store.metric_buckets("job:new", "loss", buckets)
            assert (old.count, old.x_is_step) == (3000, True)
            assert old.points == new.points, buckets
            assert {p.step for p in old.points} >= {2001, 999}
        assert store.last_metrics(["job:old", "job:new"]) == {
            "job:old": {"acc": 0.7, "loss": values[-1]}, "job:new": {"loss": values[-1]}}
        store.add_metrics("job:old", [MetricPoint("loss", 500.0, 5000.0, 3000)])
        assert store.metric_buckets("job:old", "loss", 10).count == 3001
        assert store.last_metrics(["job:old"])["job:old"]["loss"] == 500.0
    finally:
        store.close()


def test_last_metrics_of_many_owners_in_one_read(ctx: Ctx) -> None:
    exp = ctx.exp()
    owners = [run_owner(exp, f"r{i}") for i in range(3)]
    ctx.store.add_metrics(owners[0], [MetricPoint("loss", 0.9, 1.0, 0),
                                      MetricPoint("loss", 0.2, 3.0, 2),
                                      MetricPoint("loss", 0.5, 2.0, 1),
                                      MetricPoint("acc", 0.7, 1.0)])
    ctx.store.add_metrics(owners[1], [MetricPoint("loss", 4.0, 5.0, 1),
                                      MetricPoint("loss", 3.0, 5.0, 2)])  # same time: by step
    assert ctx.store.last_metrics([*owners, owners[0]]) == {
        owners[0]: {"acc": 0.7, "loss": 0.2}, owners[1]: {"loss": 3.0}}
    assert ctx.store.last_metrics([owners[2]]) == {}
    assert ctx.store.last_metrics([]) == {}


def test_the_last_value_is_the_newest_point_whatever_order_batches_come_in(ctx: Ctx) -> None:
    owner = run_owner(ctx.exp(), "r")
    ctx.store.add_metrics(owner, [MetricPoint("m", 1.0, 10.0, 5)])
    ctx.store.add_metrics(owner, [MetricPoint("m", 2.0, 9.0, 9)])  # older: not the last
    assert ctx.store.last_metrics([owner]) == {owner: {"m": 1.0}}
    ctx.store.add_metrics(owner, [MetricPoint("m", 3.0, 10.0, None)])  # no step sorts first
    assert ctx.store.last_metrics([owner]) == {owner: {"m": 1.0}}
    ctx.store.add_metrics(owner, [MetricPoint("m", 4.0, 10.0, 5)])  # a tie: the later write
    assert ctx.store.last_metrics([owner]) == {owner: {"m": 4.0}}
    ctx.store.add_metrics(owner, [MetricPoint("m", 6.0, 11.0, 0), MetricPoint("m", 5.0, 11.0, 0),
                                  MetricPoint("m", 7.0, 10.5, 99)])
    assert ctx.store.last_metrics([owner]) == {owner: {"m": 5.0}}
    summary, = ctx.store.metric_summaries(owner)
    assert (summary.last, summary.count) == (5.0, 7)
    assert [p.value for p in ctx.store.get_metrics(owner, "m")][-1] == 5.0


def test_last_metric_of_runs_reads_one_metric_of_every_run(ctx: Ctx) -> None:
    exp, near = ctx.exp(), ctx.exp("e2")  # e2 starts like e: its runs must not count
    for run in ("a", "b", "c"):
        ctx.store.create_run(exp, run)
    ctx.store.create_run(near, "a")
    ctx.store.add_metrics(run_owner(exp, "a"), [MetricPoint("loss", 0.5, 1.0, 0),
                                                MetricPoint("loss", 0.25, 2.0, 1)])
    ctx.store.add_metrics(run_owner(exp, "b"), [MetricPoint("loss", 0.75, 1.0, 0),
                                                MetricPoint("acc", 0.1, 1.0, 0)])
    ctx.store.add_metrics(run_owner(exp, "c"), [MetricPoint("acc", 0.2, 1.0, 0)])
    ctx.store.add_metrics(run_owner(near, "a"), [MetricPoint("loss", 9.0, 1.0, 0)])
    assert ctx.store.last_metric_of_runs(exp, "loss") == {"a": 0.25, "b": 0.75}
    assert ctx.store.last_metric_of_runs(exp, "acc") == {"b": 0.1, "c": 0.2}
    assert ctx.store.last_metric_of_runs(exp, "missing") == {}
    with pytest.raises(ExperimentNotFound, match="no-such"):
        ctx.store.last_metric_of_runs(f"{ctx.prefix}-no-such", "loss")
