"""Endpoints and their server instances.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_ENDPOINT_STATUSES = "'Creating', 'InService', 'Updating', 'Failed', 'Deleting'"
_INSTANCE_STATUSES = "'Pending', 'InService', 'Restarting', 'Failed'"


def upgrade() -> None:
    op.create_table(
        "endpoints",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("model_data", sa.Text, nullable=False),
        sa.Column("config", sa.Text, nullable=False),
        sa.Column("failure_reason", sa.Text),
        sa.Column("supervisor", sa.Text, nullable=False, server_default="{}"),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.CheckConstraint(f"status IN ({_ENDPOINT_STATUSES})", name="ck_endpoints_status_valid"),
    )
    op.create_table(
        "endpoint_instances",
        sa.Column("endpoint_name", sa.String(63),
                  sa.ForeignKey("endpoints.name", ondelete="CASCADE"), primary_key=True),
        sa.Column("instance_index", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("port", sa.Integer, nullable=False),
        sa.Column("pid", sa.Integer),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("restarts", sa.Integer, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.CheckConstraint(f"status IN ({_INSTANCE_STATUSES})",
                           name="ck_endpoint_instances_status_valid"),
    )


def downgrade() -> None:
    op.drop_table("endpoint_instances")
    op.drop_table("endpoints")
