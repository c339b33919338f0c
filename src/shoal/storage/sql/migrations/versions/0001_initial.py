"""Jobs and their status history.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_STATUSES = "'pending', 'starting', 'running', 'stopping', 'completed', 'failed', 'stopped'"


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("spec", sa.Text, nullable=False),
        sa.Column("secret", sa.String(128), nullable=False),
        sa.Column("backend", sa.String(32), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.Column("started_at", sa.Float),
        sa.Column("ended_at", sa.Float),
        sa.Column("attempt", sa.Integer, nullable=False, server_default="0"),
        sa.Column("failure_kind", sa.String(32)),
        sa.Column("failure_reason", sa.Text),
        sa.Column("exit_code", sa.Integer),
        sa.Column("handle", sa.Text, nullable=False, server_default="{}"),
        sa.Column("env_setup_seconds", sa.Float),
        sa.CheckConstraint(f"status IN ({_STATUSES})", name="ck_status_valid"),
    )
    op.create_index("ix_jobs_status", "jobs", ["status"])
    op.create_index("ix_jobs_created_at", "jobs", ["created_at"])
    op.create_table(
        "job_events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_name", sa.String(64), sa.ForeignKey("jobs.name", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("reason", sa.Text),
    )
    op.create_index("ix_job_events_job", "job_events", ["job_name"])


def downgrade() -> None:
    op.drop_table("job_events")
    op.drop_table("jobs")
