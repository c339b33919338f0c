"""Deleting from the metadata store (``shoal jobs delete``, ``shoal gc``), on SQLite, on
PostgreSQL and through a real ``shoal server`` (``HttpJobStore`` + ``HttpRunStore``); and
measuring what an artifact prefix holds."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from setups import SetUp

from helpers import FakeClock, ServerClock
from shoal.core import JobQuery, JobSpec, JobStatus, MetricPoint, RunArtifact, job_owner, run_owner
from shoal.storage import FsspecArtifactStore

S = JobStatus
T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)


@dataclass
class Ctx:
    store: Any  # the SQL store, or the server's HttpJobStore and HttpRunStore as one
    clock: FakeClock | ServerClock
    setup: SetUp
    prefix: str  # unique per test: a worker's tests share its PostgreSQL database / server

    def job(self, suffix: str, *, end: JobStatus | None = S.COMPLETED) -> str:
        name = f"{self.prefix}-{suffix}"
        self.store.create_job(JobSpec(name=name), key_salt="s", backend="local")  # type: ignore[arg-type]
        if end is not None:
            self.store.update_job(name, status=S.STARTING)
            self.store.update_job(name, status=S.RUNNING)
            self.store.update_job(name, status=end, reason="r" if end == S.FAILED else None)
        return name

    def mine(self, **query: object) -> list[str]:
        q = JobQuery(name_prefix=self.prefix + "-", limit=1000, **query)  # type: ignore[arg-type]
        return sorted(r.name for r in self.store.list_jobs(q))


@pytest.fixture
def ctx(metadata: SetUp) -> Ctx:
    return Ctx(metadata.store, metadata.clock, metadata, metadata.prefix)


def test_delete_jobs_removes_ended_jobs_with_their_history_metrics_and_run_links(ctx: Ctx) -> None:
    done = ctx.job("done")
    failed = ctx.job("failed", end=S.FAILED)
    running = ctx.job("running", end=None)
    kept = ctx.job("kept")
    for name in (done, kept):
        ctx.store.add_metrics(job_owner(name), [MetricPoint("loss", 1.0, 0.0, 0)])
    exp = f"{ctx.prefix}-exp"
    ctx.store.ensure_experiment(exp)
    ctx.store.create_run(exp, "r")
    ctx.store.link_run_job(exp, "r", done)
    ctx.store.link_run_job(exp, "r", kept)
    for name in (done, kept):
        ctx.store.put_job_payloads(name, {"results": (b"result", b"{}")})

    removed = ctx.store.delete_jobs([done, failed, running, f"{ctx.prefix}-never"])

    assert sorted(removed) == sorted([done, failed])
    assert ctx.mine() == sorted([running, kept])  # a running job is never deleted
    assert ctx.store.find_job(done) is None
    assert ctx.store.get_metrics(job_owner(done)) == []
    assert [p.value for p in ctx.store.get_metrics(job_owner(kept))] == [1.0]
    assert ctx.store.get_run(exp, "r").jobs == (kept,)
    assert ctx.store.runs_for_job(done) == []
    assert ctx.store.get_job_payload(done, "results") is None  # its small payloads went too
    assert ctx.store.get_job_payload(kept, "results") == (b"result", b"{}")
    assert ctx.store.delete_jobs([done]) == []  # again: nothing left to delete


def test_delete_jobs_handles_more_names_than_one_statement_binds(ctx: Ctx) -> None:
    names = [ctx.job(f"j{i:04d}") for i in range(450)]
    assert len(ctx.store.delete_jobs(names)) == 450
    assert ctx.mine() == []


def test_ended_before_selects_jobs_that_ended_earlier(ctx: Ctx) -> None:
    clock = ctx.setup.need_fake_clock("40 days pass between two jobs")
    old = ctx.job("old")
    clock.advance(timedelta(days=40).total_seconds())
    new = ctx.job("new")
    running = ctx.job("running", end=None)
    cutoff = T0 + timedelta(days=30)
    assert ctx.mine(ended_before=cutoff) == [old]
    assert ctx.mine(ended_before=cutoff + timedelta(days=30)) == sorted([old, new])
    assert running not in ctx.mine(ended_before=T0 + timedelta(days=365))


def test_delete_run_removes_it_with_everything_it_holds(ctx: Ctx) -> None:
    exp = f"{ctx.prefix}-exp"
    ctx.store.ensure_experiment(exp)
    for run in ("a", "b"):
        ctx.store.create_run(exp, run)
        ctx.store.set_run_parameters(exp, run, {"lr": 0.1})
        ctx.store.set_run_tags(exp, run, {"k": "v"})
        ctx.store.add_run_artifact(exp, run, RunArtifact("model", "file:///m"))
        ctx.store.add_metrics(run_owner(exp, run), [MetricPoint("acc", 0.5, 0.0, 0)])
    assert ctx.store.delete_run(exp, "a") is True
    assert ctx.store.find_run(exp, "a") is None
    assert ctx.store.get_metrics(run_owner(exp, "a")) == []
    b = ctx.store.get_run(exp, "b")
    assert dict(b.parameters) == {"lr": 0.1} and len(b.artifacts) == 1
    assert len(ctx.store.get_metrics(run_owner(exp, "b"))) == 1
    assert ctx.store.get_experiment(exp).run_count == 1
    assert ctx.store.delete_run(exp, "a") is False
    # A new run of the same name starts empty.
    ctx.store.create_run(exp, "a")
    assert dict(ctx.store.get_run(exp, "a").parameters) == {}


def test_delete_experiment_removes_its_runs(ctx: Ctx) -> None:
    exp, other = f"{ctx.prefix}-exp", f"{ctx.prefix}-other"
    for e in (exp, other):
        ctx.store.ensure_experiment(e)
        ctx.store.create_run(e, "r1")
        ctx.store.add_metrics(run_owner(e, "r1"), [MetricPoint("acc", 0.5, 0.0, 0)])
    ctx.store.create_run(exp, "r2")
    assert ctx.store.delete_experiment(exp) == 2
    assert ctx.store.find_experiment(exp) is None
    assert ctx.store.get_metrics(run_owner(exp, "r1")) == []
    assert ctx.store.get_run(other, "r1").run_name == "r1"
    assert ctx.store.delete_experiment(exp) == -1


def test_artifact_disk_usage_counts_only_the_prefix(tmp_path: Path) -> None:
    store = FsspecArtifactStore.open(f"file://{tmp_path / 'artifacts'}")
    store.put_bytes("job-1/function/payload.pkl", b"a" * 100)
    store.put_bytes("job-1/logs/output.log", b"b" * 20)
    store.put_bytes("job-10/function/payload.pkl", b"c" * 7)
    assert store.disk_usage("job-1") == 120
    assert store.disk_usage("job-10") == 7
    assert store.disk_usage("never-written") == 0
    store.delete_prefix("job-1")
    assert store.disk_usage("job-1") == 0 and store.disk_usage("job-10") == 7
