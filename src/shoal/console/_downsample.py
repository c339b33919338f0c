"""Metric series thinned on the server to what a chart can draw: min/max per pixel bucket.

A chart ``width`` pixels wide shows at most two values per pixel column, so a series of
100,000 points is sent as at most ``2 * width`` points, and the browser never receives a
history it cannot draw (MLflow's UI downloads every point). Each bucket keeps its lowest and
its highest point, in step order, so a single spike still shows, unlike averaging or
striding; a bucket keeps its first point only when all its values are equal.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["minmax_buckets"]


def minmax_buckets(xs: Sequence[float], ys: Sequence[float], width: int
                   ) -> tuple[list[float], list[float]]:
    """*xs* (ascending) and *ys* thinned to at most ``2 * width`` points (see the module).

    NaN values are kept where they are when a bucket holds nothing else (a gap in the line).

        >>> minmax_buckets([0, 1, 2, 3], [5, 9, 1, 5], 1)
        ([1, 2], [9, 1])
    """
    if len(xs) != len(ys):
        raise ValueError(f"a series needs as many x as y values: {len(xs)} x, {len(ys)} y")
    if width < 1:
        raise ValueError(f"a chart is at least 1 pixel wide, not {width}")
    n = len(xs)
    if n <= 2 * width:
        return list(xs), list(ys)
    out_x: list[float] = []
    out_y: list[float] = []
    for b in range(width):
        lo, hi = b * n // width, (b + 1) * n // width
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
            out_x.append(xs[lo])
            out_y.append(ys[lo])
            continue
        for i in sorted({i_min, i_max}):
            out_x.append(xs[i])
            out_y.append(ys[i])
    return out_x, out_y
