"""The LLM server's Prometheus metrics: requests, generated tokens and tokens/s, time to first
token, batch occupancy and queue depth, in a registry of the app's own."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import Any

from shoal.llm.serving._engine import EngineObserver

__all__ = ["LlmMetrics"]

_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
#: tokens/s is measured over this window
_RATE_WINDOW_S = 10.0


class LlmMetrics(EngineObserver):
    """``shoal_llm_*`` series; also the engine's observer (called on its thread)."""

    content_type = "text/plain; version=0.0.4; charset=utf-8"

    def __init__(self, *, queue_depth: Callable[[], float], live: Callable[[], float],
                 max_batch: Callable[[], float], loaded: Callable[[], float]) -> None:
        from prometheus_client import (
            CollectorRegistry,
            Counter,
            Gauge,
            Histogram,
            disable_created_metrics,
        )

        disable_created_metrics()
        self.registry = r = CollectorRegistry(auto_describe=True)
        self._requests = Counter("shoal_llm_requests", "LLM requests answered, by route and "
                                 "HTTP status.", ["route", "status"], registry=r)
        self._latency = Histogram("shoal_llm_request_latency_seconds", "Request to last token.",
                                  buckets=_LATENCY_BUCKETS, registry=r)
        self._tokens = Counter("shoal_llm_generated_tokens", "Tokens generated.", registry=r)
        self._ttft = Histogram("shoal_llm_time_to_first_token_seconds",
                               "Submission to first generated token.", buckets=_TTFT_BUCKETS,
                               registry=r)
        self._batch = Histogram("shoal_llm_batch_size", "Sequences in each decode step.",
                                buckets=_BATCH_BUCKETS, registry=r)
        Gauge("shoal_llm_tokens_per_second", f"Tokens generated per second over the last "
              f"{_RATE_WINDOW_S:g} s.", registry=r).set_function(self.tokens_per_second)
        Gauge("shoal_llm_batch_occupancy", "Live sequences / max_rolling_batch_size.",
              registry=r).set_function(lambda: live() / max(1.0, max_batch()))
        Gauge("shoal_llm_live_sequences", "Sequences being decoded.",
              registry=r).set_function(live)
        Gauge("shoal_llm_queue_depth", "Requests waiting for a batch slot.",
              registry=r).set_function(queue_depth)
        Gauge("shoal_model_loaded", "1 once the model is loaded.", registry=r).set_function(loaded)
        self._window: collections.deque[tuple[float, int]] = collections.deque()
        self._lock = threading.Lock()
        self._children: dict[tuple[str, int], Any] = {}

    # EngineObserver
    def step(self, live: int, tokens: int, seconds: float) -> None:
        self._tokens.inc(tokens)
        self._batch.observe(live)
        now = time.monotonic()
        with self._lock:
            self._window.append((now, tokens))
            while self._window and self._window[0][0] < now - _RATE_WINDOW_S:
                self._window.popleft()

    def first_token(self, seconds: float) -> None:
        self._ttft.observe(seconds)

    def tokens_per_second(self) -> float:
        now = time.monotonic()
        with self._lock:
            total = sum(n for t, n in self._window if t >= now - _RATE_WINDOW_S)
        return total / _RATE_WINDOW_S

    def request(self, route: str, status: int, seconds: float) -> None:
        key = (route, status)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._requests.labels(route=route, status=str(status))
        child.inc()
        if status < 400:
            self._latency.observe(seconds)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)
