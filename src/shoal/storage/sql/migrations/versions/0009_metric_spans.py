"""Coarser thinned reads and each series' last point: ``metric_spans``, ``metric_series.last_*``.

A chart of 20 runs x 100,000 points read 6,250 blocks of 16 points a series and thinned them
in Python (the page took ~1.1-1.5 s). From 0009 on, writing points also keeps the lowest and
highest point of each block of 64, 256, 1,024 and 4,096 points (``METRIC_SPANS``), so
``metric_buckets`` reads the coarsest level that still has a block per pixel column (1,562
blocks of 64 for 100,000 points on a 1,362-pixel chart). It also keeps each series' last
point (by time, then step, then position), so the runs table reads a run's last values, and
sorts an experiment's runs by one, without ranking every point. The upgrade fills both: the
spans from the 16-point blocks (ties keep the earliest, as writing does), the last points
from the points.

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# schema.METRIC_BLOCK and METRIC_SPANS when this revision was written; they must never change.
_BLOCK = 16
_SPANS = (64, 256, 1024, 4096)
# The newest point first: as the store's _POINT_ORDER_DESC (steps without a value count lowest).
_NEWEST = ("m.timestamp DESC, CASE WHEN m.step IS NULL THEN 0 ELSE 1 END DESC, m.step DESC, "
           "m.id DESC")


def upgrade() -> None:
    op.add_column("metric_series", sa.Column("last_value", sa.Float))
    op.add_column("metric_series", sa.Column("last_ts", sa.Float))
    op.add_column("metric_series", sa.Column("last_step", sa.BigInteger))
    op.create_table(
        "metric_spans",
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
    newest = ("(SELECT m.{col} FROM metrics m WHERE m.owner = metric_series.owner AND "
              f"m.name = metric_series.name ORDER BY {_NEWEST} LIMIT 1)")
    op.execute("UPDATE metric_series SET " + ", ".join(
        f"{to} = {newest.format(col=col)}"
        for to, col in (("last_value", "value"), ("last_ts", "timestamp"),
                        ("last_step", "step"))))
    for size in _SPANS:
        per = size // _BLOCK  # 16-point blocks per span
        op.execute(
            "INSERT INTO metric_spans (owner, name, size, block, lo_value, lo_step, lo_ts, "
            "hi_value, hi_step, hi_ts) "
            f"WITH ranked AS (SELECT owner, name, block / {per} AS span, lo_value, lo_step, "
            "lo_ts, hi_value, hi_step, hi_ts, "
            f"ROW_NUMBER() OVER (PARTITION BY owner, name, block / {per} "
            "ORDER BY lo_value, block) AS lo, "
            f"ROW_NUMBER() OVER (PARTITION BY owner, name, block / {per} "
            "ORDER BY hi_value DESC, block) AS hi FROM metric_blocks) "
            f"SELECT owner, name, {size}, span, "
            "MAX(CASE WHEN lo = 1 THEN lo_value END), MAX(CASE WHEN lo = 1 THEN lo_step END), "
            "MAX(CASE WHEN lo = 1 THEN lo_ts END), MAX(CASE WHEN hi = 1 THEN hi_value END), "
            "MAX(CASE WHEN hi = 1 THEN hi_step END), MAX(CASE WHEN hi = 1 THEN hi_ts END) "
            "FROM ranked WHERE lo = 1 OR hi = 1 GROUP BY owner, name, span")


def downgrade() -> None:
    op.drop_table("metric_spans")
    with op.batch_alter_table("metric_series") as batch:
        for column in ("last_step", "last_ts", "last_value"):
            batch.drop_column(column)
