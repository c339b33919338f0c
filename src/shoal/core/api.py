"""The team server's HTTP API version, shared by the server and its clients (here, below
both, so that the server never imports the HTTP client and its httpx)."""

from __future__ import annotations

__all__ = ["API_PREFIX", "API_VERSION", "INVOCATION_HEADER", "MAX_JOB_SECRETS_PER_REQUEST"]

#: The API version a client speaks and a server serves; ``GET /api/v1/version`` tells it.
API_VERSION = 1
API_PREFIX = f"/api/v{API_VERSION}"
#: The most job secrets one ``POST /keys/job-secrets`` may ask for (a batch's jobs).
MAX_JOB_SECRETS_PER_REQUEST = 1000
#: On every answer ``POST /endpoints/{name}/invocations`` passes through from a model server
#: (its name): what tells a model server's refusal from the server's own errors.
INVOCATION_HEADER = "x-shoal-endpoint"
