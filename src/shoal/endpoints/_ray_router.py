"""The request router of endpoints on Ray Serve behind one proxy (``HeadOnly``).

Serve's default router prefers replicas on the proxy's own node until they are full, which
with a single proxy sends every request to the head's replicas however many there are. This
one is the same "power of two choices" over every replica, with no locality preference: two
replicas drawn at random, the one with the shorter queue gets the request (Serve probes the
queues). Loaded by Serve from its dotted path, in the proxy; it imports ``ray.serve`` at the
top, so nothing else in shoal imports it.
"""

from __future__ import annotations

import random
from typing import Any

from ray.serve.request_router import FIFOMixin, RequestRouter

__all__ = ["SpreadRouter"]


class SpreadRouter(FIFOMixin, RequestRouter):
    async def choose_replicas(self, candidate_replicas: list[Any],
                              pending_request: Any = None) -> list[list[Any]]:
        if len(candidate_replicas) <= 2:
            return [random.sample(candidate_replicas, len(candidate_replicas))]
        return [random.sample(candidate_replicas, 2)]
