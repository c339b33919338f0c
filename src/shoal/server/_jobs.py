"""Routes of the ``JobStore`` port: job records, their transitions, handles and small
payloads. Each route is one store call, so a compare-and-set (``expected``,
``expected_attempt``) is as atomic through the server as on the store itself."""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request

from shoal.core.jobs import JobSpec, JobStatus
from shoal.core.ports import ArtifactStore, JobQuery, JobSort, JobStore
from shoal.core.tags import parse_tag
from shoal.errors import InvalidArgumentError, PermissionDeniedError
from shoal.jobs.batchclient import calls_key
from shoal.server._auth import job_token_of, require_jobs
from shoal.server._owners import caller, require_owner
from shoal.server._wire_jobs import (
    ChangesIn,
    CreateIn,
    CreateManyIn,
    DeleteIn,
    HandleIn,
    HandlesIn,
    JobOut,
    PayloadOut,
    PayloadsIn,
    TakeIn,
    TakeOut,
    UpdateIn,
)

__all__ = ["job_routes"]

_JOB = "/jobs/{name}"


def job_routes(store: JobStore,  # noqa: C901 - one small closure per route
               artifacts: ArtifactStore | None = None) -> APIRouter:
    """The routes over *store*; *artifacts*: where files sent with transitions go."""
    api = APIRouter(tags=["jobs"])

    @api.post("/jobs", status_code=201)
    def create_job(request: Request, body: CreateIn) -> JobOut:
        return JobOut.of(store.create_job(body.job_spec(), key_salt=body.key_salt,
                                          backend=body.backend, owner=caller(request)))

    @api.post("/job-batches", status_code=201)
    def create_jobs(request: Request, body: CreateManyIn) -> list[JobOut]:
        if len(body.key_salts) != len(body.specs):
            raise InvalidArgumentError(f"create_jobs needs one key salt per spec: "
                                       f"{len(body.specs)} specs, {len(body.key_salts)} salts")
        records = store.create_jobs([JobSpec.from_json(s) for s in body.specs],
                                    key_salts=body.key_salts, backend=body.backend,
                                    owner=caller(request))
        return [JobOut.of(r) for r in records]

    @api.get("/jobs")
    def list_jobs(status: Annotated[list[JobStatus] | None, Query()] = None,
                  name_prefix: str | None = None, name_contains: str | None = None,
                  created_after: datetime | None = None, ended_before: datetime | None = None,
                  name: Annotated[list[str] | None, Query()] = None,
                  owner: str | None = None, before: datetime | None = None,
                  before_name: str | None = None,
                  limit: Annotated[int, Query(ge=0)] = 100,
                  tag: Annotated[list[str] | None, Query()] = None,
                  sort: JobSort = JobSort.CREATED, order: Literal["asc", "desc"] = "desc",
                  after: str | None = None) -> list[JobOut]:
        if (before is None) != (before_name is None):
            raise InvalidArgumentError("GET /jobs pages with both before= (the last job's "
                                       "created_at) and before_name= (its name), or neither")
        query = JobQuery(statuses=tuple(status or ()), name_prefix=name_prefix,
                         name_contains=name_contains, created_after=created_after,
                         ended_before=ended_before, names=tuple(name or ()), owner=owner,
                         before=None if before is None or before_name is None
                         else (before, before_name), limit=limit,
                         tags=tuple(parse_tag(t) for t in tag or ()), sort=sort,
                         descending=order == "desc", after=after)
        return [JobOut.of(r) for r in store.list_jobs(query)]

    @api.get("/unfinished-jobs")
    def iter_unfinished() -> list[JobOut]:
        return [JobOut.of(r) for r in store.iter_unfinished()]

    @api.get(_JOB)
    def get_job(name: str) -> JobOut:
        return JobOut.of(store.get_job(name))

    @api.get(_JOB + "/key-salt")
    def get_job_key_salt(name: str) -> dict[str, str]:
        return {"key_salt": store.get_job_key_salt(name)}

    @api.put(_JOB + "/payloads", status_code=204)
    def put_job_payloads(name: str, body: PayloadsIn) -> None:
        store.put_job_payloads(name, {kind: (_unb64(name, kind, p), _unb64(name, kind, m))
                                      for kind, (p, m) in body.payloads.items()})

    @api.get(_JOB + "/payloads/{kind}")
    def get_job_payload(name: str, kind: str) -> PayloadOut | None:
        found = store.get_job_payload(name, kind)
        if found is None:
            return None
        return PayloadOut(pickle=base64.b64encode(found[0]).decode("ascii"),
                          metadata=base64.b64encode(found[1]).decode("ascii"))

    @api.get(_JOB + "/payload-bytes")
    def job_payload_bytes(name: str) -> dict[str, int]:
        return {"bytes": store.job_payload_bytes(name)}

    def own(request: Request, names: Sequence[str], action: str) -> None:
        """Only a job's owner (or an admin) changes it; a job token reaches only its own
        jobs, which its user owns (``require_jobs``)."""
        require_jobs(request, names, action)
        if job_token_of(request) is not None or not names:
            return
        for found in store.list_jobs(JobQuery(names=list(names), limit=len(names))):
            require_owner(request, found.owner, action, f"job {found.name!r}")

    @api.post(_JOB + "/transitions")
    def update_job(name: str, body: UpdateIn, request: Request) -> JobOut | None:
        own(request, [name], "cancel" if body.status in (JobStatus.STOPPING, JobStatus.STOPPED)
            else "change")
        record = store.update_job(
            name, status=body.status, expected=body.expected, reason=body.reason,
            failure_kind=body.failure_kind, exit_code=body.exit_code, attempt=body.attempt,
            handle=body.handle, env_setup_seconds=body.env_setup_seconds,
            want_record=body.want_record, expected_attempt=body.expected_attempt)
        return None if record is None else JobOut.of(record)

    @api.post("/job-transitions")
    def update_jobs(body: ChangesIn, request: Request) -> list[bool]:
        names = [c.name for c in body.changes]
        own(request, names, "change")
        if body.files:
            _store_files(request, names, body.files)
        return store.update_jobs([c.change() for c in body.changes])

    def _store_files(request: Request, names: Sequence[str], files: Mapping[str, str]) -> None:
        """The files sent with changes, each where its sender may write: a job token's own
        jobs' and batch's (``JobToken.may_touch_key``), a user's under the changed jobs'
        prefixes; all stored before any change is applied."""
        if artifacts is None:
            raise InvalidArgumentError("this server keeps no artifacts: POST /job-transitions "
                                       "takes no files")
        job = job_token_of(request)
        decoded = {}
        for key, text in files.items():
            allowed = job.may_touch_key(key, write=True) if job is not None else \
                key.lstrip("/").split("/", 1)[0] in names
            if not allowed:
                who = f"the job token of {job.shown}" if job is not None else "a user's token"
                raise PermissionDeniedError(
                    f"{who} may not store the artifact key {key!r} with the transitions of "
                    f"{', '.join(names)}: only its own jobs' and batch's files",
                    key=key, action="store files with transitions")
            decoded[key] = _unb64(key, "file", text)
        for key, data in decoded.items():
            artifacts.put_bytes(key, data)

    @api.put(_JOB + "/handle", status_code=204)
    def set_handle(name: str, body: HandleIn, request: Request) -> None:
        own(request, [name], "change")
        store.set_handle(name, body.handle)

    @api.put("/job-handles")
    def set_handles(body: HandlesIn, request: Request) -> dict[str, JobStatus]:
        own(request, body.names, "change")
        return store.set_handles(body.names, body.handle)

    @api.put("/job-handles/take")
    def take_batch(body: TakeIn, request: Request) -> TakeOut:
        """``BatchTaker``: a batch's supervisor takes its jobs, reads the first one's record
        and the batch's calls in one request (each as its own route would allow it)."""
        own(request, body.names, "change")
        if not body.names:
            raise InvalidArgumentError("PUT /job-handles/take needs the batch's job names")
        if artifacts is None:
            raise InvalidArgumentError("this server keeps no artifacts: a batch's calls "
                                       "cannot be read from it")
        key = calls_key(body.batch)
        job = job_token_of(request)
        if job is not None and not job.may_touch_key(key, write=False):
            raise PermissionDeniedError(
                f"the job token of {job.shown} may not read the calls of batch "
                f"{body.batch!r}: only its own batch's", key=key, action="read")
        statuses = store.set_handles(body.names, body.handle)
        return TakeOut(statuses=statuses, record=JobOut.of(store.get_job(body.names[0])),
                       calls=base64.b64encode(artifacts.get_bytes(key)).decode("ascii"))

    @api.post("/job-deletions")
    def delete_jobs(body: DeleteIn, request: Request) -> list[str]:
        own(request, body.names, "delete")
        return store.delete_jobs(body.names)

    return api


def _unb64(name: str, kind: str, text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError as e:
        raise InvalidArgumentError(f"payload {kind!r} of job {name!r} is not base64: {e}",
                                   job=name, kind=kind) from e
