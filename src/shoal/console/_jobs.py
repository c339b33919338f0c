"""The console's job pages: the jobs list (filters, keyset pages, live statuses), a job
(spec, timeline, live log, metrics, cancel) and the log's byte ranges."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from starlette.responses import FileResponse, RedirectResponse, Response

from shoal.console._config import resolved_options
from shoal.console._forms import require_csrf
from shoal.console._render import ago, base_url, page, seconds, spec_json
from shoal.console._session import Principal, Sessions, utcnow
from shoal.core.experiments import job_owner
from shoal.core.jobs import JobRecord, JobStatus
from shoal.core.ports import ArtifactStore, JobQuery, JobSort, JobStore, RunStore
from shoal.core.tags import parse_tag
from shoal.errors import ArtifactNotFound, InvalidArgumentError, PermissionDeniedError
from shoal.jobs import log_key
from shoal.storage.artifacts import job_key

__all__ = ["Cancel", "JobsView", "job_routes"]

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


#: The jobs list's sortable columns: its ``sort=`` value -> the store's order.
SORTS = {s.value: s for s in JobSort}


@dataclass(frozen=True, slots=True)
class JobsView:
    """What the jobs list was asked for (its URL's query): filters, order and page."""

    status: str = ""
    name: str = ""
    owner: str = ""
    age: str = ""
    tag: str = ""
    sort: str = "created"
    order: str = "desc"
    after: str = ""

    def query(self) -> JobQuery:
        statuses: tuple[JobStatus, ...] = ()
        if self.status:
            try:
                statuses = (JobStatus(self.status),)
            except ValueError:
                raise InvalidArgumentError(
                    f"no job status is called {self.status!r}; pick one of "
                    f"{', '.join(s.value for s in JobStatus)}", status=self.status) from None
        if self.age and self.age not in AGES:
            raise InvalidArgumentError(f"age={self.age!r} is not one of {', '.join(AGES)}",
                                       age=self.age)
        if self.sort not in SORTS:
            raise InvalidArgumentError(f"sort={self.sort!r} is not one of {', '.join(SORTS)}",
                                       sort=self.sort)
        if self.order not in ("asc", "desc"):
            raise InvalidArgumentError(f"order={self.order!r} is not asc or desc",
                                       order=self.order)
        tags = tuple(parse_tag(t.strip()) for t in self.tag.split(",") if t.strip())
        return JobQuery(statuses=statuses, name_contains=self.name or None,
                        owner=self.owner or None,
                        created_after=utcnow() - AGES[self.age] if self.age else None,
                        tags=tuple((k.strip(), v.strip()) for k, v in tags),
                        sort=SORTS[self.sort], descending=self.order == "desc",
                        after=self.after or None, limit=PAGE_SIZE + 1)

    def params(self, **changed: str) -> str:
        """This view's URL query with *changed* fields (defaults and blanks left out)."""
        fields = {"status": self.status, "name": self.name, "owner": self.owner,
                  "age": self.age, "tag": self.tag, "sort": self.sort, "order": self.order,
                  "after": self.after, **changed}
        defaults = {"sort": "created", "order": "desc"}
        return urlencode({k: v for k, v in fields.items() if v and defaults.get(k) != v})


def _row(record: JobRecord, now: datetime) -> dict[str, Any]:
    running = record.started_at is not None and record.ended_at is None
    duration = record.duration_seconds if not running else \
        (now - record.started_at).total_seconds() if record.started_at else None
    return {"name": record.name, "status": record.status.value, "owner": record.owner,
            "instance_type": record.spec.instance_type or "", "age": ago(record.created_at, now),
            "duration": seconds(duration), "terminal": record.is_terminal,
            "tags": [f"{k}={v}" for k, v in record.spec.tags]}


def _listing(jobs: JobStore, view: JobsView) -> dict[str, Any]:
    found = jobs.list_jobs(view.query())
    now = utcnow()
    shown = found[:PAGE_SIZE]
    more = view.params(after=shown[-1].name) if len(found) > PAGE_SIZE else None
    columns = []
    for key, label in (("name", "Name"), ("status", "Status"), ("", "Owner"),
                       ("", "Instance type"), ("created", "Age"), ("duration", "Duration"),
                       ("", "Tags")):
        current = key == view.sort
        # the first click sorts the column's natural way: names and statuses A-Z, the
        # newest and the longest first; a second click turns the order round
        order = ("asc" if view.order == "desc" else "desc") if current else \
            "asc" if key in ("name", "status") else "desc"
        columns.append({"label": label, "key": key, "current": current,
                        "order": view.order if current else "",
                        "href": view.params(sort=key, order=order, after="") if key else ""})
    return {"rows": [_row(r, now) for r in shown], "next_query": more,
            "query": view.params(), "first_query": view.params(after=""),
            "paged": bool(view.after), "view": view, "columns": columns,
            "ages": list(AGES), "statuses": [s.value for s in JobStatus]}


def job_routes(jobs: JobStore, artifacts: ArtifactStore, runs: RunStore, cancel: Cancel,
               sessions: Sessions) -> APIRouter:
    api = APIRouter()

    def view_of(request: Request) -> JobsView:
        got = request.query_params
        return JobsView(**{f: got.get(f, default) for f, default in (
            ("status", ""), ("name", ""), ("owner", ""), ("age", ""), ("tag", ""),
            ("sort", "created"), ("order", "desc"), ("after", ""))})

    @api.get("/jobs")
    def jobs_page(request: Request) -> Response:
        return page(request, "jobs.html", **_listing(jobs, view_of(request)))

    @api.get("/jobs-rows")
    def jobs_rows(request: Request) -> Response:
        return page(request, "_job_rows.html", **_listing(jobs, view_of(request)))

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
                    config=resolved_options(record.spec),
                    files=files[:_MAX_FILES], more_files=max(0, len(files) - _MAX_FILES),
                    lock=_text_or_none(artifacts, job_key(name, "env", "requirements.lock")),
                    may_cancel=principal.may_change(record.owner),
                    metrics_owner=job_owner(name), metrics=metrics[:12],
                    runs=runs.runs_for_job(name))

    return api
