"""Owners of jobs, experiments, runs and endpoints (schema 0007) in the SQL metadata store, on
SQLite and on PostgreSQL: ``local`` by default, the given user otherwise, kept on every read;
rows written before 0007 read ``local`` after the upgrade."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from helpers import fresh_postgres_database
from shoal.core import JobName, JobQuery, JobSpec
from shoal.core.endpoints import EndpointConfig
from shoal.storage.sql import SCHEMA_REVISION, SqlMetadataStore, schema, upgrade_schema


@pytest.fixture
def store(db_url: str) -> Iterator[SqlMetadataStore]:
    opened = SqlMetadataStore.open(db_url, create=True)
    try:
        yield opened
    finally:
        try:
            opened.delete_all()  # a worker's tests share its PostgreSQL database
        finally:
            opened.close()


def _prefix() -> str:
    return f"o{uuid.uuid4().hex[:10]}"


def test_a_job_is_owned_by_local_unless_an_owner_is_given(store: SqlMetadataStore) -> None:
    p = _prefix()
    plain = store.create_job(JobSpec(name=JobName(f"{p}-plain")), key_salt="s", backend="local")
    mine = store.create_job(JobSpec(name=JobName(f"{p}-alice")), key_salt="s", backend="local",
                            owner="alice")
    batch = store.create_jobs([JobSpec(name=JobName(f"{p}-b{i}")) for i in range(2)],
                              key_salts=["s1", "s2"], backend="local", owner="bob")
    assert (plain.owner, mine.owner, [r.owner for r in batch]) == ("local", "alice",
                                                                   ["bob", "bob"])
    assert store.get_job(plain.name).owner == "local"
    assert store.get_job(mine.name).owner == "alice"
    listed = {r.name: r.owner for r in store.list_jobs(JobQuery(name_prefix=p))}
    assert listed == {f"{p}-plain": "local", f"{p}-alice": "alice", f"{p}-b0": "bob",
                      f"{p}-b1": "bob"}
    assert {r.name: r.owner for r in store.iter_unfinished() if r.name.startswith(p)} == listed


def test_an_update_keeps_the_jobs_owner(store: SqlMetadataStore) -> None:
    from shoal.core import JobStatus

    name = JobName(f"{_prefix()}-j")
    store.create_job(JobSpec(name=name), key_salt="s", backend="local", owner="alice")
    updated = store.update_job(name, status=JobStatus.STARTING)
    assert updated is not None and updated.owner == "alice"


def test_experiments_and_runs_record_their_owner(store: SqlMetadataStore) -> None:
    p = _prefix()
    created = store.ensure_experiment(f"{p}-e", owner="alice")
    again = store.ensure_experiment(f"{p}-e", owner="bob")  # an existing one keeps its owner
    plain = store.ensure_experiment(f"{p}-plain")
    assert (created.owner, again.owner, plain.owner) == ("alice", "alice", "local")
    run = store.create_run(f"{p}-e", "r1", owner="bob")
    other = store.create_run(f"{p}-e", "r2")
    assert (run.owner, other.owner) == ("bob", "local")
    assert store.get_run(f"{p}-e", "r1").owner == "bob"
    assert [(r.run_name, r.owner) for r in store.list_runs(f"{p}-e")] == [("r1", "bob"),
                                                                          ("r2", "local")]
    assert {e.name: e.owner for e in store.list_experiments() if e.name.startswith(p)} == {
        f"{p}-e": "alice", f"{p}-plain": "local"}
    assert store.get_experiment(f"{p}-e").owner == "alice"


def test_an_endpoint_records_its_owner(store: SqlMetadataStore) -> None:
    p = _prefix()
    config = EndpointConfig()
    mine = store.create_endpoint(f"{p}-a", model_data="file:///m.tar.gz", config=config,
                                 owner="alice")
    plain = store.create_endpoint(f"{p}-b", model_data="file:///m.tar.gz", config=config)
    assert (mine.owner, plain.owner) == ("alice", "local")
    assert store.get_endpoint(f"{p}-a").owner == "alice"
    assert {e.name: e.owner for e in store.list_endpoints() if e.name.startswith(p)} == {
        f"{p}-a": "alice", f"{p}-b": "local"}


# --- the migration ------------------------------------------------------------------------

def _database_at_0006_with_rows(url: str) -> None:
    from alembic import command
    from alembic.config import Config

    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            cfg = Config()
            cfg.set_main_option("script_location", str(Path(schema.__file__).parent /
                                                       "migrations"))
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "0006")
            conn.execute(sa.text(
                "INSERT INTO jobs (name, status, spec, key_salt, backend, created_at, "
                "updated_at, attempt, handle) VALUES ('old-job', 'completed', :spec, 's', "
                "'local', 1, 2, 1, '{}')"), {"spec": json.dumps({"name": "old-job"})})
            conn.execute(sa.text("INSERT INTO experiments (name, tags, created_at) VALUES "
                                 "('old-exp', '{}', 1)"))
            conn.execute(sa.text("INSERT INTO runs (experiment_name, run_name, status, "
                                 "created_at) VALUES ('old-exp', 'old-run', 'Completed', 1)"))
            conn.execute(sa.text(
                "INSERT INTO endpoints (name, status, model_data, config, supervisor, "
                "created_at, updated_at) VALUES ('old-ep', 'Deleting', 'file:///m', :c, '{}', "
                "1, 1)"), {"c": json.dumps(EndpointConfig().to_json())})
            conn.commit()
    finally:
        engine.dispose()


def _check_rows_read_local_after_upgrade(url: str) -> None:
    _database_at_0006_with_rows(url)
    assert upgrade_schema(url) == SCHEMA_REVISION
    store = SqlMetadataStore.open(url)
    try:
        assert store.get_job("old-job").owner == "local"
        assert store.get_experiment("old-exp").owner == "local"
        assert store.get_run("old-exp", "old-run").owner == "local"
        assert store.get_endpoint("old-ep").owner == "local"
        # New rows after the upgrade take the owner given.
        assert store.create_run("old-exp", "new-run", owner="alice").owner == "alice"
        assert store.get_run("old-exp", "new-run").owner == "alice"
    finally:
        store.close()


def test_rows_from_before_0007_are_owned_by_local_on_sqlite(tmp_path: Path) -> None:
    _check_rows_read_local_after_upgrade(f"sqlite:///{tmp_path / 'old.db'}")


@pytest.mark.postgres
def test_rows_from_before_0007_are_owned_by_local_on_postgres(postgres_server_url: str) -> None:
    with fresh_postgres_database(postgres_server_url) as url:
        _check_rows_read_local_after_upgrade(url)
