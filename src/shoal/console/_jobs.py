"""The console's job pages: the jobs list (filters, keyset pages, live statuses), a job
(spec, timeline, live log, metrics, cancel) and the log's byte ranges."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from starlette.responses import FileResponse, RedirectResponse, Response

from shoal.console._forms import require_csrf
from shoal.console._render import ago, base_url, page, seconds, spec_json
from shoal.console._session import Principal, Sessions, utcnow
from shoal.core.experiments import job_owner
from shoal.core.jobs import JobRecord, JobStatus
from shoal.core.ports import ArtifactStore, JobQuery, JobStore, RunStore
from shoal.errors import ArtifactNotFound, InvalidArgumentError, PermissionDeniedError
from shoal.jobs import log_key
from shoal.storage.artifacts import job_key

__all__ = ["Cancel", "job_routes"]

#: Stops a job (``JobService.cancel``).
Cancel = Callable[[str], object]

PAGE_SIZE = 50
#: What a job page shows of a long log at first; the rest is a download away.
_LOG_TAIL_BYTES = 256 * 1024
#: Files listed on a job's page.
_MAX_FILES = 200
#: Shown inline on a job's page (an environment lock) up to this size.
_MAX_INLINE = 256 * 1024


def _text_or_none(artifacts: ArtifactStore, key: str) -> str | None:
    try:
        data = artifacts.get_bytes(key)
    except ArtifactNotFound:
        return None
    return data[:_MAX_INLINE].decode("utf-8", "replace")


#: The jobs list's age filter: created within this long ago.
AGES = {"1h": timedelta(hours=1), "24h": timedelta(days=1), "7d": timedelta(days=7),
        "30d": timedelta(days=30)}


def _filters(status: str, name: str, owner: str, age: str = "") -> JobQuery:
    statuses: tuple[JobStatus, ...] = ()
    if status:
        try:
            statuses = (JobStatus(status),)
        except ValueError:
            raise InvalidArgumentError(
                f"no job status is called {status!r}; pick one of "
                f"{', '.join(s.value for s in JobStatus)}", status=status) from None
    if age and age not in AGES:
        raise InvalidArgumentError(f"age={age!r} is not one of {', '.join(AGES)}", age=age)
    return JobQuery(statuses=statuses, name_contains=name or None, owner=owner or None,
                    created_after=utcnow() - AGES[age] if age else None)


def _row(record: JobRecord, now: datetime) -> dict[str, Any]:
    running = record.started_at is not None and record.ended_at is None
    duration = record.duration_seconds if not running else \
        (now - record.started_at).total_seconds() if record.started_at else None
    return {"name": record.name, "status": record.status.value, "owner": record.owner,
            "instance_type": record.spec.instance_type or "", "age": ago(record.created_at, now),
            "duration": seconds(duration), "terminal": record.is_terminal}


def job_routes(jobs: JobStore, artifacts: ArtifactStore, runs: RunStore, cancel: Cancel,
               sessions: Sessions) -> APIRouter:
    api = APIRouter()

    def listing(status: str, name: str, owner: str, age: str, before: str,
                before_name: str) -> dict[str, Any]:
        query = _filters(status, name, owner, age)
        cursor = None
        if before and before_name:
            try:
                cursor = (datetime.fromisoformat(before), before_name)
            except ValueError:
                raise InvalidArgumentError(f"before={before!r} is not an ISO time; follow "
                                           "the page links", before=before) from None
        found = jobs.list_jobs(replace(query, before=cursor, limit=PAGE_SIZE + 1))
        now = utcnow()
        shown = found[:PAGE_SIZE]
        params = {k: v for k, v in (("status", status), ("name", name), ("owner", owner),
                                    ("age", age)) if v}
        more = None
        if len(found) > PAGE_SIZE:
            last = shown[-1]
            more = urlencode({**params, "before": last.created_at.isoformat(),
                              "before_name": last.name})
        return {"rows": [_row(r, now) for r in shown], "next_query": more,
                "query": urlencode({**params, **({"before": before, "before_name": before_name}
                                               if cursor else {})}),
                "first_query": urlencode(params), "paged": cursor is not None,
                "status": status, "name": name, "owner": owner, "age": age,
                "ages": list(AGES),
                "statuses": [s.value for s in JobStatus]}

    @api.get("/jobs")
    def jobs_page(request: Request, status: str = "", name: str = "", owner: str = "",
                  age: str = "", before: str = "", before_name: str = "") -> Response:
        return page(request, "jobs.html",
                    **listing(status, name, owner, age, before, before_name))

    @api.get("/jobs-rows")
    def jobs_rows(request: Request, status: str = "", name: str = "", owner: str = "",
                  age: str = "", before: str = "", before_name: str = "") -> Response:
        return page(request, "_job_rows.html",
                    **listing(status, name, owner, age, before, before_name))

    @api.get("/jobs/{name:path}/status")
    def job_status(request: Request, name: str) -> Response:
        record = jobs.get_job(name)
        return page(request, "_job_status.html", job=_row(record, utcnow()), record=record)

    @api.get("/jobs/{name:path}/log")
    def job_log(name: str, offset: int = 0, tail: bool = False) -> Response:
        """The job's log from byte *offset* (``tail``: at most its last 256 KiB), with the
        offset to ask from next and whether the job has ended (then no more will come)."""
        record = jobs.get_job(name)  # before the read: an ended job's log is then complete
        try:
            data = artifacts.read_range(log_key(name), max(0, offset))
        except ArtifactNotFound:
            data = b""
        start = max(0, offset)
        if tail and len(data) > _LOG_TAIL_BYTES:
            cut = len(data) - _LOG_TAIL_BYTES
            cut = data.find(b"\n", cut) + 1 or cut  # from a line's start
            start, data = start + cut, data[cut:]
        return Response(data, media_type="text/plain; charset=utf-8", headers={
            "X-Log-Start": str(start), "X-Log-Offset": str(start + len(data)),
            "X-Job-Ended": "1" if record.is_terminal else "0"})

    @api.get("/jobs/{name:path}/log.txt")
    def job_log_download(name: str) -> Response:
        jobs.get_job(name)
        try:
            data = artifacts.read_range(log_key(name), 0)
        except ArtifactNotFound:
            data = b""
        return Response(data, media_type="text/plain; charset=utf-8", headers={
            "Content-Disposition": f'attachment; filename="{name}.log"'})

    @api.get("/jobs/{name:path}/artifact")
    def job_artifact(name: str, key: str) -> Response:
        """One of the job's stored files (``key`` relative to the job), as a download."""
        jobs.get_job(name)
        full = job_key(name, key)
        local = artifacts.local_path(full)
        filename = key.rsplit("/", 1)[-1]
        if local is not None and Path(local).is_file():
            return FileResponse(local, filename=filename,
                                media_type="application/octet-stream")
        return Response(artifacts.get_bytes(full), media_type="application/octet-stream",
                        headers={"Content-Disposition": f'attachment; filename="{filename}"'})

    @api.post("/jobs/{name:path}/cancel")
    async def cancel_job(request: Request, name: str) -> Response:
        await require_csrf(sessions, request)
        record = jobs.get_job(name)
        principal: Principal = request.state.principal
        if not principal.may_change(record.owner):
            raise PermissionDeniedError(
                f"user {principal.user!r} may not cancel job {name!r}: it belongs to "
                f"{record.owner!r}; only its owner or an admin may", action="cancel",
                owner=record.owner, user=principal.user, what=f"job {name!r}")
        cancel(name)
        return RedirectResponse(f"{base_url(request)}/jobs/{name}", status_code=303)

    @api.get("/jobs/{name:path}")
    def job_page(request: Request, name: str) -> Response:
        record = jobs.get_job(name)
        principal: Principal = request.state.principal
        metrics = runs.metric_names(job_owner(name))
        files = [k.removeprefix(f"{name}/") for k in artifacts.list_keys(f"{name}/")]
        return page(request, "job.html", job=_row(record, utcnow()), record=record,
                    spec=spec_json(record.spec.to_json()), events=record.events,
                    files=files[:_MAX_FILES], more_files=max(0, len(files) - _MAX_FILES),
                    lock=_text_or_none(artifacts, job_key(name, "env", "requirements.lock")),
                    may_cancel=principal.may_change(record.owner),
                    metrics_owner=job_owner(name), metrics=metrics[:12],
                    runs=runs.runs_for_job(name))

    return api
