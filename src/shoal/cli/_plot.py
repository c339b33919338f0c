"""A metric series as a terminal line plot (plotext), as plain text so it can be printed,
piped or tested; a one-line unicode sparkline when plotext is missing or fails."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shoal.core.experiments import MetricPoint

__all__ = ["line_plot", "sparkline"]

_BARS = "▁▂▃▄▅▆▇█"
#: More points than this are averaged into buckets first: the plot has fewer columns anyway.
_MAX_POINTS = 1000


def _buckets(values: Sequence[float], n: int) -> list[float]:
    if len(values) <= n:
        return list(values)
    size = len(values) / n
    out = []
    for i in range(n):
        chunk = values[int(i * size): max(int((i + 1) * size), int(i * size) + 1)]
        out.append(sum(chunk) / len(chunk))
    return out


def sparkline(values: Sequence[float], *, width: int = 60) -> str:
    """``▁▂▄█▆…``: one character per bucket of values, scaled from min to max."""
    if not values:
        return ""
    data = _buckets(values, width)
    lo, hi = min(data), max(data)
    span = hi - lo
    return "".join(_BARS[0 if span == 0 else min(len(_BARS) - 1,
                                                   int((v - lo) / span * len(_BARS)))]
                   for v in data)


def line_plot(points: Sequence[MetricPoint], *, title: str, width: int = 72,
              height: int = 14) -> str:
    """The series as a line plot against its steps (or point number when steps are missing)."""
    if not points:
        return f"{title}: no points"
    ys = [p.value for p in points]
    stepped = all(p.step is not None for p in points)
    xs = ([float(p.step) for p in points if p.step is not None] if stepped
          else [float(i) for i in range(len(ys))])
    if len(ys) > _MAX_POINTS:
        xs, ys = _buckets(xs, _MAX_POINTS), _buckets(ys, _MAX_POINTS)
    try:
        import plotext as plt

        plt.clear_figure()
        plt.plotsize(width, height)
        plt.theme("clear")
        if len(ys) == 1:
            plt.scatter(xs, ys, marker="dot")
        else:
            plt.plot(xs, ys, marker="braille")
        plt.title(title)
        plt.xlabel("step" if stepped else "point")
        text = plt.uncolorize(plt.build())
        plt.clear_figure()
        if text.strip():
            return "\n".join(line.rstrip() for line in text.splitlines()).strip("\n")
    except Exception:  # plotext missing or confused by this terminal: the sparkline still shows it
        pass
    return (f"{title}  (min {min(ys):.6g}, max {max(ys):.6g}, last {ys[-1]:.6g})\n"
            f"{sparkline(ys, width=width)}")
