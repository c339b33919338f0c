"""The SQL metadata store: SQLite (WAL, many processes) by default, PostgreSQL for teams.

Rows become frozen ``core`` records at this boundary; SQLAlchemy errors never leave it.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, overload

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from shoal._internal.extras import needs_extra
from shoal.core.clock import Clock, SystemClock
from shoal.core.jobs import (
    TRANSITIONS,
    FailureKind,
    JobChange,
    JobEvent,
    JobName,
    JobRecord,
    JobSpec,
    JobStatus,
    check_transition,
)
from shoal.core.ports import JobQuery
from shoal.errors import (
    AlreadyExistsError,
    InvalidTransitionError,
    JobNotFound,
    MetadataStoreError,
    SchemaOutOfDateError,
)
from shoal.storage.sql import _diagnose
from shoal.storage.sql._auth import AuthTables
from shoal.storage.sql._dbapi import Dbapi
from shoal.storage.sql._deletes import DeleteTables
from shoal.storage.sql._endpoints import EndpointTables
from shoal.storage.sql._jobquery import cursor_gone, job_query_sql, spec_text
from shoal.storage.sql._metrics import MetricTables
from shoal.storage.sql._payloads import PayloadTables
from shoal.storage.sql._runs import RunTables
from shoal.storage.sql.schema import SCHEMA_REVISION

__all__ = ["SCHEMA_REVISION", "SqlMetadataStore", "redact_url", "upgrade_schema"]

_MIGRATIONS = Path(__file__).parent / "migrations"


def redact_url(url: str) -> str:
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:  # an unparsable URL is shown as given; it holds no parsed password
        return url


def _ts(dt: datetime) -> float:
    return dt.timestamp()


@overload
def _dt(value: float) -> datetime: ...
@overload
def _dt(value: float | None) -> datetime | None: ...
def _dt(value: float | None) -> datetime | None:
    """The UTC datetime of a stored timestamp (None stays None: a column not yet set)."""
    return None if value is None else datetime.fromtimestamp(value, UTC)


def _make_engine(url: str) -> Engine:
    try:
        parsed = sa.engine.make_url(url)
    except sa.exc.ArgumentError as e:
        raise MetadataStoreError(f"invalid metadata URL {url!r}: {e}. Use sqlite:///PATH or "
                                 "postgresql+psycopg://USER@HOST/DB", url=url) from e
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database
        if db and db != ":memory:" and not db.startswith("file:"):
            from shoal._internal.private import create_private_file

            _diagnose.make_parent(Path(db))
            # 0600; SQLite gives its -wal and -shm the same mode. A refusal (read-only
            # directory, disk full) is told by the connection's own diagnosis below.
            with contextlib.suppress(OSError):
                create_private_file(db)
        # Each thread keeps one connection (see _dbapi.Dbapi); no overflow limit, so an executor
        # with many threads never waits on the pool.
        engine = sa.create_engine(url, connect_args={"timeout": 60, "check_same_thread": False},
                                  pool_size=5, max_overflow=-1)

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=60000")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            # Writers take the lock up front, so two writers never deadlock on an upgrade.
            write = conn.get_execution_options().get("shoal_write", False)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

        return engine
    if parsed.drivername == "postgresql":
        url = parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    if parsed.get_backend_name() == "postgresql":
        with needs_extra("postgres", "a PostgreSQL metadata store"):
            return sa.create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=-1)
    return sa.create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=-1)


def upgrade_schema(url: str) -> str:
    """Bring the database at *url* to the schema this code expects; return the revision."""
    from alembic import command
    from alembic.config import Config
    from alembic.util import CommandError

    _diagnose.refuse_newer(_current_revision(url), redact_url(url), _MIGRATIONS, SCHEMA_REVISION)
    engine = _make_engine(url)
    try:
        with engine.connect().execution_options(shoal_write=True) as conn:
            cfg = Config()
            cfg.set_main_option("script_location", str(_MIGRATIONS))
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
            conn.commit()
    except (SQLAlchemyError, CommandError) as e:
        raise _diagnose.explain(e, url, redact_url(url), doing="upgrade") from e
    finally:
        engine.dispose()
    return SCHEMA_REVISION


class SqlMetadataStore(RunTables, MetricTables, EndpointTables, DeleteTables, PayloadTables,
                       AuthTables):
    """Jobs and their history, experiments, runs and metrics, endpoints in a SQL database.

    Hot paths run fixed SQL on the DB-API cursor of a per-thread connection (SQLAlchemy's
    statement building costs ~100× a SQLite round trip); SQLAlchemy still provides URLs,
    engines, pooling, dialects and the Alembic migrations.
    """

    def __init__(self, engine: Engine, url: str, *, clock: Clock | None = None) -> None:
        self._engine = engine
        self._url = url
        self._clock = clock or SystemClock()
        self._db = Dbapi(engine, redact_url(url))

    @classmethod
    def open(cls, url: str, *, clock: Clock | None = None, create: bool = False) -> SqlMetadataStore:
        """Connect and check the schema. *create* builds an empty database's schema."""
        revision = _current_revision(url)
        if create and revision != SCHEMA_REVISION:
            # Another process may be creating the schema right now, one migration after the
            # other: its revisions on the way are not an old database. Wait for it, then read.
            with _migration_lock(url):
                revision = _current_revision(url)
                if revision is None:
                    upgrade_schema(url)
                    revision = _current_revision(url)
        _diagnose.refuse_newer(revision, redact_url(url), _MIGRATIONS, SCHEMA_REVISION)
        if revision != SCHEMA_REVISION:
            shown = redact_url(url)
            have = "has no shoal schema" if revision is None else f"is at revision {revision}"
            raise SchemaOutOfDateError(
                f"metadata database {shown} {have}, code expects {SCHEMA_REVISION}; "
                f"run 'shoal db upgrade {shown}'", url=shown, revision=revision,
                expected=SCHEMA_REVISION,
            )
        return cls(_make_engine(url), url, clock=clock)

    @property
    def url(self) -> str:
        return self._url

    def close(self) -> None:
        self._db.close()
        self._engine.dispose()

    def after_fork(self) -> None:
        """Drop connections inherited from a parent process without closing them."""
        self._db.forget()
        self._engine.dispose(close=False)

    # --- jobs -------------------------------------------------------------------------

    def create_job(self, spec: JobSpec, *, key_salt: str, backend: str,
                   owner: str = "local") -> JobRecord:
        now = _ts(self._clock.now())
        spec_json = spec_text(spec.to_json())
        with self._db.tx(write=True) as cur:
            try:
                cur.execute(self._db.sql(_INSERT_JOB), (
                    spec.name, JobStatus.PENDING.value, spec_json, key_salt, backend, now, now,
                    owner))
            except self._db.integrity_error as e:
                raise AlreadyExistsError(f"a job named {spec.name!r} already exists; choose "
                                         "another job_name", job=spec.name) from e
            cur.execute(self._db.sql(_INSERT_EVENT), (spec.name, JobStatus.PENDING.value, now, None))
        created = _dt(now)
        return JobRecord(name=spec.name, spec=spec, status=JobStatus.PENDING,
                         created_at=created, updated_at=created, backend=backend,
                         events=(JobEvent(JobStatus.PENDING, created),), owner=owner)

    def create_jobs(self, specs: Sequence[JobSpec], *, key_salts: Sequence[str],
                    backend: str, owner: str = "local") -> list[JobRecord]:
        """Create every job or none, in one transaction."""
        if len(key_salts) != len(specs):
            raise ValueError("create_jobs needs one key salt per spec")
        names = [spec.name for spec in specs]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise AlreadyExistsError(f"job names repeat within the batch: {', '.join(dup)}",
                                     jobs=dup)
        if not specs:
            return []
        now = _ts(self._clock.now())
        pending = JobStatus.PENDING.value
        rows = [(spec.name, pending, spec_text(spec.to_json()), salt,
                 backend, now, now, owner)
                for spec, salt in zip(specs, key_salts, strict=True)]
        try:
            with self._db.tx(write=True) as cur:
                cur.executemany(self._db.sql(_INSERT_JOB), rows)
                cur.executemany(self._db.sql(_INSERT_EVENT),
                                [(name, pending, now, None) for name in names])
        except self._db.integrity_error as e:
            taken = [n for n in names if self.find_job(n) is not None]
            raise AlreadyExistsError(
                f"job(s) {', '.join(taken) or '?'} already exist; none of the {len(names)} "
                "jobs was created; choose other names", jobs=taken) from e
        created = _dt(now)
        event = (JobEvent(JobStatus.PENDING, created),)
        return [JobRecord(name=spec.name, spec=spec, status=JobStatus.PENDING,
                          created_at=created, updated_at=created,
                          backend=backend, events=event, owner=owner) for spec in specs]

    def find_job(self, name: str) -> JobRecord | None:
        with self._db.tx(write=False) as cur:
            cur.execute(self._db.sql(_SELECT_JOB + " WHERE name = ?"), (name,))
            row = cur.fetchone()
            if row is None:
                return None
            cur.execute(self._db.sql(_SELECT_EVENTS), (name,))
            events = cur.fetchall()
        return _record(row, events)

    def get_job(self, name: str) -> JobRecord:
        rec = self.find_job(name)
        if rec is None:
            raise JobNotFound(f"no job named {name!r} in {redact_url(self._url)}; "
                              "'shoal jobs list' shows the jobs there", job=name)
        return rec

    def get_job_key_salt(self, name: str) -> str:
        with self._db.tx(write=False) as cur:
            cur.execute(self._db.sql("SELECT key_salt FROM jobs WHERE name = ?"), (name,))
            row = cur.fetchone()
        if row is None:
            raise JobNotFound(f"no job named {name!r}", job=name)
        return str(row[0] or "")

    def list_jobs(self, query: JobQuery) -> list[JobRecord]:
        where, params = job_query_sql(query, self._db.postgres)
        with self._db.tx(write=False) as cur:
            cur.execute(self._db.sql(_SELECT_JOB + where), tuple(params))
            rows = cur.fetchall()
            if not rows and query.after is not None:
                cur.execute(self._db.sql("SELECT 1 FROM jobs WHERE name = ?"), (query.after,))
                if cur.fetchone() is None:
                    raise JobNotFound(cursor_gone(query), job=query.after)
        return [_record(r, ()) for r in rows]

    def iter_unfinished(self) -> Iterator[JobRecord]:
        live = [s.value for s in JobStatus if not s.is_terminal]
        sql = _SELECT_JOB + f" WHERE status IN ({', '.join('?' for _ in live)})"
        with self._db.tx(write=False) as cur:
            cur.execute(self._db.sql(sql), tuple(live))
            rows = cur.fetchall()
        return iter([_record(r, ()) for r in rows])

    def update_job(
        self, name: str, *, status: JobStatus, expected: JobStatus | None = None,
        reason: str | None = None, failure_kind: FailureKind | None = None,
        exit_code: int | None = None, attempt: int | None = None,
        handle: Mapping[str, Any] | None = None, env_setup_seconds: float | None = None,
        want_record: bool = True, expected_attempt: int | None = None,
    ) -> JobRecord | None:
        """Move *name* to *status* atomically, checking the allowed transitions; return the
        updated record (None with ``want_record=False``, which saves a read on hot paths)."""
        now = _ts(self._clock.now())
        with self._db.tx(write=True) as cur:
            lock = " FOR UPDATE" if self._db.postgres else ""
            cur.execute(self._db.sql(_SELECT_JOB + " WHERE name = ?" + lock), (name,))
            row = cur.fetchone()
            if row is None:
                raise JobNotFound(f"no job named {name!r}", job=name)
            current = JobStatus(row[_COL["status"]])
            if expected is not None and current != expected:
                raise InvalidTransitionError(
                    f"job {name!r} is {current}, not {expected}; it cannot move to {status}",
                    job=name, current=str(current), new=str(status))
            if expected_attempt is not None and row[_COL["attempt"]] != expected_attempt:
                raise InvalidTransitionError(
                    f"job {name!r} is at attempt {row[_COL['attempt']]}, not "
                    f"{expected_attempt}; it cannot move to {status}", job=name,
                    current=str(current), new=str(status))
            if current != status or current.is_terminal:
                check_transition(name, current, status)  # an ended job never changes again
            values: dict[str, Any] = {"status": status.value, "updated_at": now}
            if status == JobStatus.RUNNING and row[_COL["started_at"]] is None:
                values["started_at"] = now
            if status.is_terminal:
                values["ended_at"] = now
            for key, value in (("failure_kind", failure_kind), ("exit_code", exit_code),
                               ("attempt", attempt), ("env_setup_seconds", env_setup_seconds)):
                if value is not None:
                    values[key] = value.value if isinstance(value, FailureKind) else value
            if reason is not None and status == JobStatus.FAILED:
                values["failure_reason"] = reason
            if handle is not None:
                values["handle"] = json.dumps(dict(handle))
            sets = ", ".join(f"{k} = ?" for k in values)
            cur.execute(self._db.sql(f"UPDATE jobs SET {sets} WHERE name = ?"),
                        (*values.values(), name))
            if current != status:
                cur.execute(self._db.sql(_INSERT_EVENT), (name, status.value, now, reason))
            if not want_record:
                return None
            merged = list(row)
            for key, value in values.items():
                merged[_COL[key]] = value
            cur.execute(self._db.sql(_SELECT_EVENTS), (name,))
            events = cur.fetchall()
        return _record(tuple(merged), events)

    def update_jobs(self, changes: Sequence[JobChange]) -> list[bool]:
        """Apply *changes* in order in one transaction; report which were applied."""
        if not changes:
            return []
        now = _ts(self._clock.now())
        names = list(dict.fromkeys(c.name for c in changes))
        lock = " FOR UPDATE" if self._db.postgres else ""
        applied: list[bool] = []
        with self._db.tx(write=True) as cur:
            state: dict[str, dict[str, Any]] = {}
            for part in _chunks(names):
                cur.execute(self._db.sql(f"SELECT name, status, started_at, updated_at FROM jobs "
                                         f"WHERE name IN ({_marks(part)}){lock}"), tuple(part))
                for name, status, started, updated in cur.fetchall():
                    state[name] = {"status": JobStatus(status), "started_at": started,
                                   "last": updated}
            missing = [n for n in names if n not in state]
            if missing:
                raise JobNotFound(f"no job named {missing[0]!r}", job=missing[0])
            events = []
            for change in changes:
                row = state[change.name]
                ok = _apply(row, change, now)
                applied.append(ok)
                if ok:
                    events.append((change.name, change.status.value, row["updated_at"],
                                   change.reason))
            cur.executemany(self._db.sql(_UPDATE_MANY), [
                (r["status"].value, r["updated_at"], r["started_at"], r.get("ended_at"),
                 r.get("attempt"), r.get("failure_kind"), r.get("failure_reason"),
                 r.get("exit_code"), r.get("env_setup_seconds"), name)
                for name, r in state.items() if "updated_at" in r])
            cur.executemany(self._db.sql(_INSERT_EVENT), events)
        return applied

    def set_handles(self, names: Sequence[str], handle: Mapping[str, Any]
                    ) -> dict[str, JobStatus]:
        ended = [s.value for s in JobStatus if s.is_terminal]
        statuses: dict[str, JobStatus] = {}
        with self._db.tx(write=True) as cur:
            for part in _chunks(names):
                cur.execute(self._db.sql(f"UPDATE jobs SET handle = ? WHERE name IN "
                                         f"({_marks(part)}) AND status NOT IN ({_marks(ended)})"),
                            (json.dumps(dict(handle)), *part, *ended))
                cur.execute(self._db.sql(f"SELECT name, status FROM jobs WHERE name IN "
                                         f"({_marks(part)})"), tuple(part))
                statuses.update((str(n), JobStatus(st)) for n, st in cur.fetchall())
        missing = [n for n in names if n not in statuses]
        if missing:
            raise JobNotFound(f"no job named {missing[0]!r}", job=missing[0])
        return statuses

    def set_handle(self, name: str, handle: Mapping[str, Any]) -> None:
        with self._db.tx(write=True) as cur:
            cur.execute(self._db.sql("UPDATE jobs SET handle = ? WHERE name = ?"),
                        (json.dumps(dict(handle)), name))
            if cur.rowcount == 0:
                raise JobNotFound(f"no job named {name!r}", job=name)

    def delete_all(self) -> None:
        """Remove every row (test clean-up on a shared PostgreSQL database)."""
        with self._db.tx(write=True) as cur:
            for table in ("endpoint_instances", "endpoints", "metrics", "metric_series",
                          "metric_blocks", "metric_spans", "run_jobs",
                          "run_artifacts", "run_tags", "run_parameters", "runs", "experiments",
                          "job_events", "job_payloads", "jobs", "api_tokens", "users"):
                cur.execute(f"DELETE FROM {table}")


_COLUMNS = ("name", "status", "spec", "backend", "created_at", "updated_at", "started_at",
            "ended_at", "attempt", "failure_kind", "failure_reason", "exit_code", "handle",
            "env_setup_seconds", "owner")
_COL = {c: i for i, c in enumerate(_COLUMNS)}
_SELECT_JOB = f"SELECT {', '.join(_COLUMNS)} FROM jobs"
_SELECT_EVENTS = "SELECT status, at, reason FROM job_events WHERE job_name = ? ORDER BY id"
_INSERT_JOB = ("INSERT INTO jobs (name, status, spec, key_salt, backend, created_at, updated_at, "
               "owner, attempt, handle) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0, '{}')")
_INSERT_EVENT = "INSERT INTO job_events (job_name, status, at, reason) VALUES (?, ?, ?, ?)"


# Every column a batch update may change; COALESCE keeps what a change does not set.
_UPDATE_MANY = ("UPDATE jobs SET status = ?, updated_at = ?, started_at = ?, "
                "ended_at = COALESCE(?, ended_at), attempt = COALESCE(?, attempt), "
                "failure_kind = COALESCE(?, failure_kind), "
                "failure_reason = COALESCE(?, failure_reason), exit_code = COALESCE(?, exit_code), "
                "env_setup_seconds = COALESCE(?, env_setup_seconds) WHERE name = ?")


def _apply(row: dict[str, Any], change: JobChange, now: float) -> bool:
    """Apply *change* to the in-memory *row* if the move is allowed; say whether it was."""
    current: JobStatus = row["status"]
    if change.expected is not None and current != change.expected:
        return False
    if change.status == current or change.status not in TRANSITIONS[current]:
        return False  # a batch records moves only; an ended job never changes again
    # Times never go back within one job's history (a change may be recorded late).
    at = max(now if change.at is None else _ts(change.at), row["last"])
    row["status"] = change.status
    row["last"] = at
    row["updated_at"] = at
    if change.status == JobStatus.RUNNING and row["started_at"] is None:
        row["started_at"] = at
    if change.status.is_terminal:
        row["ended_at"] = at
    for key in ("attempt", "exit_code", "env_setup_seconds"):
        value = getattr(change, key)
        if value is not None:
            row[key] = value
    if change.failure_kind is not None:
        row["failure_kind"] = change.failure_kind.value
    if change.reason is not None and change.status == JobStatus.FAILED:
        row["failure_reason"] = change.reason
    return True


def _chunks(names: Sequence[str], size: int = 500) -> Iterator[Sequence[str]]:
    """Bounded IN lists (SQLite limits bound parameters)."""
    for i in range(0, len(names), size):
        yield names[i:i + size]


def _marks(values: Sequence[Any]) -> str:
    return ", ".join("?" for _ in values)


def _record(row: Any, events: Any) -> JobRecord:
    c = _COL
    return JobRecord(
        name=JobName(row[c["name"]]),
        spec=JobSpec.from_json(json.loads(row[c["spec"]])),
        status=JobStatus(row[c["status"]]),
        created_at=_dt(row[c["created_at"]]),
        updated_at=_dt(row[c["updated_at"]]),
        started_at=_dt(row[c["started_at"]]),
        ended_at=_dt(row[c["ended_at"]]),
        attempt=row[c["attempt"]] or 0,
        failure_kind=FailureKind(row[c["failure_kind"]]) if row[c["failure_kind"]] else None,
        failure_reason=row[c["failure_reason"]],
        exit_code=row[c["exit_code"]],
        backend=row[c["backend"]],
        handle=json.loads(row[c["handle"]] or "{}"),
        env_setup_seconds=row[c["env_setup_seconds"]],
        owner=row[c["owner"]],
        events=tuple(JobEvent(JobStatus(e[0]), _dt(e[1]), e[2])
                     for e in events),
    )


def _current_revision(url: str) -> str | None:
    engine = _make_engine(url)
    try:
        with engine.connect() as conn:
            if not sa.inspect(conn).has_table("alembic_version"):
                return None
            return conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()
    except sa.exc.DBAPIError as e:  # SQLite's kinds each get their cause and remedy
        raise _diagnose.explain(e, url, redact_url(url), doing="open") from e
    finally:
        engine.dispose()


#: pg_advisory_lock key that serialises schema creation on one PostgreSQL database.
_PG_MIGRATION_LOCK = 0x5348_4F41_4C00  # "SHOAL"


@contextmanager
def _migration_lock(url: str) -> Iterator[None]:
    """Serialise schema creation between processes sharing one database."""
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() == "postgresql":
        # Without it, two processes creating the schema at once deadlock or fail on
        # "relation already exists".
        engine = _make_engine(url)
        try:
            with engine.connect() as conn:
                conn.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": _PG_MIGRATION_LOCK})
                conn.commit()
                try:
                    yield
                finally:
                    conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"),
                                 {"k": _PG_MIGRATION_LOCK})
                    conn.commit()
        finally:
            engine.dispose()
        return
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        yield
        return
    import fcntl

    Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    lock = os.open(f"{parsed.database}.migrate.lock", os.O_RDWR | os.O_CREAT, 0o600)
    with os.fdopen(lock, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
