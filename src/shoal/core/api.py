"""The team server's HTTP API version, shared by the server and its clients (here, below
both, so that the server never imports the HTTP client and its httpx)."""

from __future__ import annotations

__all__ = ["API_PREFIX", "API_VERSION", "INVOCATION_HEADER"]

#: The API version a client speaks and a server serves; ``GET /api/v1/version`` tells it.
API_VERSION = 1
API_PREFIX = f"/api/v{API_VERSION}"
#: On every answer ``POST /endpoints/{name}/invocations`` passes through from a model server
#: (its name): what tells a model server's refusal from the server's own errors.
INVOCATION_HEADER = "x-shoal-endpoint"
