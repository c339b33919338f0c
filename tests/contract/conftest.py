"""Fixtures of the store contract suites: each runs on SQLite, on PostgreSQL, and (the
metadata suites) through a real ``shoal server`` process with the HTTP clients."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from setups import ServerStores, SetUp, remove_server_records

from helpers import FakeClock, ServerClock
from shoal.storage.sql import SqlMetadataStore


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'meta' / 'shoal.db'}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return sqlite_url(tmp_path)
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres),
                        "server"])
def metadata(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SetUp]:
    """The metadata store of a suite whose module sets ``T0`` (its fake clock's start)."""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    if request.param == "server":
        server = request.getfixturevalue("shoal_server")
        stores = ServerStores(server.url, server.admin_token)
        clock = ServerClock()
        try:
            yield SetUp(stores, clock, clock.start, prefix, None)
        finally:
            try:
                remove_server_records(stores, prefix)
            finally:
                stores.close()
        return
    url = sqlite_url(tmp_path) if request.param == "sqlite" else str(
        request.getfixturevalue("postgres_url"))
    t0: datetime = request.module.T0
    fake = FakeClock(t0)
    store = SqlMetadataStore.open(url, clock=fake, create=True)
    try:
        yield SetUp(store, fake, t0, prefix, url)
    finally:
        try:
            store.delete_all()  # each worker has its own PostgreSQL database
        finally:
            store.close()
