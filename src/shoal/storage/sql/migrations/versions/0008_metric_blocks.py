"""Thinned metric reads: ``metric_series`` and ``metric_blocks``.

A chart of a 100,000-point series read every point (~0.3 s on SQLite) to draw 2 per pixel
column; bucketing in SQL still scans them all (~0.1 s a series). From 0008 on, writing points
also keeps each series' count and, per block of ``METRIC_BLOCK`` (16) points in the order
they were added, its lowest and highest point, so ``metric_buckets`` reads a long series'
blocks (1/8 of its rows) instead. The upgrade fills both from the points already stored.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_BLOCK = 16  # schema.METRIC_BLOCK when this revision was written; it must never change


def upgrade() -> None:
    op.create_table(
        "metric_series",
        sa.Column("owner", sa.String(255), primary_key=True),
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("points", sa.BigInteger, nullable=False),
        sa.Column("stepless", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "metric_blocks",
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
    op.execute(
        "INSERT INTO metric_series (owner, name, points, stepless) "
        "SELECT owner, name, COUNT(*), COUNT(*) - COUNT(step) FROM metrics GROUP BY owner, name")
    # Positions by id (the order points were added), as the store numbers new ones.
    op.execute(
        "INSERT INTO metric_blocks (owner, name, block, lo_value, lo_step, lo_ts, hi_value, "
        "hi_step, hi_ts) "
        "WITH placed AS (SELECT owner, name, value, step, timestamp, id, "
        f"(ROW_NUMBER() OVER (PARTITION BY owner, name ORDER BY id) - 1) / {_BLOCK} AS block "
        "FROM metrics), "
        "ranked AS (SELECT placed.*, "
        "ROW_NUMBER() OVER (PARTITION BY owner, name, block ORDER BY value, id) AS lo, "
        "ROW_NUMBER() OVER (PARTITION BY owner, name, block ORDER BY value DESC, id) AS hi "
        "FROM placed) "
        "SELECT owner, name, block, "
        "MAX(CASE WHEN lo = 1 THEN value END), MAX(CASE WHEN lo = 1 THEN step END), "
        "MAX(CASE WHEN lo = 1 THEN timestamp END), MAX(CASE WHEN hi = 1 THEN value END), "
        "MAX(CASE WHEN hi = 1 THEN step END), MAX(CASE WHEN hi = 1 THEN timestamp END) "
        "FROM ranked WHERE lo = 1 OR hi = 1 GROUP BY owner, name, block")


def downgrade() -> None:
    op.drop_table("metric_blocks")
    op.drop_table("metric_series")
