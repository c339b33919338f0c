"""Metric series in the SQL metadata store (mixed into ``SqlMetadataStore``): points, and what
writing them keeps so that charts and the runs table never read every point.

Writing a batch appends its points (one ``executemany``) and, in the same transaction, keeps
per series its count and last point (``metric_series``) and the lowest and highest point of
each block of 16 points (``metric_blocks``) and of 64, 256, 1,024 and 4,096 points
(``metric_spans``), blocks by position (the order points were added). The coarser levels are
made from the batch's 16-point blocks, so they cost ~1/48 of a row per point. A chart
``buckets`` pixels wide reads the coarsest level that still has a block per pixel column
(``_level``), a short series its points: at most ~4 blocks a column whatever the length.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from shoal.core.downsample import MetricBuckets, thin_rows
from shoal.core.experiments import MetricPoint, MetricSummary
from shoal.errors import InvalidArgumentError
from shoal.storage.sql._dbapi import Dbapi
from shoal.storage.sql._runs import require_experiment
from shoal.storage.sql.schema import METRIC_BLOCK, METRIC_SPANS

__all__ = ["MetricTables", "read_level"]

#: A block row for the upserts: owner, name, block, then the low and the high point's
#: value, step and time.
_Block = tuple[Any, ...]
#: Each coarser level's size and how many blocks of the level below make one of its blocks.
_MERGES = tuple((size, size // finer) for finer, size in
                zip((METRIC_BLOCK, *METRIC_SPANS), METRIC_SPANS, strict=False))


def read_level(count: int, buckets: int) -> int:
    """Points per row of what a chart *buckets* pixels wide reads of a *count*-point series:
    the coarsest level with at least one block per pixel column (each gives its low and high
    point, so >= 2 points a column), 1 (the points) for a short series."""
    return max((size for size in (METRIC_BLOCK, *METRIC_SPANS) if count >= size * buckets),
               default=1)


class MetricTables:
    """The metric half of the SQL metadata store."""

    _db: Dbapi

    def add_metrics(self, owner: str, points: Sequence[MetricPoint]) -> None:
        """Append *points* to *owner*'s series, in one transaction."""
        if not points:
            return
        rows = [(owner, p.name, p.value, p.step, p.timestamp) for p in points]
        for _, name, value, _, ts in rows:
            if not (math.isfinite(value) and math.isfinite(ts)):
                raise InvalidArgumentError(f"metric {name!r} of {owner}: value {value!r} at "
                                           f"{ts!r} is not finite; nothing was stored",
                                           owner=owner, metric=name)
        by_name: dict[str, list[MetricPoint]] = {}
        for p in points:
            by_name.setdefault(p.name, []).append(p)
        sql = self._db.sql
        with self._db.tx(write=True) as cur:
            cur.executemany(sql(
                "INSERT INTO metrics (owner, name, value, step, timestamp) "
                "VALUES (?, ?, ?, ?, ?)"), rows)
            blocks: list[_Block] = []
            spans: list[_Block] = []
            for name, series in by_name.items():
                last = _newest(series)
                # Reserve the series' next positions (atomic: the row is locked or the
                # database is, so two writers never get the same ones).
                cur.execute(sql(_RESERVE_POSITIONS), (
                    owner, name, len(series), sum(p.step is None for p in series),
                    last.value, last.timestamp, last.step))
                row = cur.fetchone()
                assert row is not None
                level = _blocks(owner, name, int(row[0]) - len(series), series)
                blocks += level
                for size, per in _MERGES:
                    level = _coarser(level, per)
                    spans += [(*b[:2], size, *b[2:]) for b in level]
            cur.executemany(sql(_UPSERT_BLOCK), blocks)
            cur.executemany(sql(_UPSERT_SPAN), spans)

    def get_metrics(self, owner: str, name: str | None = None) -> list[MetricPoint]:
        """*owner*'s points (of metric *name*, or all, by name), in time then step order."""
        sql = "SELECT name, value, timestamp, step FROM metrics WHERE owner = ?"
        params: tuple[Any, ...] = (owner,)
        if name is not None:
            sql += " AND name = ?"
            params += (name,)
        with self._db.tx(write=False) as cur:
            cur.execute(self._db.sql(sql + " ORDER BY name, " + _POINT_ORDER), params)
            rows = cur.fetchall()
        return [MetricPoint(n, v, t, s) for n, v, t, s in rows]

    def last_metrics(self, owners: Sequence[str]) -> dict[str, dict[str, float]]:
        """The last value (by time, then step) of each metric of each of *owners*, one query
        per 500 owners: ``{owner: {name: value}}``; owners without metrics are left out."""
        wanted = list(dict.fromkeys(owners))
        out: dict[str, dict[str, float]] = {}
        with self._db.tx(write=False) as cur:
            for i in range(0, len(wanted), 500):
                chunk = wanted[i:i + 500]
                cur.execute(self._db.sql(
                    "SELECT owner, name, last_value FROM metric_series WHERE owner IN "
                    f"({', '.join('?' * len(chunk))}) AND last_value IS NOT NULL "
                    "ORDER BY owner, name"), chunk)
                for owner, name, value in cur.fetchall():
                    out.setdefault(owner, {})[name] = float(value)
        return out

    def last_metric_of_runs(self, experiment_name: str, name: str) -> dict[str, float]:
        """The last value of metric *name* of each run of the experiment that has it, in one
        query: ``{run name: value}``. ExperimentNotFound if there is no such experiment."""
        with self._db.tx(write=False) as cur:
            cur.execute(self._db.sql(
                "SELECT r.run_name, s.last_value FROM runs r JOIN metric_series s ON "
                "s.owner = 'run:' || r.experiment_name || '/' || r.run_name AND s.name = ? "
                "WHERE r.experiment_name = ? AND s.last_value IS NOT NULL"),
                (name, experiment_name))
            found = {str(run): float(value) for run, value in cur.fetchall()}
            if not found:
                require_experiment(self._db, cur, experiment_name)
        return found

    def metric_buckets(self, owner: str, name: str, buckets: int) -> MetricBuckets:
        """*owner*'s metric *name* thinned to at most ``2 * buckets`` points (the lowest and
        highest of each bucket, ``core.downsample``), from the coarsest level of blocks that
        has one per bucket (``read_level``), a short series from its points."""
        if buckets < 1:
            raise InvalidArgumentError(f"a thinned read needs at least 1 bucket, not {buckets}",
                                       owner=owner, metric=name)
        sql = self._db.sql
        with self._db.tx(write=False) as cur:
            cur.execute(sql("SELECT points, stepless FROM metric_series WHERE owner = ? AND "
                            "name = ?"), (owner, name))
            found = cur.fetchone()
            if found is None:
                return MetricBuckets(name=name, count=0, x_is_step=False, points=())
            count, stepless = int(found[0]), int(found[1])
            size = read_level(count, buckets)
            rows: list[tuple[float, float, int | None]]
            if size == 1:
                cur.execute(sql("SELECT value, timestamp, step FROM metrics WHERE owner = ? "
                                "AND name = ? ORDER BY id"), (owner, name))
                rows = list(cur.fetchall())
            else:
                if size == METRIC_BLOCK:
                    cur.execute(sql(_SELECT_BLOCKS.format(table="metric_blocks", size="")),
                                (owner, name))
                else:
                    cur.execute(sql(_SELECT_BLOCKS.format(table="metric_spans",
                                                          size=" AND size = ?")),
                                (owner, name, size))
                rows = []
                for lv, lt, ls, hv, ht, hs in cur.fetchall():
                    rows.append((lv, lt, ls))
                    if (hv, ht, hs) != (lv, lt, ls):
                        rows.append((hv, ht, hs))
        return thin_rows(name, rows, buckets, count=count, x_is_step=stepless == 0)

    def metric_names(self, owner: str) -> list[str]:
        with self._db.tx(write=False) as cur:
            cur.execute(self._db.sql("SELECT name FROM metric_series WHERE owner = ? "
                                     "ORDER BY name"), (owner,))
            return [r[0] for r in cur.fetchall()]

    def metric_summaries(self, owner: str) -> list[MetricSummary]:
        """Count, min, max, mean and last value of each of *owner*'s metrics, by name."""
        with self._db.tx(write=False) as cur:
            cur.execute(self._db.sql(
                "SELECT name, COUNT(*), MIN(value), MAX(value), AVG(value) FROM metrics "
                "WHERE owner = ? GROUP BY name ORDER BY name"), (owner,))
            stats = cur.fetchall()
            cur.execute(self._db.sql("SELECT name, last_value FROM metric_series WHERE "
                                     "owner = ?"), (owner,))
            last = dict(cur.fetchall())
        return [MetricSummary(name=n, count=int(c), min=float(lo), max=float(hi),
                              avg=float(avg), last=float(last[n]))
                for n, c, lo, hi, avg in stats]


# Steps without a value sort first on both databases (PostgreSQL puts NULLs last by default).
_POINT_ORDER = "timestamp, CASE WHEN step IS NULL THEN 0 ELSE 1 END, step, id"
# The series' count and stepless count grow by the batch's; its last point becomes the batch's
# newest when that is as new or newer (a tie goes to the later write, as id order does).
_NEWER = ("(metric_series.last_ts IS NULL OR excluded.last_ts > metric_series.last_ts OR "
          "(excluded.last_ts = metric_series.last_ts AND (metric_series.last_step IS NULL OR "
          "(excluded.last_step IS NOT NULL AND excluded.last_step >= metric_series.last_step))))")
_RESERVE_POSITIONS = (
    "INSERT INTO metric_series (owner, name, points, stepless, last_value, last_ts, last_step) "
    "VALUES (?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (owner, name) DO UPDATE SET points = metric_series.points + excluded.points, "
    "stepless = metric_series.stepless + excluded.stepless, "
    + ", ".join(f"{c} = CASE WHEN {_NEWER} THEN excluded.{c} ELSE metric_series.{c} END"
                for c in ("last_value", "last_ts", "last_step"))
    + " RETURNING points")


def _extremes_set(table: str) -> str:
    # A block's extremes: a new point replaces one only when strictly lower (higher), so ties
    # keep the earliest, as the 0008 and 0009 upgrades do. SET reads the row as it was on
    # both databases.
    return ", ".join(
        f"{side}_{col} = CASE WHEN excluded.{side}_value {op} {table}.{side}_value "
        f"THEN excluded.{side}_{col} ELSE {table}.{side}_{col} END"
        for side, op in (("lo", "<"), ("hi", ">")) for col in ("step", "ts", "value"))


_EXTREMES = "lo_value, lo_step, lo_ts, hi_value, hi_step, hi_ts"
_UPSERT_BLOCK = (
    f"INSERT INTO metric_blocks (owner, name, block, {_EXTREMES}) VALUES "
    "(?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (owner, name, block) DO UPDATE SET "
    + _extremes_set("metric_blocks"))
_UPSERT_SPAN = (
    f"INSERT INTO metric_spans (owner, name, size, block, {_EXTREMES}) VALUES "
    "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (owner, name, size, block) DO UPDATE SET "
    + _extremes_set("metric_spans"))
_SELECT_BLOCKS = ("SELECT lo_value, lo_ts, lo_step, hi_value, hi_ts, hi_step FROM {table} "
                  "WHERE owner = ? AND name = ?{size} ORDER BY block")


def _newest(series: Sequence[MetricPoint]) -> MetricPoint:
    """The last of *series* by time, then step (none first), then position: the later of
    equals, as ``_POINT_ORDER`` sorts them."""
    best = series[0]
    for p in series[1:]:
        if p.timestamp > best.timestamp or (p.timestamp == best.timestamp and (
                best.step is None or (p.step is not None and p.step >= best.step))):
            best = p
    return best


def _blocks(owner: str, name: str, start: int, series: Sequence[MetricPoint]) -> list[_Block]:
    """Rows for ``_UPSERT_BLOCK``: the extremes of *series*' points within each block they
    fall in, the first point at position *start*."""
    out: list[_Block] = []
    i = 0
    while i < len(series):
        block = (start + i) // METRIC_BLOCK
        end = min(len(series), (block + 1) * METRIC_BLOCK - start)
        lo = hi = series[i]
        for p in series[i + 1:end]:
            if p.value < lo.value:
                lo = p
            if p.value > hi.value:
                hi = p
        out.append((owner, name, block, lo.value, lo.step, lo.timestamp, hi.value, hi.step,
                    hi.timestamp))
        i = end
    return out


def _coarser(blocks: Sequence[_Block], per: int) -> list[_Block]:
    """*blocks* (in position order, of one batch) merged *per* to a block: each keeps the
    lowest of their lows and the highest of their highs, the earliest of equals."""
    out: list[_Block] = []
    for b in blocks:
        block = b[2] // per
        if out and out[-1][2] == block:
            prev = out[-1]
            lo = b[3:6] if b[3] < prev[3] else prev[3:6]
            hi = b[6:9] if b[6] > prev[6] else prev[6:9]
            out[-1] = (*b[:2], block, *lo, *hi)
        else:
            out.append((*b[:2], block, *b[3:]))
    return out
