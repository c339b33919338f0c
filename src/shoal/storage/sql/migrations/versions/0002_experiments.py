"""Experiments, runs (parameters, tags, artifacts, linked jobs) and one table of metrics.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_RUN_STATUSES = "'InProgress', 'Completed', 'Failed', 'Stopped'"


def _run_id() -> sa.Column[int]:
    return sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"),
                     primary_key=True)


def upgrade() -> None:
    op.create_table(
        "experiments",
        sa.Column("name", sa.String(120), primary_key=True),
        sa.Column("display_name", sa.String(255)),
        sa.Column("tags", sa.Text, nullable=False, server_default="{}"),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("experiment_name", sa.String(120),
                  sa.ForeignKey("experiments.name", ondelete="CASCADE"), nullable=False),
        sa.Column("run_name", sa.String(120), nullable=False),
        sa.Column("display_name", sa.String(255)),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("ended_at", sa.Float),
        sa.UniqueConstraint("experiment_name", "run_name", name="uq_runs_experiment_run"),
        sa.CheckConstraint(f"status IN ({_RUN_STATUSES})", name="ck_runs_status_valid"),
    )
    op.create_table(
        "run_parameters",
        _run_id(),
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )
    op.create_table(
        "run_tags",
        _run_id(),
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )
    op.create_table(
        "run_artifacts",
        _run_id(),
        sa.Column("is_output", sa.Boolean, primary_key=True),
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
        sa.Column("media_type", sa.String(255)),
        sa.Column("artifact_type", sa.String(64)),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_table(
        "run_jobs",
        _run_id(),
        sa.Column("job_name", sa.String(64), primary_key=True),
        sa.Column("linked_at", sa.Float, nullable=False),
    )
    op.create_index("ix_run_jobs_job", "run_jobs", ["job_name"])
    op.create_table(
        "metrics",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True,
                  autoincrement=True),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("value", sa.Float, nullable=False),
        sa.Column("step", sa.BigInteger),
        sa.Column("timestamp", sa.Float, nullable=False),
    )
    op.create_index("ix_metrics_owner_name", "metrics", ["owner", "name"])


def downgrade() -> None:
    op.drop_table("metrics")
    op.drop_table("run_jobs")
    op.drop_table("run_artifacts")
    op.drop_table("run_tags")
    op.drop_table("run_parameters")
    op.drop_table("runs")
    op.drop_table("experiments")
