"""Tables of the metadata store (SQLAlchemy Core). Alembic migrations create them."""

from __future__ import annotations

from enum import StrEnum

import sqlalchemy as sa

from shoal.core.auth import Scope
from shoal.core.endpoints import EndpointStatus, InstanceStatus
from shoal.core.experiments import RunStatus
from shoal.core.jobs import JobStatus

__all__ = ["METRIC_BLOCK", "METRIC_SPANS", "SCHEMA_REVISION", "api_tokens", "endpoint_instances",
           "endpoints", "experiments", "job_events", "job_payloads", "jobs", "metadata",
           "metric_blocks", "metric_series", "metric_spans", "metrics", "run_artifacts",
           "run_jobs", "run_parameters", "run_tags", "runs", "users"]

#: The Alembic revision this code expects; tests check it equals the migrations' head.
SCHEMA_REVISION = "0009"

metadata = sa.MetaData()


def _in(column: str, values: type[StrEnum], *, name: str | None = None) -> sa.CheckConstraint:
    allowed = ", ".join(f"'{v.value}'" for v in values)
    return sa.CheckConstraint(f"{column} IN ({allowed})", name=name or f"ck_{column}_valid")


def _owner() -> sa.Column[str]:
    return sa.Column("owner", sa.String(64), nullable=False, server_default="local")


jobs = sa.Table(
    "jobs", metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("spec", sa.Text, nullable=False),
    # The random salt of the job's keys, which derive from the user's secret (never stored):
    # useless alone. "" for jobs recorded before revision 0004 (their stored keys were removed).
    sa.Column("key_salt", sa.String(128), nullable=False),
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
    # The user who created the row (revision 0007): "local" without a team server.
    _owner(),
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

# --- small payloads (revision 0005) --------------------------------------------------------

# A job's small payloads (function, arguments, results, exception), each its pickle and its
# envelope's metadata (format, versions, HMAC-SHA256 under the job's key): what would otherwise
# take two files and a directory each in the artifact store (jobs/_payloads.py).
job_payloads = sa.Table(
    "job_payloads", metadata,
    sa.Column("job_name", sa.String(64), sa.ForeignKey("jobs.name", ondelete="CASCADE"),
              primary_key=True),
    sa.Column("kind", sa.String(16), primary_key=True),
    sa.Column("data", sa.LargeBinary, nullable=False),
    sa.Column("metadata", sa.LargeBinary, nullable=False),
)

# --- experiments (revision 0002) -----------------------------------------------------------

experiments = sa.Table(
    "experiments", metadata,
    sa.Column("name", sa.String(120), primary_key=True),
    sa.Column("display_name", sa.String(255)),
    sa.Column("tags", sa.Text, nullable=False, default="{}"),
    sa.Column("created_at", sa.Float, nullable=False),
    # The user who created the row (revision 0007): "local" without a team server.
    _owner(),
)

runs = sa.Table(
    "runs", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("experiment_name", sa.String(120),
              sa.ForeignKey("experiments.name", ondelete="CASCADE"), nullable=False),
    sa.Column("run_name", sa.String(120), nullable=False),
    sa.Column("display_name", sa.String(255)),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("ended_at", sa.Float),
    # The user who created the row (revision 0007): "local" without a team server.
    _owner(),
    sa.UniqueConstraint("experiment_name", "run_name", name="uq_runs_experiment_run"),
    _in("status", RunStatus, name="ck_runs_status_valid"),
)


def _run_id() -> sa.Column[int]:
    return sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"),
                     primary_key=True)


run_parameters = sa.Table(
    "run_parameters", metadata,
    _run_id(),
    sa.Column("name", sa.String(255), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),  # JSON: keeps str, int, float and bool apart
)

run_tags = sa.Table(
    "run_tags", metadata,
    _run_id(),
    sa.Column("key", sa.String(255), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)

run_artifacts = sa.Table(
    "run_artifacts", metadata,
    _run_id(),
    sa.Column("is_output", sa.Boolean, primary_key=True),
    sa.Column("name", sa.String(255), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
    sa.Column("media_type", sa.String(255)),
    sa.Column("artifact_type", sa.String(64)),
    sa.Column("created_at", sa.Float, nullable=False),
)

run_jobs = sa.Table(
    "run_jobs", metadata,
    _run_id(),
    # No foreign key to jobs: a job may be linked before its record exists, or live in
    # another store.
    sa.Column("job_name", sa.String(64), primary_key=True),
    sa.Column("linked_at", sa.Float, nullable=False),
    sa.Index("ix_run_jobs_job", "job_name"),
)

metrics = sa.Table(
    "metrics", metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True,
              autoincrement=True),
    # "run:<experiment>/<run>" or "job:<name>": one table for every series.
    sa.Column("owner", sa.String(255), nullable=False),
    sa.Column("name", sa.String(255), nullable=False),
    sa.Column("value", sa.Float, nullable=False),
    sa.Column("step", sa.BigInteger),
    sa.Column("timestamp", sa.Float, nullable=False),
    sa.Index("ix_metrics_owner_name", "owner", "name"),
)

# --- thinned metric reads (revision 0008) ---------------------------------------------------

#: Points per block of ``metric_blocks``: a chart reads a series' blocks, not its points, once
#: it has more than ``METRIC_BLOCK`` points per pixel column.
METRIC_BLOCK = 16

#: Points per block of each coarser level (``metric_spans``, revision 0009): a chart reads the
#: coarsest level that still has a block per pixel column, so at most ~4 blocks per column.
METRIC_SPANS = (64, 256, 1024, 4096)

# Each series' point count (its next point's position), how many points lack a step, and
# (revision 0009) its last point, by time then step then position: the runs table's value.
metric_series = sa.Table(
    "metric_series", metadata,
    sa.Column("owner", sa.String(255), primary_key=True),
    sa.Column("name", sa.String(255), primary_key=True),
    sa.Column("points", sa.BigInteger, nullable=False),
    sa.Column("stepless", sa.BigInteger, nullable=False),
    sa.Column("last_value", sa.Float),
    sa.Column("last_ts", sa.Float),
    sa.Column("last_step", sa.BigInteger),
)

# The lowest and the highest point of each block of METRIC_BLOCK points of a series, by
# position (the order they were added).
metric_blocks = sa.Table(
    "metric_blocks", metadata,
    sa.Column("owner", sa.String(255), primary_key=True),
    sa.Column("name", sa.String(255), primary_key=True),
    sa.Column("block", sa.BigInteger, primary_key=True),
    sa.Column("lo_value", sa.Float, nullable=False),
    sa.Column("lo_step", sa.BigInteger),
    sa.Column("lo_ts", sa.Float, nullable=False),
    sa.Column("hi_value", sa.Float, nullable=False),
    sa.Column("hi_step", sa.BigInteger),
    sa.Column("hi_ts", sa.Float, nullable=False),
)

# The same for blocks of each size in METRIC_SPANS (revision 0009): block = position // size.
metric_spans = sa.Table(
    "metric_spans", metadata,
    sa.Column("owner", sa.String(255), primary_key=True),
    sa.Column("name", sa.String(255), primary_key=True),
    sa.Column("size", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("block", sa.BigInteger, primary_key=True),
    sa.Column("lo_value", sa.Float, nullable=False),
    sa.Column("lo_step", sa.BigInteger),
    sa.Column("lo_ts", sa.Float, nullable=False),
    sa.Column("hi_value", sa.Float, nullable=False),
    sa.Column("hi_step", sa.BigInteger),
    sa.Column("hi_ts", sa.Float, nullable=False),
)

# --- endpoints (revision 0003) -------------------------------------------------------------

endpoints = sa.Table(
    "endpoints", metadata,
    sa.Column("name", sa.String(63), primary_key=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("model_data", sa.Text, nullable=False),
    sa.Column("config", sa.Text, nullable=False),  # JSON: EndpointConfig.to_json()
    sa.Column("failure_reason", sa.Text),
    sa.Column("supervisor", sa.Text, nullable=False, default="{}"),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
    # The user who created the row (revision 0007): "local" without a team server.
    _owner(),
    _in("status", EndpointStatus, name="ck_endpoints_status_valid"),
)

endpoint_instances = sa.Table(
    "endpoint_instances", metadata,
    sa.Column("endpoint_name", sa.String(63),
              sa.ForeignKey("endpoints.name", ondelete="CASCADE"), primary_key=True),
    sa.Column("instance_index", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("port", sa.Integer, nullable=False),
    sa.Column("pid", sa.Integer),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("restarts", sa.Integer, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
    _in("status", InstanceStatus, name="ck_endpoint_instances_status_valid"),
)

# --- users and API tokens of a team server (revision 0006) ---------------------------------

users = sa.Table(
    "users", metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("is_admin", sa.Boolean, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
)

api_tokens = sa.Table(
    "api_tokens", metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("user_name", sa.String(64), sa.ForeignKey("users.name", ondelete="CASCADE"),
              nullable=False),
    sa.Column("name", sa.String(64), nullable=False),
    sa.Column("scope", sa.String(8), nullable=False),
    sa.Column("token_hash", sa.String(64), nullable=False),  # SHA-256 hex; never the token
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float),
    sa.Column("revoked_at", sa.Float),
    sa.UniqueConstraint("token_hash", name="uq_api_tokens_hash"),
    sa.UniqueConstraint("user_name", "name", name="uq_api_tokens_user_name"),
    _in("scope", Scope, name="ck_api_tokens_scope_valid"),
)
