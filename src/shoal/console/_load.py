"""An endpoint's load over time, as the console has seen it: each scrape of its instances'
``/metrics`` (requests so far, latency sum and count, queue depth) kept in a short ring per
endpoint, in this process's memory, and turned into request rate and mean latency per
interval between scrapes. The model server's counters only grow, so two scrapes give the
rate in between; a counter that went down (an instance restarted) skips that interval for
that instance. No I/O here: the scrapes are ``_endpoints.py``'s."""

from __future__ import annotations

import math
import threading
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["LoadHistory", "Sample", "sample_of"]


@dataclass(frozen=True, slots=True)
class Sample:
    """One instance's counters at one scrape."""

    requests: float
    latency_sum: float
    latency_count: float
    queue: float


def _values(text: str) -> dict[str, float]:
    """Prometheus text: each metric name's values summed over its labels."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name = head.split("{", 1)[0].strip()
        try:
            number = float(value)
        except ValueError:
            continue
        if name and not math.isnan(number):
            out[name] = out.get(name, 0.0) + number
    return out


def sample_of(metrics_text: str) -> Sample:
    """The counters the console follows, from a model server's ``/metrics``."""
    values = _values(metrics_text)
    return Sample(requests=values.get("shoal_invocations_total", 0.0),
                  latency_sum=values.get("shoal_invocation_latency_seconds_sum", 0.0),
                  latency_count=values.get("shoal_invocation_latency_seconds_count", 0.0),
                  queue=values.get("shoal_queue_depth", 0.0))


class LoadHistory:
    """The last *size* scrapes of each of the last *endpoints* endpoints looked at; a scrape
    less than *min_interval* seconds after the one before is not kept (several viewers
    polling at once make one series, not a jagged one)."""

    def __init__(self, *, size: int = 450, endpoints: int = 256,
                 min_interval: float = 1.0) -> None:
        self._size = size
        self._endpoints = endpoints
        self._min_interval = min_interval
        self._rings: OrderedDict[str, deque[tuple[float, dict[str, Sample]]]] = OrderedDict()
        self._lock = threading.Lock()

    def record(self, endpoint: str, at: float, samples: Mapping[str, Sample]) -> None:
        """The scrape at *at* (seconds since the epoch) of *endpoint*'s instances (by URL)."""
        with self._lock:
            ring = self._rings.get(endpoint)
            if ring is None:
                ring = self._rings[endpoint] = deque(maxlen=self._size)
                while len(self._rings) > self._endpoints:
                    self._rings.popitem(last=False)
            self._rings.move_to_end(endpoint)
            if ring and at - ring[-1][0] < self._min_interval:
                return
            ring.append((at, dict(samples)))

    def series(self, endpoint: str) -> dict[str, list[Any]]:
        """Per interval between kept scrapes (at its end): requests per second and mean
        latency (ms; None without requests) over all instances, and requests queued."""
        with self._lock:
            ring = list(self._rings.get(endpoint, ()))
        t: list[float] = []
        rate: list[float] = []
        latency: list[float | None] = []
        queue: list[float] = []
        for (t0, before), (t1, after) in zip(ring, ring[1:], strict=False):
            requests = total = count = 0.0
            for url, now in after.items():
                then = before.get(url)
                if then is None or now.requests < then.requests or \
                        now.latency_count < then.latency_count:
                    continue  # new, or restarted: no interval to measure
                requests += now.requests - then.requests
                total += now.latency_sum - then.latency_sum
                count += now.latency_count - then.latency_count
            t.append(t1)
            rate.append(requests / (t1 - t0))
            latency.append(total / count * 1000 if count else None)
            queue.append(sum(s.queue for s in after.values()))
        return {"t": t, "rate": rate, "latency_ms": latency, "queue": queue}
