"""Another attempt for a job whose supervisor, or the node it ran on, was lost.

A supervisor retries the attempts that end while it lives (``driver.Supervisor._attempts``);
one that is itself killed, or goes down with its node, retries nothing. Whoever finds it gone
(the reaper, in a client or ``shoal jobs list``) starts a new supervisor for the job's next
attempt while ``max_retry_attempts`` allows one, as SageMaker retries an infrastructure
failure. The record goes back to ``pending`` first, conditionally on the status it was found
in (one reaper wins), with a *relaunch* handle: when that reaper dies before the new
supervisor records its own handle, the next reaper fails the job after a grace period instead
of leaving it pending. The event of the move says why the attempt ended.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from shoal.core.jobs import FailureKind, JobRecord, JobStatus
from shoal.errors import InvalidTransitionError, ShoalError

if TYPE_CHECKING:
    from shoal.jobs.service import JobService

__all__ = ["RELAUNCH", "may_relaunch", "relaunch", "relaunch_stale", "supervisor_words"]

#: The handle's key while a new supervisor is being started: the attempt it will run.
RELAUNCH = "relaunch"
_SINCE = "relaunch_since"


def may_relaunch(record: JobRecord) -> bool:
    """Whether a job whose supervisor is gone gets another attempt: it had started one (a
    stop was not asked for) and ``max_retry_attempts`` leaves another."""
    return (record.status in (JobStatus.STARTING, JobStatus.RUNNING)
            and 0 < record.attempt < max(1, record.spec.max_retry_attempts))


def relaunch_stale(handle: Mapping[str, Any], grace_s: float) -> bool | None:
    """None for a handle that is not a relaunch's; else whether the relaunch has waited
    longer than *grace_s* for its supervisor."""
    if RELAUNCH not in handle:
        return None
    return time.time() - float(handle.get(_SINCE) or 0.0) > grace_s


def relaunch(service: JobService, record: JobRecord, why: str,
             kind: FailureKind = FailureKind.SUPERVISOR_LOST) -> bool:
    """Start attempt ``record.attempt + 1`` of *record* (found in its status, supervisor
    gone: *why*, of failure *kind*); False when another process moved the job first."""
    total = max(1, record.spec.max_retry_attempts)
    attempt = record.attempt + 1
    handle = {"backend": service.backend.name, RELAUNCH: attempt, _SINCE: time.time()}
    note = f"attempt {record.attempt} of {total} ended: {why}; retrying (attempt {attempt})"
    try:
        pending = service.metadata.update_job(record.name, status=JobStatus.PENDING,
                                              expected=record.status, reason=note,
                                              expected_attempt=record.attempt, handle=handle)
    except InvalidTransitionError:
        return False
    try:
        service.launch(pending or service.get(record.name))
    except ShoalError as e:  # its key cannot be derived here, say: say so, never leave it
        service.transition(record.name, JobStatus.FAILED, failure_kind=kind,
                           reason=f"{why}; another attempt could not be started: {e}")
    return True


def supervisor_words(handle: Mapping[str, Any]) -> str:
    """A supervisor as a person finds it: its Ray actor (and node, once known), or its pid
    and host; never "pid 0" for an actor that had not reported one."""
    parts = []
    if handle.get("actor"):
        parts.append(f"Ray actor {handle['actor']}")
        if handle.get("node_id"):
            parts.append(f"on node {handle['node_id']}")
    if handle.get("pid"):
        parts.append(f"pid {handle['pid']}")
        if handle.get("host"):
            parts.append(f"on {handle['host']}")
    return " ".join(parts) or "not yet started"
