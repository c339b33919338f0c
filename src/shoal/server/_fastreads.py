"""Job-status reads (``GET /api/v1/jobs/{name}``) answered in front of FastAPI.

The read clients poll most often goes through FastAPI's whole path otherwise: its middleware
stack, the match over every route, the dependency solver, a hop to the thread pool, and the
response model validated and serialized again. Measured (bench/server.py jobs, docs/
performance.md "Team server") that was ~1.3 ms of server CPU per read against ~0.1 ms of store
work. Here the same request is matched by its path, authorized by the same ``Authorizer``
(user tokens, job tokens and their route checks), the record read from the same store in one
hop to a small thread pool of its own, and answered with the same wire model
(``JobOut.model_dump_json``) and the same error bodies. Every other request, and any of
this shape that is not a plain ``GET``, goes on to FastAPI, which still declares the route
(its OpenAPI document is unchanged).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from starlette.requests import Request

from shoal.core.api import API_PREFIX
from shoal.errors import ShoalError
from shoal.server._wire_jobs import JobOut

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

    from shoal.core.ports import JobStore
    from shoal.server._auth import Authorizer

__all__ = ["FastJobReads"]

logger = logging.getLogger(__name__)

_PREFIX = f"{API_PREFIX}/jobs/"
#: Threads reading records: the store's calls are blocking; the event loop stays free.
_READERS = 4


class FastJobReads:
    """ASGI app: ``GET /api/v1/jobs/{name}`` here, everything else to *app*."""

    def __init__(self, app: ASGIApp, store: JobStore, authorizer: Authorizer,
                 error_answer: Callable[[str, str, ShoalError], ASGIApp]) -> None:
        self.app = app
        self._store = store
        self._authorizer = authorizer
        self._error_answer = error_answer
        self._pool = ThreadPoolExecutor(_READERS, thread_name_prefix="shoal-job-reads")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        name = _job_read(scope)
        if name is None:
            await self.app(scope, receive, send)
            return
        scope["path_params"] = {"name": name}  # what the job-token checks read
        try:
            await self._authorizer(Request(scope, receive))
            loop = asyncio.get_running_loop()
            body = await loop.run_in_executor(self._pool, self._read, name)
        except ShoalError as e:  # the same answer as the app's (a store away: its 503)
            await self._error_answer("GET", scope["path"], e)(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    def _read(self, name: str) -> bytes:
        return JobOut.of(self._store.get_job(name)).model_dump_json().encode()


def _job_read(scope: Scope) -> str | None:
    """The job name of a plain ``GET /api/v1/jobs/{name}``, else None."""
    if scope["type"] != "http" or scope["method"] != "GET":
        return None
    path: str = scope["path"]
    if not path.startswith(_PREFIX):
        return None
    name = path[len(_PREFIX):]
    if not name or "/" in name:
        return None
    return name
