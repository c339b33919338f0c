"""Tables of the metadata store (SQLAlchemy Core). Alembic migrations create them."""

from __future__ import annotations

import sqlalchemy as sa

from shoal.core.jobs import FailureKind, JobStatus

__all__ = ["SCHEMA_REVISION", "job_events", "jobs", "metadata"]

#: The Alembic revision this code expects; tests check it equals the migrations' head.
SCHEMA_REVISION = "0001"

metadata = sa.MetaData()


def _in(column: str, values: type[JobStatus] | type[FailureKind]) -> sa.CheckConstraint:
    allowed = ", ".join(f"'{v.value}'" for v in values)
    return sa.CheckConstraint(f"{column} IN ({allowed})", name=f"ck_{column}_valid")


jobs = sa.Table(
    "jobs", metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("spec", sa.Text, nullable=False),
    sa.Column("secret", sa.String(128), nullable=False),
    sa.Column("backend", sa.String(32), nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
    sa.Column("started_at", sa.Float),
    sa.Column("ended_at", sa.Float),
    sa.Column("attempt", sa.Integer, nullable=False, default=0),
    sa.Column("failure_kind", sa.String(32)),
    sa.Column("failure_reason", sa.Text),
    sa.Column("exit_code", sa.Integer),
    sa.Column("handle", sa.Text, nullable=False, default="{}"),
    sa.Column("env_setup_seconds", sa.Float),
    _in("status", JobStatus),
    sa.Index("ix_jobs_status", "status"),
    sa.Index("ix_jobs_created_at", "created_at"),
)

job_events = sa.Table(
    "job_events", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_name", sa.String(64), sa.ForeignKey("jobs.name", ondelete="CASCADE"),
              nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("at", sa.Float, nullable=False),
    sa.Column("reason", sa.Text),
    sa.Index("ix_job_events_job", "job_name"),
)
