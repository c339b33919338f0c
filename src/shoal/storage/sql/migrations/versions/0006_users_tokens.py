"""Users and API tokens of a team server (``shoal server``).

A token is stored as its SHA-256 only (``token_hash``); ``shoal server init`` makes the first
admin. Nothing else changes: the embedded default has no users and needs none.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("is_admin", sa.Boolean, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("user_name", sa.String(64), sa.ForeignKey("users.name", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("scope", sa.String(8), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float),
        sa.Column("revoked_at", sa.Float),
        sa.UniqueConstraint("token_hash", name="uq_api_tokens_hash"),
        sa.UniqueConstraint("user_name", "name", name="uq_api_tokens_user_name"),
        sa.CheckConstraint("scope IN ('read', 'write', 'admin')",
                           name="ck_api_tokens_scope_valid"),
    )


def downgrade() -> None:
    op.drop_table("api_tokens")
    op.drop_table("users")
