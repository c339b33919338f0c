"""Metric plots for the terminal: a plotext line plot as text, or a sparkline."""

from __future__ import annotations

from shoal.cli._plot import line_plot, sparkline
from shoal.core import MetricPoint


def test_line_plot_is_plain_text_with_title_axes_and_line() -> None:
    points = [MetricPoint("loss", 1.0 / (i + 1), float(i), i) for i in range(5000)]
    text = line_plot(points, title="loss", width=60, height=12)
    lines = text.splitlines()
    assert lines[0].strip() == "loss" and "step" in lines[-1]
    assert "\x1b[" not in text  # no colour codes: it is piped, captured and tested
    assert all(len(line) <= 60 for line in lines)
    assert sum(1 for ch in text if 0x2800 <= ord(ch) < 0x2900) >= 20  # braille line


def test_points_without_steps_are_numbered() -> None:
    text = line_plot([MetricPoint("acc", v, float(i)) for i, v in enumerate([0.1, 0.5, 0.4])],
                     title="acc")
    assert "point" in text.splitlines()[-1]
    assert line_plot([], title="acc") == "acc: no points"


def test_sparkline_scales_from_min_to_max() -> None:
    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7]) == "▁▂▃▄▅▆▇█"
    assert sparkline([5, 5, 5]) == "▁▁▁"
    assert len(sparkline(list(range(1000)), width=40)) == 40
    assert sparkline([]) == ""
