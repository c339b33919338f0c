"""Small payloads in the database: ``job_payloads``.

A trivial job's four payloads (function, arguments, result or exception) took two files and a
directory each in the artifact store: about 40 KB of disk blocks for 1 KB of content. From
0005 on a payload under the inline threshold (``shoal.jobs._payloads``) is one row here, still
HMAC-signed under its job's key; larger ones stay files. Jobs stored before keep their files,
which are still read.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_payloads",
        sa.Column("job_name", sa.String(64), sa.ForeignKey("jobs.name", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("kind", sa.String(16), primary_key=True),
        sa.Column("data", sa.LargeBinary, nullable=False),
        sa.Column("metadata", sa.LargeBinary, nullable=False),
    )


def downgrade() -> None:
    # The old code reads payloads from files only: jobs whose payloads sat here lose them.
    op.drop_table("job_payloads")
