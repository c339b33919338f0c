"""The LLM server's Prometheus metrics, in a registry of the app's own: shoal's
(``shoal_llm_*``: requests, generated tokens and tokens/s, time to first token, batch occupancy
and queue depth) and vLLM's names for what dashboards built on vLLM read (``vllm:*``, with a
``model_name`` label and vLLM's types and buckets)."""

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
#: vLLM's buckets (vllm/v1/metrics/loggers.py)
_VLLM_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                      5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_VLLM_TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                      5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_VLLM_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                         50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
_VLLM_FINISH_REASONS = ("stop", "length", "abort")
#: tokens/s is measured over this window
_RATE_WINDOW_S = 10.0


class LlmMetrics(EngineObserver):
    """``shoal_llm_*`` series; also the engine's observer (called on its thread)."""

    content_type = "text/plain; version=0.0.4; charset=utf-8"

    def __init__(self, *, queue_depth: Callable[[], float], live: Callable[[], float],
                 max_batch: Callable[[], float], loaded: Callable[[], float],
                 model_name: str = "model") -> None:
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
        self._vllm(model_name, queue_depth, live)
        self._window: collections.deque[tuple[float, int]] = collections.deque()
        self._lock = threading.Lock()
        self._children: dict[tuple[str, int], Any] = {}

    def _vllm(self, model_name: str, queue_depth: Callable[[], float],
              live: Callable[[], float]) -> None:
        """vLLM's series (``engine`` is vLLM's engine index: one engine here)."""
        from prometheus_client import Counter, Gauge, Histogram

        r, names, values = self.registry, ["model_name", "engine"], [model_name, "0"]
        Gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
              names, registry=r).labels(*values).set_function(live)
        Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
              names, registry=r).labels(*values).set_function(queue_depth)
        self._v_prompt = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
                                 names, registry=r).labels(*values)
        self._v_generation = Counter("vllm:generation_tokens",
                                     "Number of generation tokens processed.", names,
                                     registry=r).labels(*values)
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          [*names, "finished_reason"], registry=r)
        self._v_success = {reason: success.labels(*values, reason)
                           for reason in _VLLM_FINISH_REASONS}
        self._v_ttft = Histogram("vllm:time_to_first_token_seconds",
                                 "Histogram of time to first token in seconds.", names,
                                 buckets=_VLLM_TTFT_BUCKETS, registry=r).labels(*values)
        self._v_tpot = Histogram("vllm:time_per_output_token_seconds",
                                 "Histogram of time per output token in seconds.", names,
                                 buckets=_VLLM_TPOT_BUCKETS, registry=r).labels(*values)
        self._v_e2e = Histogram("vllm:e2e_request_latency_seconds",
                                "Histogram of e2e request latency in seconds.", names,
                                buckets=_VLLM_LATENCY_BUCKETS, registry=r).labels(*values)

    # EngineObserver
    def prefilled(self, prompt_tokens: int) -> None:
        self._v_prompt.inc(prompt_tokens)

    def inter_token(self, seconds: list[float]) -> None:
        observe = self._v_tpot.observe
        for s in seconds:
            observe(s)

    def finished(self, seconds: float, reason: str) -> None:
        self._v_e2e.observe(seconds)
        self._v_success[reason].inc()

    def step(self, live: int, tokens: int, seconds: float) -> None:
        self._tokens.inc(tokens)
        self._v_generation.inc(tokens)
        self._batch.observe(live)
        now = time.monotonic()
        with self._lock:
            self._window.append((now, tokens))
            while self._window and self._window[0][0] < now - _RATE_WINDOW_S:
                self._window.popleft()

    def first_token(self, seconds: float) -> None:
        self._ttft.observe(seconds)
        self._v_ttft.observe(seconds)

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
