"""The model server's Prometheus metrics, in a registry of its own per app.

With several workers each process counts its own requests; a scrape sees the worker that
answered it.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["ServerMetrics"]

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                    5.0, 10.0, 30.0, 60.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class ServerMetrics:
    """``shoal_invocations_total{status}``, ``shoal_invocation_latency_seconds``,
    ``shoal_batch_size``, ``shoal_queue_depth`` and ``shoal_model_loaded``.

    Counted on the event loop's thread only (``request`` and ``batch`` are called there, and
    so is ``render``), so the hot path is a few integer additions; prometheus_client reads the
    counts through a collector when ``/metrics`` is scraped and writes the exposition format.
    """

    content_type = "text/plain; version=0.0.4; charset=utf-8"

    def __init__(self, queue_depth: Callable[[], float], loaded: Callable[[], float]) -> None:
        from prometheus_client import CollectorRegistry

        self._by_status: dict[int, int] = {}
        self._latency = _Histogram(_LATENCY_BUCKETS)
        self._batch = _Histogram(_BATCH_BUCKETS)
        self._queue_depth = queue_depth
        self._loaded = loaded
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)  # a collector: collect()

    def request(self, status: int, seconds: float) -> None:
        by_status = self._by_status
        by_status[status] = by_status.get(status, 0) + 1
        self._latency.observe(seconds)

    def batch(self, size: int) -> None:
        self._batch.observe(size)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        requests = CounterMetricFamily("shoal_invocations",
                                       "Invocations answered, by HTTP status.",
                                       labels=["status"])
        for status, count in sorted(self._by_status.items()):
            requests.add_metric([str(status)], count)
        yield requests
        yield self._latency.family(HistogramMetricFamily, "shoal_invocation_latency_seconds",
                                   "Time from request to response for /invocations.")
        yield self._batch.family(HistogramMetricFamily, "shoal_batch_size",
                                 "Requests run together in one inference.")
        yield GaugeMetricFamily("shoal_queue_depth", "Requests waiting for the model.",
                                value=self._queue_depth())
        yield GaugeMetricFamily("shoal_model_loaded", "1 once the model is loaded.",
                                value=self._loaded())


class _Histogram:
    """Bucket counts and a sum, cumulated only when collected."""

    __slots__ = ("_bounds", "_counts", "_sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self._counts = [0] * (len(bounds) + 1)  # the last one: above every bound (+Inf)
        self._sum = 0.0

    def observe(self, value: float) -> None:
        self._counts[bisect_left(self._bounds, value)] += 1
        self._sum += value

    def family(self, cls: Any, name: str, documentation: str) -> Any:
        buckets, total = [], 0
        for bound, count in zip((*self._bounds, math.inf), self._counts, strict=True):
            total += count
            buckets.append((_bound(bound), total))
        return cls(name, documentation, buckets=buckets, sum_value=self._sum)


def _bound(value: float) -> str:
    """prometheus_client's spelling of a bucket bound: ``1.0``, ``0.005``, ``+Inf``."""
    return "+Inf" if value == math.inf else repr(float(value))
