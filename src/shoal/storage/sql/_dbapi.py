"""One DB-API connection per thread (and per process) for the SQL metadata store.

The store's methods run fixed SQL on the cursor that ``Dbapi.tx`` yields, one transaction per
call; SQLAlchemy's pool hands out the connections and gets them back when a thread ends.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.engine.interfaces import DBAPICursor
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import PoolProxiedConnection

from shoal.storage.sql import _diagnose

__all__ = ["Dbapi"]


class Dbapi:
    """One DB-API connection per thread (and per process), checked out of the engine's pool."""

    def __init__(self, engine: Engine, shown_url: str) -> None:
        self._engine = engine
        self._shown, self._url = shown_url, str(engine.url)
        self._local = threading.local()
        self._sql: dict[str, str] = {}
        self.postgres = engine.dialect.name == "postgresql"
        self.integrity_error: type[BaseException] = engine.dialect.loaded_dbapi.IntegrityError
        self._error: type[BaseException] = engine.dialect.loaded_dbapi.Error
        self._held: list[weakref.finalize[Any, Any]] = []  # one per live thread connection
        self._lock = threading.Lock()

    def sql(self, text: str) -> str:
        """Our SQL uses '?' placeholders; psycopg wants '%s'."""
        if not self.postgres:
            return text
        out = self._sql.get(text)
        if out is None:
            out = self._sql[text] = text.replace("%", "%%").replace("?", "%s")
        return out

    def _conn(self) -> PoolProxiedConnection:
        held: _Held | None = getattr(self._local, "held", None)
        if held is not None and held.pid == os.getpid():
            return held.conn
        if held is not None:  # inherited across a fork: never close the parent's connection
            held.release.detach()
        conn = self._engine.raw_connection()
        held = _Held(conn)
        # When the thread ends its threading.local value dies, and the connection goes back
        # to the pool; without this, short-lived threads exhaust the pool.
        held.release = weakref.finalize(held, _release, conn)
        self._local.held = held
        with self._lock:
            self._held = [f for f in self._held if f.alive] + [held.release]
        return conn

    @contextmanager
    def tx(self, *, write: bool) -> Iterator[DBAPICursor]:
        try:
            conn = self._conn()
            cur = conn.cursor()
        except (SQLAlchemyError, self._error) as e:
            raise _diagnose.explain(e, self._url, self._shown, doing="open") from e
        try:
            if not self.postgres:
                cur.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            yield cur
            conn.commit()
        except BaseException as e:
            with contextlib.suppress(Exception):
                conn.rollback()
            if isinstance(e, self._error) and not isinstance(e, self.integrity_error):
                with contextlib.suppress(Exception):
                    conn.invalidate()  # a broken connection is not reused
                self._local.held = None
                raise _diagnose.explain(e, self._url, self._shown,
                                        doing="write to" if write else "read") from e
            raise
        finally:
            with contextlib.suppress(Exception):
                cur.close()

    def forget(self) -> None:
        with self._lock:
            held, self._held = self._held, []
        for release in held:
            release.detach()
        self._local = threading.local()

    def close(self) -> None:
        with self._lock:
            held, self._held = self._held, []
        for release in held:
            release()
        self._local = threading.local()


class _Held:
    __slots__ = ("__weakref__", "conn", "pid", "release")

    def __init__(self, conn: PoolProxiedConnection) -> None:
        self.conn = conn
        self.pid = os.getpid()
        self.release: weakref.finalize[Any, Any]


def _release(conn: PoolProxiedConnection) -> None:
    with contextlib.suppress(Exception):
        conn.close()  # back to the engine's pool
