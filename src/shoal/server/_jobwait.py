"""Long polls that wake clients when a job ends, and a job's live log.

``GET /jobs/{name}/wait?timeout=`` answers once the job has ended or *timeout* (at most 60 s)
has passed; ``GET /jobs/{name}/logs?offset=N&follow=true`` streams the log from byte *N*
(chunked) while the job runs and ends when it has ended (or after *timeout*, when given). Both
are async: a waiting client holds no worker thread. They are woken by ``Signals`` when a route
records the job's end (``NotifyingJobStore``) and re-read the record every half second in any
case (an end recorded by a reaper elsewhere).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from shoal.core.jobs import JobRecord
from shoal.server._launches import ServerJobs
from shoal.server._wire_launches import WaitOut

__all__ = ["wait_routes"]

_MAX_WAIT_S = 60.0
_SLICE_S = 0.5


def wait_routes(jobs: ServerJobs) -> APIRouter:
    api = APIRouter()
    service = jobs.session.jobs

    async def record(name: str) -> JobRecord:
        found: JobRecord = await run_in_threadpool(jobs.store.get_job, name)
        return found

    @api.get("/jobs/{name}/wait", tags=["jobs"])
    async def wait_job(name: str, timeout: Annotated[float, Query(ge=0)] = 30.0) -> WaitOut:
        deadline = time.monotonic() + min(timeout, _MAX_WAIT_S)
        while True:
            current = await record(name)
            left = deadline - time.monotonic()
            if current.is_terminal or left <= 0:
                return WaitOut(name=name, status=current.status, ended=current.is_terminal)
            await jobs.signals.wait(name, min(_SLICE_S, left))

    @api.get("/jobs/{name}/logs", tags=["jobs"])
    async def job_log(name: str, offset: Annotated[int, Query(ge=0)] = 0,
                      follow: bool = False,
                      timeout: Annotated[float | None, Query(ge=0)] = None) -> Response:
        await record(name)  # 404 for a job that does not exist
        if not follow:
            data: bytes = await run_in_threadpool(service.read_log, name, offset)
            return Response(data, media_type="application/octet-stream")

        async def stream() -> AsyncIterator[bytes]:
            deadline = None if timeout is None else time.monotonic() + timeout
            position = offset
            while True:
                ended = (await record(name)).is_terminal
                chunk: bytes = await run_in_threadpool(service.read_log, name, position)
                if chunk:
                    position += len(chunk)
                    yield chunk
                if ended or (deadline is not None and time.monotonic() >= deadline):
                    return  # read after the end was seen: nothing written later is lost
                if not chunk:
                    await jobs.signals.wait(name, _SLICE_S)

        return StreamingResponse(stream(), media_type="application/octet-stream")

    return api
