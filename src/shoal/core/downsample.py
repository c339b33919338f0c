"""Metric series thinned to what a chart can draw: min/max per pixel bucket.

A chart ``width`` pixels wide shows at most two values per pixel column, so a series of
100,000 points is sent as at most ``2 * width`` points, and the browser never receives a
history it cannot draw (MLflow's UI downloads every point). Each bucket keeps its lowest and
its highest point, in x order, so a single spike still shows, unlike averaging or striding;
a bucket keeps its first point only when all its values are equal.

Several series on one chart (``on_shared_x``) are put on one x axis of ``2 * width`` slots,
two per pixel column, so the browser draws ``series x 2 * width`` values instead of joining
every series' own x values (20 series: 20 x their union, ~40,000 x values, drawn ~10x
slower).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from shoal.core.experiments import MetricPoint

__all__ = ["MetricBuckets", "minmax_buckets", "minmax_indices", "on_shared_x", "thin_points",
           "thin_rows"]


@dataclass(frozen=True, slots=True)
class MetricBuckets:
    """One metric series thinned for a chart (``MetricStore.metric_buckets``).

    *points* are at most ``2 * buckets`` of the stored points (all of them when there are no
    more), in x order: x is the step when every stored point has one (*x_is_step*), else the
    timestamp. *count* is how many points are stored."""

    name: str
    count: int
    x_is_step: bool
    points: tuple[MetricPoint, ...]


def thin_points(name: str, points: Iterable[MetricPoint], buckets: int, *,
                count: int | None = None, x_is_step: bool | None = None) -> MetricBuckets:
    """*points* (of one series) sorted by x and thinned by ``minmax_buckets`` to *buckets*.

    A store that hands in a reduced set (the extremes of blocks of the series) passes the
    series' own *count* and *x_is_step*; otherwise both come from *points*."""
    rows = [(p.value, p.timestamp, p.step) for p in points]
    by_step = (bool(rows) and all(r[2] is not None for r in rows)) \
        if x_is_step is None else x_is_step
    return thin_rows(name, rows, buckets, count=len(rows) if count is None else count,
                     x_is_step=by_step)


def thin_rows(name: str, rows: Sequence[tuple[float, float, int | None]], buckets: int, *,
              count: int, x_is_step: bool) -> MetricBuckets:
    """``thin_points`` of ``(value, timestamp, step)`` rows, as a store reads them: only the
    points kept are made."""
    if buckets < 1:
        raise ValueError(f"a chart is at least 1 pixel wide, not {buckets}")
    xs = [float(r[2]) if x_is_step and r[2] is not None else r[1] for r in rows]
    if any(a > b for a, b in zip(xs, xs[1:], strict=False)):  # usually in order already
        order = sorted(range(len(rows)), key=xs.__getitem__)  # stable: ties as added
        rows = [rows[i] for i in order]
    kept = minmax_indices([r[0] for r in rows], buckets)
    return MetricBuckets(name=name, count=count, x_is_step=x_is_step,
                         points=tuple(MetricPoint(name, *rows[i]) for i in kept))


def minmax_indices(ys: Sequence[float], width: int) -> list[int]:
    """The positions ``minmax_buckets`` keeps of *ys* (ascending)."""
    if width < 1:
        raise ValueError(f"a chart is at least 1 pixel wide, not {width}")
    n = len(ys)
    if n <= 2 * width:
        return list(range(n))
    out: list[int] = []
    value = ys.__getitem__
    has_nan = any(map(math.isnan, ys))
    for b in range(width):
        lo, hi = b * n // width, (b + 1) * n // width
        if not has_nan:  # min/max return the first of equal values, as the loop below
            i_min, i_max = min(range(lo, hi), key=value), max(range(lo, hi), key=value)
            out.extend((i_min,) if i_min == i_max else sorted((i_min, i_max)))
            continue
        i_min = i_max = -1
        for i in range(lo, hi):
            y = ys[i]
            if math.isnan(y):
                continue
            if i_min < 0 or y < ys[i_min]:
                i_min = i
            if i_max < 0 or y > ys[i_max]:
                i_max = i
        if i_min < 0:  # all NaN: keep one to break the line
            out.append(lo)
            continue
        out.extend(sorted({i_min, i_max}))
    return out


def minmax_buckets(xs: Sequence[float], ys: Sequence[float], width: int
                   ) -> tuple[list[float], list[float]]:
    """*xs* (ascending) and *ys* thinned to at most ``2 * width`` points (see the module).

    NaN values are kept where they are when a bucket holds nothing else (a gap in the line).

        >>> minmax_buckets([0, 1, 2, 3], [5, 9, 1, 5], 1)
        ([1, 2], [9, 1])
    """
    if len(xs) != len(ys):
        raise ValueError(f"a series needs as many x as y values: {len(xs)} x, {len(ys)} y")
    kept = minmax_indices(ys, width)
    return [xs[i] for i in kept], [ys[i] for i in kept]


def on_shared_x(columns: Sequence[tuple[Sequence[float], Sequence[float | None]]], width: int,
                *, integral: bool = False) -> tuple[list[float], list[list[float | None]]]:
    """Several series (each ``(xs, ys)``, xs ascending) on one x axis, for one chart *width*
    pixels wide: ``(x, [ys of each series, None where it has no point])``.

    When all the x values together are at most ``2 * width``, x is exactly their union.
    Otherwise the x range is cut into *width* columns of two slots each; each series keeps
    its lowest and highest point per column (``minmax_buckets``' rule), the earlier in the
    column's first slot, so a spike still shows, and each point moves by under half a
    column. With *integral* (steps) the slots are whole numbers.

        >>> on_shared_x([([0, 2], [1.0, 2.0]), ([1, 2], [5.0, 6.0])], 4)
        ([0, 1, 2], [[1.0, None, 2.0], [None, 5.0, 6.0]])
    """
    if width < 1:
        raise ValueError(f"a chart is at least 1 pixel wide, not {width}")
    every = sorted(set().union(*(xs for xs, _ in columns)))
    if len(every) <= 2 * width:
        at = {x: i for i, x in enumerate(every)}
        out: list[list[float | None]] = [[None] * len(every) for _ in columns]
        for (xs, ys), row in zip(columns, out, strict=True):
            for x, y in zip(xs, ys, strict=True):
                row[at[x]] = y
        return list(every), out
    lo, hi = every[0], every[-1]
    step = (hi - lo) / width
    slots = [lo + (i // 2 + (0.25 if i % 2 == 0 else 0.75)) * step for i in range(2 * width)]
    if integral:  # >= 2 units a column here, so whole slots stay distinct and in order
        slots = [float(math.floor(x)) for x in slots]
    return slots, [_columns(xs, ys, lo, step, width) for xs, ys in columns]


def _columns(xs: Sequence[float], ys: Sequence[float | None], lo: float, step: float,
             width: int) -> list[float | None]:
    """One series' lowest and highest y per column of *step* from *lo*, in two slots."""
    low: list[int] = [-1] * width  # per column: the index of its lowest, of its highest
    high: list[int] = [-1] * width
    low_y: list[float] = [0.0] * width
    high_y: list[float] = [0.0] * width
    per = 1 / step
    last = width - 1
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        if y is None or y != y:  # None or NaN: nothing to draw
            continue
        column = int((x - lo) * per)
        if column > last:
            column = last
        if low[column] < 0:
            low[column] = high[column] = i
            low_y[column] = high_y[column] = y
        elif y < low_y[column]:
            low[column], low_y[column] = i, y
        elif y > high_y[column]:
            high[column], high_y[column] = i, y
    out: list[float | None] = [None] * (2 * width)
    for column in range(width):
        first, second = low[column], high[column]
        if first < 0:
            continue
        if first == second:  # one value: the slot on its side of the column's middle
            right = xs[first] - lo - column * step >= step / 2
            out[2 * column + right] = low_y[column]
            continue
        if first > second:
            first, second = second, first
        out[2 * column], out[2 * column + 1] = ys[first], ys[second]
    return out
