"""The SQL metadata store: SQLite (WAL, many processes) by default, PostgreSQL for teams.

Rows become frozen ``core`` records at this boundary; SQLAlchemy errors never leave it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError, OperationalError, SQLAlchemyError

from shoal.core.clock import Clock, SystemClock
from shoal.core.jobs import (
    FailureKind,
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
from shoal.storage.sql.schema import SCHEMA_REVISION, job_events, jobs

__all__ = ["SCHEMA_REVISION", "SqlMetadataStore", "redact_url", "upgrade_schema"]

_MIGRATIONS = Path(__file__).parent / "migrations"


def redact_url(url: str) -> str:
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:  # an unparsable URL is shown as given; it holds no parsed password
        return url


def _ts(dt: datetime) -> float:
    return dt.timestamp()


def _dt(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


def _make_engine(url: str) -> Engine:
    try:
        parsed = sa.engine.make_url(url)
    except sa.exc.ArgumentError as e:
        raise MetadataStoreError(f"invalid metadata URL {url!r}: {e}. Use sqlite:///PATH or "
                                 "postgresql+psycopg://USER@HOST/DB", url=url) from e
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database
        if db and db != ":memory:":
            Path(db).parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(url, connect_args={"timeout": 60, "check_same_thread": False})

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
    return sa.create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=10)


def upgrade_schema(url: str) -> str:
    """Bring the database at *url* to the schema this code expects; return the revision."""
    from alembic import command
    from alembic.config import Config

    engine = _make_engine(url)
    try:
        with engine.connect().execution_options(shoal_write=True) as conn:
            cfg = Config()
            cfg.set_main_option("script_location", str(_MIGRATIONS))
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
            conn.commit()
    except SQLAlchemyError as e:
        raise MetadataStoreError(f"cannot upgrade {redact_url(url)}: {e}", url=redact_url(url)) from e
    finally:
        engine.dispose()
    return SCHEMA_REVISION


class SqlMetadataStore:
    """Jobs and their history in a SQL database."""

    def __init__(self, engine: Engine, url: str, *, clock: Clock | None = None) -> None:
        self._engine = engine
        self._url = url
        self._clock = clock or SystemClock()

    @classmethod
    def open(cls, url: str, *, clock: Clock | None = None, create: bool = False) -> SqlMetadataStore:
        """Connect and check the schema. *create* builds an empty database's schema."""
        revision = _current_revision(url)
        if revision is None and create:
            with _migration_lock(url):
                if _current_revision(url) is None:
                    upgrade_schema(url)
                revision = _current_revision(url)
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
        self._engine.dispose()

    def after_fork(self) -> None:
        """Drop connections inherited from a parent process without closing them."""
        self._engine.dispose(close=False)

    @contextmanager
    def _tx(self, *, write: bool) -> Iterator[Connection]:
        try:
            with self._engine.connect().execution_options(shoal_write=write) as conn:
                with conn.begin():
                    yield conn
        except (OperationalError, sa.exc.InterfaceError, sa.exc.ProgrammingError) as e:
            raise MetadataStoreError(
                f"metadata store {redact_url(self._url)} failed: {e.orig or e}",
                url=redact_url(self._url)) from e

    # --- jobs -------------------------------------------------------------------------

    def create_job(self, spec: JobSpec, *, secret: str, backend: str) -> JobRecord:
        now = _ts(self._clock.now())
        try:
            with self._tx(write=True) as c:
                c.execute(jobs.insert().values(
                    name=spec.name, status=JobStatus.PENDING.value,
                    spec=json.dumps(spec.to_json(), sort_keys=True), secret=secret,
                    backend=backend, created_at=now, updated_at=now, attempt=0, handle="{}"))
                c.execute(job_events.insert().values(job_name=spec.name,
                                                     status=JobStatus.PENDING.value, at=now))
        except IntegrityError as e:
            raise AlreadyExistsError(f"a job named {spec.name!r} already exists; choose another "
                                     "job_name", job=spec.name) from e
        return self.get_job(spec.name)

    def find_job(self, name: str) -> JobRecord | None:
        with self._tx(write=False) as c:
            row = c.execute(sa.select(jobs).where(jobs.c.name == name)).mappings().first()
            if row is None:
                return None
            events = c.execute(sa.select(job_events).where(job_events.c.job_name == name)
                               .order_by(job_events.c.id)).mappings().all()
        return _record(row, events)

    def get_job(self, name: str) -> JobRecord:
        rec = self.find_job(name)
        if rec is None:
            raise JobNotFound(f"no job named {name!r} in {redact_url(self._url)}; "
                              "'shoal jobs list' shows the jobs there", job=name)
        return rec

    def get_job_secret(self, name: str) -> str:
        with self._tx(write=False) as c:
            secret = c.execute(sa.select(jobs.c.secret).where(jobs.c.name == name)).scalar()
        if secret is None:
            raise JobNotFound(f"no job named {name!r}", job=name)
        return str(secret)

    def list_jobs(self, query: JobQuery) -> list[JobRecord]:
        stmt = sa.select(jobs)
        if query.statuses:
            stmt = stmt.where(jobs.c.status.in_([s.value for s in query.statuses]))
        if query.name_prefix:
            stmt = stmt.where(jobs.c.name.startswith(query.name_prefix, autoescape=True))
        if query.name_contains:
            stmt = stmt.where(jobs.c.name.contains(query.name_contains, autoescape=True))
        if query.created_after is not None:
            stmt = stmt.where(jobs.c.created_at >= _ts(query.created_after))
        stmt = stmt.order_by(jobs.c.created_at.desc(), jobs.c.name.desc()).limit(query.limit)
        with self._tx(write=False) as c:
            rows = c.execute(stmt).mappings().all()
        return [_record(r, ()) for r in rows]

    def iter_unfinished(self) -> Iterator[JobRecord]:
        live = [s.value for s in JobStatus if not s.is_terminal]
        with self._tx(write=False) as c:
            rows = c.execute(sa.select(jobs).where(jobs.c.status.in_(live))).mappings().all()
        return iter([_record(r, ()) for r in rows])

    def update_job(
        self, name: str, *, status: JobStatus, expected: JobStatus | None = None,
        reason: str | None = None, failure_kind: FailureKind | None = None,
        exit_code: int | None = None, attempt: int | None = None,
        handle: Mapping[str, Any] | None = None, env_setup_seconds: float | None = None,
    ) -> JobRecord:
        """Move *name* to *status* atomically, checking the allowed transitions."""
        now = _ts(self._clock.now())
        with self._tx(write=True) as c:
            stmt = sa.select(jobs.c.status, jobs.c.started_at).where(jobs.c.name == name)
            if c.dialect.name == "postgresql":
                stmt = stmt.with_for_update()
            row = c.execute(stmt).first()
            if row is None:
                raise JobNotFound(f"no job named {name!r}", job=name)
            current = JobStatus(row.status)
            if expected is not None and current != expected:
                raise InvalidTransitionError(
                    f"job {name!r} is {current}, not {expected}; it cannot move to {status}",
                    job=name, current=str(current), new=str(status))
            if current != status:
                check_transition(name, current, status)
            values: dict[str, Any] = {"status": status.value, "updated_at": now}
            if status == JobStatus.RUNNING and row.started_at is None:
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
            c.execute(jobs.update().where(jobs.c.name == name).values(**values))
            if current != status:
                c.execute(job_events.insert().values(job_name=name, status=status.value,
                                                     at=now, reason=reason))
        return self.get_job(name)

    def set_handle(self, name: str, handle: Mapping[str, Any]) -> None:
        with self._tx(write=True) as c:
            result = c.execute(jobs.update().where(jobs.c.name == name)
                               .values(handle=json.dumps(dict(handle))))
        if result.rowcount == 0:
            raise JobNotFound(f"no job named {name!r}", job=name)

    def delete_all(self) -> None:
        """Remove every row (test clean-up on a shared PostgreSQL database)."""
        with self._tx(write=True) as c:
            c.execute(job_events.delete())
            c.execute(jobs.delete())


def _record(row: Mapping[str, Any], events: Any) -> JobRecord:
    return JobRecord(
        name=JobName(row["name"]),
        spec=JobSpec.from_json(json.loads(row["spec"])),
        status=JobStatus(row["status"]),
        created_at=_dt(row["created_at"]),  # type: ignore[arg-type]
        updated_at=_dt(row["updated_at"]),  # type: ignore[arg-type]
        started_at=_dt(row["started_at"]),
        ended_at=_dt(row["ended_at"]),
        attempt=row["attempt"] or 0,
        failure_kind=FailureKind(row["failure_kind"]) if row["failure_kind"] else None,
        failure_reason=row["failure_reason"],
        exit_code=row["exit_code"],
        backend=row["backend"],
        handle=json.loads(row["handle"] or "{}"),
        env_setup_seconds=row["env_setup_seconds"],
        events=tuple(JobEvent(JobStatus(e["status"]), _dt(e["at"]), e["reason"])  # type: ignore[arg-type]
                     for e in events),
    )


def _current_revision(url: str) -> str | None:
    engine = _make_engine(url)
    try:
        with engine.connect() as conn:
            if not sa.inspect(conn).has_table("alembic_version"):
                return None
            return conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()
    except OperationalError as e:
        raise MetadataStoreError(
            f"cannot open metadata database {redact_url(url)}: {e.orig}. Check that the "
            "server runs and the database exists (createdb), then run "
            f"'shoal db upgrade {redact_url(url)}'.", url=redact_url(url)) from e
    finally:
        engine.dispose()


@contextmanager
def _migration_lock(url: str) -> Iterator[None]:
    """Serialise schema creation between processes sharing one SQLite file."""
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        yield
        return
    import fcntl

    Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    with open(f"{parsed.database}.migrate.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
