"""Helpers shared by the test suites (import as ``from helpers import ...``)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import TypeVar

T = TypeVar("T")

__all__ = ["FakeClock", "fresh_postgres_database", "wait_until"]


def wait_until(predicate: Callable[[], T], timeout: float, *, interval: float = 0.01,
               what: str | None = None) -> T:
    """Poll *predicate* until it returns something truthy; return that value.

    Exceptions raised by *predicate* count as "not yet". After *timeout* seconds raise
    ``TimeoutError`` naming *what* and chaining the last exception (or showing the last value).
    This loop is the only place the tests sleep.
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    last_value: object = None
    delay = interval
    while True:
        try:
            value = predicate()
        except Exception as e:  # reported below if it never succeeds
            last_exc = e
        else:
            if value:
                return value
            last_exc, last_value = None, value
        if time.monotonic() >= deadline:
            name = what or getattr(predicate, "__name__", repr(predicate))
            if last_exc is not None:
                raise TimeoutError(f"{name} did not hold within {timeout}s; last error: "
                                   f"{type(last_exc).__name__}: {last_exc}") from last_exc
            raise TimeoutError(f"{name} did not hold within {timeout}s; last value: "
                               f"{last_value!r}")
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 0.2)


@contextmanager
def fresh_postgres_database(server_url: str) -> Iterator[str]:
    """Create an empty, uniquely named database on *server_url*'s server; drop it afterwards.

    Each xdist worker gets its own database, so one worker's clean-up never removes another
    worker's rows.
    """
    import sqlalchemy as sa

    base = sa.engine.make_url(server_url)
    if base.drivername == "postgresql":
        base = base.set(drivername="postgresql+psycopg")
    name = f"shoal_t_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(base.set(database="postgres"), isolation_level="AUTOCOMMIT",
                             poolclass=sa.pool.NullPool)
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        try:
            yield base.set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        admin.dispose()


class FakeClock:
    """A clock that moves only when told to (thread-safe); stores take it as ``clock=``."""

    def __init__(self, start: datetime) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, seconds: float = 1.0) -> datetime:
        with self._lock:
            self._now += timedelta(seconds=seconds)
            return self._now
