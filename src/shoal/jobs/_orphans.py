"""Why an unfinished job has no supervisor and never will (the reaper's question,
``JobService.reap``): its client gone before a launch, no launch within the grace period, a
relaunch nobody took, or a supervisor its backend reports gone, with its node or alone."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from shoal.core.jobs import FailureKind, JobRecord
from shoal.core.ports import Backend, LossReporter
from shoal.errors import BackendUnavailableError
from shoal.jobs.relaunch import RELAUNCH, relaunch_stale, supervisor_words

__all__ = ["UNLAUNCHED_GRACE_S", "client_gone", "how_lost", "why_orphaned"]

logger = logging.getLogger(__name__)

#: How long a record may sit without a launched supervisor before the reaper fails it.
UNLAUNCHED_GRACE_S = 120.0


def client_gone(record: JobRecord) -> str | None:
    """Why *record*'s client can no longer hand it to a supervisor (it ran on this host and
    has exited), or None."""
    from shoal.backends.procfs import process_state, start_ticks

    client = record.spec.client
    if client is None or client.host != socket.gethostname():
        return None
    pid = client.pid
    if pid and process_state(pid) not in (None, "Z", "X") and \
            start_ticks(pid) == client.start_ticks:
        return None
    return (f"its client (pid {pid} on {client.host}) exited before handing the job to a "
            "supervisor")


def why_orphaned(record: JobRecord, backend: Backend,
                 is_alive: Callable[[Mapping[str, Any]], bool | None],
                 now: datetime) -> tuple[str, FailureKind] | None:
    """Why *record* has no supervisor and never will, and the failure kind that says so
    (None: it has one, or may get one)."""
    lost = FailureKind.SUPERVISOR_LOST
    stale = relaunch_stale(record.handle, UNLAUNCHED_GRACE_S)
    if stale is not None:  # another attempt is being started (jobs/relaunch.py)
        return (f"no supervisor took its attempt {record.handle[RELAUNCH]} within "
                f"{int(UNLAUNCHED_GRACE_S)} s after the last one was lost",
                lost) if stale else None
    alive = is_alive(record.handle)
    if alive is None and not record.handle:
        age = (now - record.created_at).total_seconds()
        reason = client_gone(record)
        if reason is None and age < UNLAUNCHED_GRACE_S:
            return None
        return (reason or f"no supervisor was started for {int(age)} s after the job "
                          "was created"), lost
    if alive is False:
        return how_lost(backend, record.handle)
    return None

def how_lost(backend: Backend, handle: Mapping[str, Any]) -> tuple[str, FailureKind]:
    """The reason and kind for a supervisor its backend reports gone: its node lost
    (``node_lost``, naming the node) or only its process (``supervisor_lost``), where the
    backend can tell them apart (a cluster's); else both, as possible causes."""
    who = supervisor_words(handle)
    loss = None
    if isinstance(backend, LossReporter):
        try:
            loss = backend.supervisor_loss(handle)
        except BackendUnavailableError as e:  # the cause stays unknown; the loss is not
            logger.warning("how the supervisor (%s) was lost is unknown: %s", who, e)
    if loss is None:
        return (f"its supervisor ({who}) exited without reporting an end state: it was "
                "killed, or its machine was lost", FailureKind.SUPERVISOR_LOST)
    detail = f" ({loss.detail})" if loss.detail else ""
    if loss.node_lost:
        return (f"its supervisor ({who}) was lost with its node: {loss.where} is "
                f"declared dead{detail}", FailureKind.NODE_LOST)
    return (f"its supervisor ({who}) exited without reporting an end state: its process "
            f"was killed while its node, {loss.where}, still runs{detail}",
            FailureKind.SUPERVISOR_LOST)
