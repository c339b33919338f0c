"""Maintenance through the team server, on the server's own stores and host: ``shoal gc``
and ``shoal jobs delete`` (the server's ``jobs.cleanup``, limited to the caller's own
records unless an admin asks) and ``shoal workers list|stop`` (the server host's launchers,
warm workers and endpoint supervisors; admins only)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field

from shoal.core.jobs import JobStatus
from shoal.errors import InvalidArgumentError, NotFoundError, PermissionDeniedError
from shoal.server._owners import caller, require_owner
from shoal.server._users import require_admin
from shoal.session import Session

__all__ = ["maintenance_routes"]


class GcIn(BaseModel):
    older_than_seconds: float = Field(ge=0)
    statuses: list[JobStatus]
    dry_run: bool = False


class RemovalIn(BaseModel):
    names: list[str]
    dry_run: bool = False


class WorkersStopIn(BaseModel):
    pids: list[int] = Field(default_factory=list)
    all: bool = False
    grace_seconds: float = Field(default=10.0, ge=0)


def _is_admin(request: Request) -> bool:
    try:
        require_admin(request)
    except PermissionDeniedError:
        return False
    return True


def maintenance_routes(session: Session) -> APIRouter:
    api = APIRouter(tags=["maintenance"])

    @api.post("/maintenance/gc")
    def gc(request: Request, body: GcIn) -> dict[str, Any]:
        """The server's gc; a caller who is not an admin removes only their own records."""
        from shoal.jobs.cleanup import Removal, delete_jobs, delete_runs, gc_plan

        live = [s.value for s in body.statuses if not s.is_terminal]
        if live or not body.statuses:
            raise InvalidArgumentError(f"gc removes only ended jobs (completed, failed, "
                                       f"stopped), not {', '.join(live) or 'none'}")
        owner = None if _is_admin(request) else caller(request)
        session.jobs.reap()
        cutoff = datetime.now(UTC) - timedelta(seconds=body.older_than_seconds)
        jobs, runs, experiments = gc_plan(session, cutoff, body.statuses, owner=owner)
        removal = Removal()
        delete_jobs(session, jobs, removal, dry_run=body.dry_run)
        delete_runs(session, runs, removal, dry_run=body.dry_run)
        removal.experiments = experiments
        if not body.dry_run:
            for experiment in experiments:
                session.metadata.delete_experiment(experiment)
        return removal.to_json(dry_run=body.dry_run)

    @api.post("/maintenance/job-removals")
    def remove_jobs(request: Request, body: RemovalIn) -> dict[str, Any]:
        """Ended jobs removed with everything stored for them (their owner or an admin)."""
        from shoal.jobs.cleanup import Removal, delete_jobs

        names = list(dict.fromkeys(body.names))
        for name in names:
            record = session.metadata.get_job(name)  # JobNotFound names it
            require_owner(request, record.owner, "delete", f"job {name!r}")
            if not record.is_terminal:
                raise InvalidArgumentError(f"job {name} ({record.status}) has not ended; stop "
                                           "it with 'shoal jobs cancel' first", jobs=[name])
        removal = Removal()
        delete_jobs(session, names, removal, dry_run=body.dry_run)
        return removal.to_json(dry_run=body.dry_run)

    @api.get("/maintenance/workers", dependencies=[Depends(require_admin)])
    def list_workers() -> list[dict[str, Any]]:
        return [w.to_json() for w in _workers(session)]

    @api.post("/maintenance/workers/stop", dependencies=[Depends(require_admin)])
    def stop_workers(body: WorkersStopIn) -> list[dict[str, Any]]:
        from shoal.backends.workers import stop_worker

        if bool(body.pids) == body.all:
            raise InvalidArgumentError("give the pids to stop, or all (not both)")
        workers = _workers(session)
        if not body.all:
            by_pid = {w.pid: w for w in workers}
            unknown = [p for p in body.pids if p not in by_pid]
            if unknown:
                raise NotFoundError(f"pid {', '.join(map(str, unknown))} is not a shoal worker "
                                    "of the server's host; 'shoal workers list' shows them",
                                    pids=unknown)
            workers = [by_pid[p] for p in dict.fromkeys(body.pids)]
        workers.sort(key=lambda w: w.kind == "launcher")  # launchers last
        return [{**w.to_json(), "outcome": stop_worker(w, grace_seconds=body.grace_seconds)}
                for w in workers]

    return api


def _workers(session: Session) -> list[Any]:
    """The server host's background processes for its home (as ``shoal workers list``)."""
    from shoal.backends.local import LocalBackend
    from shoal.backends.workers import find_workers

    backend = session.backend
    sockets = [backend.launcher_socket_path()] if isinstance(backend, LocalBackend) else []
    endpoints = [(r.name, str(r.status), dict(r.supervisor))
                 for r in session.metadata.list_endpoints()]
    return find_workers(session.home / "run", str(session.home), launcher_sockets=sockets,
                        endpoints=endpoints)
