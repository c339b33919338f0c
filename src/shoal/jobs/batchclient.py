"""The client's side of a batch: each job's outcome, as the worker reports the jobs ending."""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from shoal.core.jobs import FailureKind, JobChange, JobStatus
from shoal.core.ports import ExecContext, JobQuery
from shoal.errors import ShoalError
from shoal.jobs._batchfiles import (  # the server checks and reads keys
    calls_key,
    is_batch_file,
    is_function_key,
)
from shoal.jobs.relaunch import supervisor_words
from shoal.serialization import Payload, deserialize

if TYPE_CHECKING:
    from shoal.core.ports import JobWaiter, LaunchInfo
    from shoal.jobs.service import JobService

__all__ = ["JobBatch", "calls_key", "is_batch_file", "is_function_key"]

logger = logging.getLogger(__name__)

#: One job's outcome: returns its result or raises its exception (as JobService.outcome does).
Outcome = Callable[[], Any]


class JobBatch:
    """Jobs handed to one warm worker together (``JobService.submit_batch``)."""

    def __init__(self, service: JobService, names: Sequence[str], keys: Sequence[str],
                 info: LaunchInfo | None, ctx: ExecContext | None = None) -> None:
        self._svc = service
        self.names = tuple(names)
        self._keys = dict(zip(names, keys, strict=True))
        self._info = info
        self._ctx = ctx  # what was launched, to hand jobs the worker never took over again

    def outcomes(self, on_output: Callable[[bytes], None] | None = None
                 ) -> Iterator[tuple[str, Outcome]]:
        """``(job name, outcome)`` for every job of the batch, in the order they end.
        *on_output*: the log of a batch of one job, as it is written (``@remote``)."""
        left = dict.fromkeys(self.names)
        waiter = None if self._info is None else self._info.waiter
        follow = _LogFollower(self._svc, self.names[0], on_output) \
            if on_output is not None and len(self.names) == 1 else None
        handovers = 0
        while waiter is not None:
            for name, outcome in self._messages(waiter, follow):
                if name in left:
                    del left[name]
                    if follow is not None:
                        follow.poll()
                    yield name, outcome
            if left and not waiter.done:
                waiter.close()
            handovers += 1
            waiter = self._hand_over_again(list(left)) if left and handovers < 3 else None
        if left:
            self._settle_lost(list(left))
        for name in list(left):  # a new supervisor, or what the worker did not report
            record = self._svc.wait(name, on_output=on_output if follow is not None else None)
            yield name, functools.partial(self._svc.outcome, record)

    def _messages(self, waiter: JobWaiter, follow: _LogFollower | None = None
                  ) -> Iterator[tuple[str, Outcome]]:
        while True:
            got = waiter.read(3600.0 if follow is None else 0.1)
            if got is None:
                if follow is not None:
                    follow.poll()
                continue
            message, data = got
            if message.get("done") or message.get("lost"):
                return
            offset = 0
            for name, status, sizes in message.get("jobs", ()):
                blobs = []
                for size in sizes:
                    blobs.append(data[offset:offset + size])
                    offset += size
                yield name, self._outcome(name, status, blobs)

    def _outcome(self, name: str, status: str | None, blobs: list[bytes]) -> Outcome:
        if status == JobStatus.COMPLETED and len(blobs) == 2:
            key = self._keys[name]
            # The worker recorded the job completed before it said so; its result, signed
            # under the job's key, travels with the news.
            return lambda: deserialize(Payload(blobs[0], blobs[1]), key,
                                       what=f"result of job {name}", reader="client")
        return functools.partial(self._recorded_outcome, name)

    def _recorded_outcome(self, name: str) -> Any:
        record = self._svc.get(name)
        if not record.is_terminal:  # the worker could not record its end: watch the record
            record = self._svc.wait(name)
        return self._svc.outcome(record)

    def _hand_over_again(self, names: list[str]) -> JobWaiter | None:
        """The worker went away before taking these jobs (still pending, no supervisor's
        handle on them): hand them over again (a cluster's warm actor can retire just as a
        client picks it). Returns the new waiter, or None."""
        if self._ctx is None:
            return None
        records = self._svc.metadata.list_jobs(JobQuery(names=names, limit=len(names)))
        untaken = [r.name for r in records if r.status == JobStatus.PENDING and not r.handle]
        if not untaken or len(untaken) != len(names):
            return None  # some were taken: what happened to them is in their records
        try:
            info = self._svc.backend.launch(dataclasses.replace(self._ctx, batch=tuple(untaken),
                                                                args=(self._ctx.args[0],
                                                                      *untaken)))
        except ShoalError:
            return None
        logger.warning("the worker of %d job(s) went away before taking them; handed them "
                       "over again", len(untaken))
        self._info = info
        return info.waiter

    def _settle_lost(self, names: list[str]) -> None:
        """The worker went away before reporting these jobs: fail those that did not end."""
        info = self._info
        if info is None or self._svc.backend.is_alive(info.to_json()) is not False:
            return  # it may still record them: waiting on the records finds out
        reason = (f"the warm worker ({supervisor_words(info.to_json())}) that took this job "
                  "in a batch exited without reporting an end state: it was killed, its node was lost, "
                  "or the machine restarted")
        records = self._svc.metadata.list_jobs(JobQuery(names=names, limit=len(names)))
        # As the reaper does: a job being stopped ends stopped, any other fails.
        self._svc.advance_many([
            JobChange(r.name, JobStatus.STOPPED if r.status == JobStatus.STOPPING
                      else JobStatus.FAILED, expected=r.status,
                      failure_kind=FailureKind.SUPERVISOR_LOST, reason=reason)
            for r in records if not r.is_terminal])
        logger.warning("batch worker (%s) went away; %d job(s) failed",
                       supervisor_words(info.to_json()), len(names))


class _LogFollower:
    """Streams one job's log to a callback while its batch runs."""

    def __init__(self, service: JobService, name: str, on_output: Callable[[bytes], None]
                 ) -> None:
        self._svc, self._name, self._emit = service, name, on_output
        self._offset = 0

    def poll(self) -> None:
        chunk = self._svc.read_log(self._name, self._offset)
        if chunk:
            self._offset += len(chunk)
            self._emit(chunk)
