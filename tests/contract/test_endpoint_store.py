"""The endpoint half of the metadata store contract, on SQLite, on PostgreSQL and through a
real ``shoal server`` process (``HttpEndpointStore`` over HTTP)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from setups import SetUp

from helpers import FakeClock, ServerClock
from shoal.core import MetadataStore
from shoal.core.endpoints import (
    BatchingOptions,
    EndpointConfig,
    EndpointInstance,
    EndpointStatus,
    InstanceStatus,
)
from shoal.core.ports import EndpointStore
from shoal.errors import AlreadyExistsError, EndpointNotFound, InvalidTransitionError
from shoal.storage.sql import schema

T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
E = EndpointStatus




@dataclass
class Ctx:
    store: EndpointStore
    clock: FakeClock | ServerClock
    t0: datetime  # when the test's store started: T0, or a Moment through the server
    setup: SetUp
    prefix: str  # unique per test: a worker's tests share its PostgreSQL database / server

    def name(self, suffix: str = "ep") -> str:
        return f"{self.prefix}-{suffix}"



@pytest.fixture
def ctx(metadata: SetUp) -> Ctx:
    return Ctx(metadata.store, metadata.clock, metadata.t0, metadata, metadata.prefix)


CONFIG = EndpointConfig(instance_count=2, batching=BatchingOptions(8, 5.0),
                        env={"A": "1"}, port=None, code=True, entry_point="serve.py")


def test_is_an_endpoint_store(ctx: Ctx) -> None:
    assert isinstance(ctx.store, EndpointStore)
    assert isinstance(ctx.store, MetadataStore) is not ctx.setup.through_server


def test_create_get_and_config_round_trip(ctx: Ctx) -> None:
    name = ctx.name()
    created = ctx.store.create_endpoint(name, model_data="file:///m/model.tar.gz", config=CONFIG)
    got = ctx.store.get_endpoint(name)
    assert got == created
    assert (got.status, got.model_data, got.config, got.failure_reason, got.instances) == (
        E.CREATING, "file:///m/model.tar.gz", CONFIG, None, ())
    assert got.created_at == ctx.t0 and got.updated_at == got.created_at
    assert dict(got.supervisor) == {}


def test_duplicate_name_says_what_to_do(ctx: Ctx) -> None:
    name = ctx.name()
    ctx.store.create_endpoint(name, model_data="m", config=EndpointConfig())
    with pytest.raises(AlreadyExistsError) as info:
        ctx.store.create_endpoint(name, model_data="m", config=EndpointConfig())
    assert name in str(info.value) and "shoal endpoints delete" in str(info.value)
    assert info.value.details == {"endpoint": name}


def test_missing_endpoint(ctx: Ctx) -> None:
    name = ctx.name("ghost")
    assert ctx.store.find_endpoint(name) is None
    for call in (lambda: ctx.store.get_endpoint(name),
                 lambda: ctx.store.update_endpoint(name, status=E.FAILED),
                 lambda: ctx.store.set_endpoint_supervisor(name, {"pid": 1}),
                 lambda: ctx.store.put_endpoint_instance(name, EndpointInstance(0, "h", 1))):
        with pytest.raises(EndpointNotFound) as info:
            call()
        assert name in str(info.value) and "shoal endpoints list" in str(info.value)
    assert ctx.store.delete_endpoint(name) is False


def test_transitions_follow_sagemaker_status(ctx: Ctx) -> None:
    name = ctx.name()
    ctx.store.create_endpoint(name, model_data="m", config=EndpointConfig())
    t2 = ctx.clock.advance(2)
    rec = ctx.store.update_endpoint(name, status=E.IN_SERVICE, expected=E.CREATING)
    assert rec.status == E.IN_SERVICE and rec.updated_at == t2
    with pytest.raises(InvalidTransitionError, match=name):
        ctx.store.update_endpoint(name, status=E.IN_SERVICE, expected=E.CREATING)
    with pytest.raises(InvalidTransitionError, match="cannot become Creating"):
        ctx.store.update_endpoint(name, status=E.CREATING)
    rec = ctx.store.update_endpoint(name, status=E.FAILED, failure_reason="boom\ntraceback")
    assert (rec.status, rec.failure_reason) == (E.FAILED, "boom\ntraceback")
    # The same status again keeps the reason unless a new one is given.
    assert ctx.store.update_endpoint(name, status=E.FAILED).failure_reason == "boom\ntraceback"
    assert ctx.store.update_endpoint(name, status=E.DELETING).status == E.DELETING
    with pytest.raises(InvalidTransitionError):
        ctx.store.update_endpoint(name, status=E.IN_SERVICE)


def test_instances_upsert_by_index_and_are_removed(ctx: Ctx) -> None:
    name = ctx.name()
    ctx.store.create_endpoint(name, model_data="m", config=CONFIG)
    ctx.store.put_endpoint_instance(name, EndpointInstance(1, "127.0.0.1", 9002, 22,
                                                           InstanceStatus.PENDING))
    ctx.store.put_endpoint_instance(name, EndpointInstance(0, "127.0.0.1", 9001, 11,
                                                           InstanceStatus.IN_SERVICE))
    ctx.store.put_endpoint_instance(name, EndpointInstance(1, "127.0.0.1", 9002, 33,
                                                           InstanceStatus.IN_SERVICE, 1))
    rec = ctx.store.get_endpoint(name)
    assert rec.instances == (
        EndpointInstance(0, "127.0.0.1", 9001, 11, InstanceStatus.IN_SERVICE, 0),
        EndpointInstance(1, "127.0.0.1", 9002, 33, InstanceStatus.IN_SERVICE, 1))
    assert [i.url for i in rec.serving] == ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
    ctx.store.remove_endpoint_instances(name)
    assert ctx.store.get_endpoint(name).instances == ()


def test_supervisor_handle(ctx: Ctx) -> None:
    name = ctx.name()
    ctx.store.create_endpoint(name, model_data="m", config=EndpointConfig())
    ctx.store.set_endpoint_supervisor(name, {"pid": 42, "host": "h", "start_ticks": 7})
    assert dict(ctx.store.get_endpoint(name).supervisor) == {"pid": 42, "host": "h",
                                                            "start_ticks": 7}


def test_list_newest_first_with_instances_and_delete(ctx: Ctx) -> None:
    older, newer = ctx.name("older"), ctx.name("newer")
    ctx.store.create_endpoint(older, model_data="m1", config=EndpointConfig())
    ctx.clock.advance()
    ctx.store.create_endpoint(newer, model_data="m2", config=EndpointConfig())
    ctx.store.put_endpoint_instance(older, EndpointInstance(0, "127.0.0.1", 9001, 5))
    mine = [r for r in ctx.store.list_endpoints() if r.name.startswith(ctx.prefix)]
    assert [(r.name, len(r.instances)) for r in mine] == [(newer, 0), (older, 1)]
    assert ctx.store.delete_endpoint(older) is True
    assert ctx.store.find_endpoint(older) is None
    # The name can be used again once deleted.
    ctx.store.create_endpoint(older, model_data="m3", config=EndpointConfig())
    assert ctx.store.get_endpoint(older).instances == ()


def test_the_database_rejects_unknown_statuses(ctx: Ctx) -> None:
    db_url = ctx.setup.sql_url()
    name = ctx.name()
    ctx.store.create_endpoint(name, model_data="m", config=EndpointConfig())
    engine = sa.create_engine(db_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
            conn.execute(sa.text("UPDATE endpoints SET status = 'Running' WHERE name = :n"),
                         {"n": name})
    finally:
        engine.dispose()


def test_schema_and_migration_checks_list_exactly_the_enum_values() -> None:
    import importlib.util
    import re

    path = Path(schema.__file__).parent / "migrations" / "versions" / "0003_endpoints.py"
    spec = importlib.util.spec_from_file_location("_shoal_migration_0003", path)
    assert spec is not None and spec.loader is not None
    migration = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(migration)
    for table, enum, migrated in (
            (schema.endpoints, EndpointStatus, migration._ENDPOINT_STATUSES),
            (schema.endpoint_instances, InstanceStatus, migration._INSTANCE_STATUSES)):
        [check] = [c for c in table.constraints if isinstance(c, sa.CheckConstraint)]
        values = {s.value for s in enum}
        assert set(re.findall(r"'([^']*)'", str(check.sqltext))) == values
        assert set(re.findall(r"'([^']*)'", migrated)) == values
