"""What the metadata contract suites run against: a SQL store with a fake clock, or a real
``shoal server``'s HTTP clients with the real clock (the ``metadata`` fixture of conftest)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pytest

from helpers import FakeClock, ServerClock
from shoal.client import HttpEndpointStore, HttpJobStore, HttpRunStore, ServerConnection
from shoal.core import JobQuery, JobStatus

__all__ = ["ServerStores", "SetUp", "remove_server_records"]


class ServerStores:
    """The HTTP clients of one server's store ports as one object, the face the SQL store
    shows the suites (each method goes to the client of its port)."""

    def __init__(self, url: str, token: str) -> None:
        self.connection = ServerConnection(url, token)
        self._ports: tuple[Any, ...] = (HttpJobStore(self.connection),
                                        HttpRunStore(self.connection),
                                        HttpEndpointStore(self.connection))

    def __getattr__(self, name: str) -> Any:
        for port in self._ports:
            if hasattr(port, name):
                return getattr(port, name)
        raise AttributeError(name)

    def close(self) -> None:
        self.connection.close()


@dataclass
class SetUp:
    """A metadata store under test and its clock: a ``FakeClock`` on SQL stores, the real
    one through the server (``t0`` is then the test's start, as a ``Moment``)."""

    store: Any
    clock: FakeClock | ServerClock
    t0: datetime
    prefix: str  # unique per test: a worker's tests share its PostgreSQL database / server
    url: str | None  # the SQL URL; None through the server

    @property
    def through_server(self) -> bool:
        return self.url is None

    def sql_url(self) -> str:
        """The database's URL, for a test that reaches into its tables (skipped through a
        server, whose database is the server's own)."""
        if self.url is None:
            pytest.skip("reaches into the SQL tables under the store; through the server they "
                        "are the server's")
        return self.url

    def need_fake_clock(self, why: str) -> FakeClock:
        if not isinstance(self.clock, FakeClock):
            pytest.skip(f"sets the store's clock ({why}); a server's clock is real")
        return self.clock


_END = {JobStatus.PENDING: JobStatus.STOPPED, JobStatus.STARTING: JobStatus.FAILED,
        JobStatus.RUNNING: JobStatus.FAILED, JobStatus.STOPPING: JobStatus.STOPPED}


def remove_server_records(stores: ServerStores, prefix: str) -> None:
    """End and delete a test's jobs (only ended jobs can be deleted), experiments and
    endpoints on the shared server."""
    records = stores.list_jobs(JobQuery(name_prefix=prefix + "-", limit=100_000))
    for r in records:
        if not r.is_terminal:
            stores.update_job(r.name, status=_END[r.status])
    stores.delete_jobs([r.name for r in records])
    for e in stores.list_experiments():
        if e.name.startswith(prefix):
            stores.delete_experiment(e.name)
    for endpoint in stores.list_endpoints():
        if endpoint.name.startswith(prefix):
            stores.delete_endpoint(endpoint.name)
