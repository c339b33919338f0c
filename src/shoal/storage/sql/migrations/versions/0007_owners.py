"""Owners: the user who created each job, experiment, run and endpoint.

A team server (``shoal server``) records the caller's user; only that user or an admin may
cancel, delete or change the record. Rows written before, and everything written without a
server, belong to ``local``.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_TABLES = ("jobs", "experiments", "runs", "endpoints")


def upgrade() -> None:
    for table in _TABLES:
        # A server default fills the rows already there (SQLite and PostgreSQL alike).
        op.add_column(table, sa.Column("owner", sa.String(64), nullable=False,
                                       server_default="local"))


def downgrade() -> None:
    for table in _TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_column("owner")
