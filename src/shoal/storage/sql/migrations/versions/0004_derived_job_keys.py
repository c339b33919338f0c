"""Job keys are derived from the user's secret: the stored keys are removed.

Until 0003 each job's HMAC key sat in ``jobs.secret``, where any job that could read the
metadata store could take another job's key and forge its result. From 0004 on a job's keys
derive from its user's secret (a file outside every store) and a random salt, which is all the
column holds now (``jobs.key_salt``). The keys of jobs recorded before are blanked: their
payloads cannot be verified any more, and shoal says so for such a job. On SQLite the old
bytes are overwritten (``secure_delete``); on PostgreSQL the old row versions stay on disk until
``VACUUM FULL jobs`` (run it after the upgrade if the database files may be read by others).

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.alter_column("jobs", "secret", new_column_name="key_salt",
                    existing_type=sa.String(128), existing_nullable=False)
    if op.get_bind().dialect.name == "sqlite":
        # Overwrite the old values' bytes too, not only their place in the table.
        op.execute("PRAGMA secure_delete = ON")
    op.execute("UPDATE jobs SET key_salt = ''")


def downgrade() -> None:
    # The old code reads a key here; it finds none, and refuses those jobs' payloads.
    op.alter_column("jobs", "key_salt", new_column_name="secret",
                    existing_type=sa.String(128), existing_nullable=False)
    op.execute("UPDATE jobs SET secret = ''")
