"""The model server's Prometheus metrics, in a registry of its own per app.

With several workers each process counts its own requests; a scrape sees the worker that
answered it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["ServerMetrics"]

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                    5.0, 10.0, 30.0, 60.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class ServerMetrics:
    """``shoal_invocations_total{status}``, ``shoal_invocation_latency_seconds``,
    ``shoal_batch_size``, ``shoal_queue_depth`` and ``shoal_model_loaded``."""

    content_type = "text/plain; version=0.0.4; charset=utf-8"

    def __init__(self, queue_depth: Callable[[], float], loaded: Callable[[], float]) -> None:
        from prometheus_client import (
            CollectorRegistry,
            Counter,
            Gauge,
            Histogram,
            disable_created_metrics,
        )

        disable_created_metrics()  # type: ignore[no-untyped-call]  # *_created: only bytes
        self.registry = CollectorRegistry(auto_describe=True)
        self._requests = Counter("shoal_invocations", "Invocations answered, by HTTP status.",
                                 ["status"], registry=self.registry)
        self._latency = Histogram("shoal_invocation_latency_seconds",
                                  "Time from request to response for /invocations.",
                                  buckets=_LATENCY_BUCKETS, registry=self.registry)
        self._batch = Histogram("shoal_batch_size", "Requests run together in one inference.",
                                buckets=_BATCH_BUCKETS, registry=self.registry)
        depth = Gauge("shoal_queue_depth", "Requests waiting for the model.",
                      registry=self.registry)
        depth.set_function(queue_depth)
        ready = Gauge("shoal_model_loaded", "1 once the model is loaded.", registry=self.registry)
        ready.set_function(loaded)
        self._by_status: dict[int, Any] = {}

    def request(self, status: int, seconds: float) -> None:
        child = self._by_status.get(status)
        if child is None:
            child = self._by_status[status] = self._requests.labels(status=str(status))
        child.inc()
        self._latency.observe(seconds)

    def batch(self, size: int) -> None:
        self._batch.observe(size)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)
