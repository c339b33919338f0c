"""A warm worker's side of a batch: many jobs calling one function, each still its own job.

The supervisor takes the batch in one go (its handle on every record, one transaction), runs
the calls one after another in its persistent executor (``_executor.py``), and records what
happens to them in few transactions: a call's ``starting``/``running`` and its end, with the
times they happened, reach the metadata store within ``FLUSH_SECONDS`` (or sooner, every
``FLUSH_JOBS`` ended calls). Each call gets its own log (split from the executor's output at
markers the executor writes before each call), its own result or exception under its own
prefix, and its own end state. The client is told which jobs ended after each transaction,
with their results.

A call that raises fails only its own job. A call that kills the executor, is stopped or runs
past its time ends as a single job would; the calls after it go to a fresh executor. A stop
asked for a call that has not started skips it (``stopped``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import selectors
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from shoal.core.jobs import FailureKind, JobChange, JobName, JobRecord, JobSpec, JobStatus
from shoal.core.ports import BatchTaker, HandedTake, JobQuery
from shoal.core.secrets import mask_text
from shoal.jobs._batchfiles import outcome_files, read_batch
from shoal.jobs._batchoutput import MarkedOutput
from shoal.jobs._entrypoint import EXIT_OK, EXIT_RAISED, EXIT_REFUSED
from shoal.jobs._outcomes import Outcome, ended_by_shoal, killed_text
from shoal.jobs._prepare import PrepareError
from shoal.jobs._process import WarmExecutor, killpg
from shoal.jobs.driver import hidden_values
from shoal.jobs.logsink import LogSink
from shoal.jobs.service import log_key
from shoal.serialization import Payload
from shoal.serialization.keys import payload_key

if TYPE_CHECKING:
    from shoal.core.ports import WarmWorkerEndpoint
    from shoal.jobs.driver import Supervisor

__all__ = ["AHEAD", "FLUSH_JOBS", "FLUSH_SECONDS", "BatchRun"]

logger = logging.getLogger(__name__)

#: Longest a change waits before it is recorded, and most ended calls per transaction.
FLUSH_SECONDS = 0.025
FLUSH_JOBS = 64
#: Longest a worker handed a batch with its take waits for the claimer to record its handle.
TAKE_WAIT_SECONDS = 60.0
#: Calls with the executor at a time (the one it runs and those that wait their turn).
AHEAD = 4
#: How often the output of a running call is read, and how much output at once makes the
#: supervisor read it as it comes instead.
DRAIN_SECONDS = 0.05
CHATTY_BYTES = 16384
_FUNCTIONS: dict[str, bytes] = {}  # the last function pickle read, by digest
Notify = Callable[[dict[str, Any], bytes], None]


@dataclass(slots=True)
class _Call:
    index: int
    name: str
    key: str
    blobs: tuple[bytes, bytes, bytes]  # function metadata, arguments pickle, its metadata
    state: str = "queued"  # queued -> sent -> begun -> ended
    began: float = 0.0  # when it began (time.time()), and on the monotonic clock
    began_mono: float = 0.0
    sink: LogSink | None = None
    stop: bool = False  # a stop was asked for it
    timed_out: bool = False


@dataclass(slots=True)
class _Pending:
    """Changes not yet recorded, and the ends to report once they are."""

    changes: list[JobChange] = field(default_factory=list)
    #: (position of the end in changes, or -1; job; its result or exception to store)
    ends: list[tuple[int, str, tuple[str, Payload] | None]] = field(default_factory=list)
    since: float = 0.0


class BatchRun:
    def __init__(self, sup: Supervisor, batch: str, names: Sequence[str],
                 notify: Notify | None,
                 handed: tuple[HandedTake, WarmWorkerEndpoint] | None = None) -> None:
        self._sup = sup
        self._handed = handed
        self._svc = sup.service
        self._batch = batch
        self._names = list(names)
        self._notify = notify
        self._calls: dict[int, _Call] = {}
        self._pending = _Pending()
        self._current: _Call | None = None
        self._output = MarkedOutput(b"", begin=self._marked, write=self._write)
        self._kill_at: float | None = None
        self._template: JobRecord | None = None
        self._hidden: tuple[str, ...] = ()  # secret values the jobs can see: masked
        # Each call runs in this worker's scratch directory; a call that leaves files in it
        # keeps them as its own workdir (``_executor._keep_workdir``).
        self._scratch = sup.work_root / f"worker-{os.getpid()}"
        self._executor: WarmExecutor | None = None
        self._began = False  # a call began on the current executor
        self._part = 0  # outcome parts written
        self._next_drain = 0.0

    # --- the batch ----------------------------------------------------------------------

    def run(self) -> int:
        sup = self._sup
        sup.begin(None)
        try:
            if not self._take():
                return 0
            if not self._acquire_slot():
                return 0
            try:
                self._run_calls()
            finally:
                sup.release_slot()
                # What the calls started and left (a scan per call would slow batches down).
                sup.end_leftovers(self._spec.stop_grace_period_in_seconds)
        except Exception as e:  # a store failure or a shoal bug: never leave a job running
            logger.exception("supervisor of batch %s failed", self._batch)
            reason = (f"the supervisor failed: {type(e).__name__}: {e}\n"
                      f"{traceback.format_exc(limit=5)}")
            with contextlib.suppress(Exception):
                self._fail_unrecorded(reason)
            return 1
        finally:
            for call in self._calls.values():
                if call.sink is not None:
                    with contextlib.suppress(Exception):
                        call.sink.close()
        return 0

    def _take(self) -> bool:
        """Say who supervises the batch's jobs; load what the pending ones need."""
        svc = self._svc
        calls = None
        if self._handed is not None:  # handed over with the batch: the claimer records it
            take, claimer = self._handed
            answer = claimer.take_statuses(TAKE_WAIT_SECONDS)
            if answer is None:  # it recorded nothing: its launch fails the jobs saying why
                return False
            statuses, handle = answer
            first, calls = take.record, take.calls
            if dict(handle) != _own_handle(self._sup):  # not this supervisor's own word
                statuses = svc.metadata.set_handles(self._names, _own_handle(self._sup))
        elif isinstance(svc.metadata, BatchTaker):  # through a team server: one request
            statuses, first, calls = svc.metadata.take_batch(self._names, _own_handle(self._sup),
                                                             self._batch)
        else:
            statuses = svc.metadata.set_handles(self._names, _own_handle(self._sup))
            first = svc.get(self._names[0])
        # Its secret variables decrypted: the same in every job of the batch.
        self._template = svc.unseal(first)
        self._hidden = hidden_values(self._template.spec)
        todo = [n for n in self._names if statuses[n] == JobStatus.PENDING]
        keys = {n: payload_key(svc.job_secret(n)) for n in todo}
        payloads = read_batch(svc.artifacts, self._batch, cache=_FUNCTIONS, calls=calls) \
            if todo else None
        self._function = payloads.function if payloads else b""
        for index, name in enumerate(self._names):
            status = statuses[name]
            if status == JobStatus.PENDING and payloads is not None:
                self._calls[index] = _Call(index, name, keys[name], payloads.jobs[name])
            elif status == JobStatus.STOPPING:
                call = self._calls[index] = _Call(index, name, "", (b"", b"", b""))
                self._end(call, JobStatus.STOPPED, reason="stopped before it started")
            else:  # handed over twice, or ended meanwhile: report what the record says
                self._pending.ends.append((-1, name, None))
        if not todo:
            self._flush()
        return bool(todo)

    def _acquire_slot(self) -> bool:
        while not self._sup.acquire_slot():
            self._on_stop(None)
            if all(c.state == "ended" for c in self._calls.values()):
                self._flush()
                return False
        return True

    def _run_calls(self) -> None:
        sup = self._sup
        spec = self._spec
        self._scratch.mkdir(parents=True, exist_ok=True)
        try:
            sink = self._sink_for(self._names[0])
            env = sup.prepare_batch(self._record, self._scratch, sink)
        except PrepareError as e:
            for call in self._calls.values():
                if call.state != "ended":
                    self._end(call, JobStatus.FAILED, kind=e.kind, reason=e.reason)
            self._flush()
            return
        deaths = 0
        while any(c.state == "queued" for c in self._calls.values()):
            self._round(sup.executor_for(spec), env)
            deaths = 0 if self._began else deaths + 1
            if deaths >= 3:
                for call in self._calls.values():
                    if call.state == "queued":
                        self._end(call, JobStatus.FAILED, kind=FailureKind.INTERNAL,
                                  reason="the warm executor exited three times before it "
                                         "began this job; see the supervisor's log")
        self._flush()

    @property
    def _record(self) -> JobRecord:
        """The record of the batch's first job: its spec is every job's but for the name."""
        if self._template is None:
            raise RuntimeError("the batch was not taken")
        return self._template

    @property
    def _spec(self) -> JobSpec:
        return self._record.spec

    # --- one executor ---------------------------------------------------------------------

    def _round(self, executor: WarmExecutor, env: dict[str, str]) -> None:
        """Hand the queued calls to *executor*, ``AHEAD`` at a time, and follow them until
        they end or it dies. A call not yet handed over can be stopped on the spot."""
        self._output = MarkedOutput(secrets.token_hex(8).encode(), begin=self._marked,
                                    write=self._write)
        self._current = None
        self._executor = executor
        self._began = False
        opening = {"batch": {"marker": self._output.marker.decode(), "env": env,
                             "cwd": str(self._scratch),
                             "pythonpath": [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                            if p]},
                   "function": len(self._function)}
        try:
            self._feed(executor, first=json.dumps(opening).encode() + b"\n" + self._function)
            if self._pump(executor) and executor.alive:
                executor.ctrl.setblocking(True)
                executor.ctrl.sendall(b'{"end": true}\n')  # back to single jobs or batches
        except OSError:  # it died (between batches, or as we spoke to it)
            self._executor_died(executor)

    def _pump(self, executor: WarmExecutor) -> bool:
        """Follow the calls with *executor* until none is left; False if it died meanwhile.
        Its output is read with each answer, and every DRAIN_SECONDS while a call runs: it
        wakes this process by itself only once a call turns out to be chatty."""
        ctrl = executor.ctrl
        sel = selectors.DefaultSelector()
        sel.register(ctrl, selectors.EVENT_READ, "ctrl")
        sel.register(self._sup.wake_fd, selectors.EVENT_READ, "wake")
        watching = False
        self._next_drain = time.monotonic() + DRAIN_SECONDS
        inbox = bytearray()
        try:
            while self._open:
                if self._sup.signalled:
                    self._on_stop(executor)
                if time.monotonic() >= self._next_drain:
                    if self._output.read(executor.out_fd) >= CHATTY_BYTES and not watching:
                        sel.register(executor.out_fd, selectors.EVENT_READ, "out")
                        watching = True
                    self._next_drain = time.monotonic() + DRAIN_SECONDS
                for key, _ in sel.select(self._timeout()):
                    if key.data == "wake":
                        self._sup.drain_wakeups()
                    elif key.data == "out":
                        self._output.read(executor.out_fd)
                    else:
                        ctrl.setblocking(False)
                        try:
                            chunk = ctrl.recv(1 << 20)
                        except (BlockingIOError, InterruptedError):
                            continue
                        if not chunk:
                            self._executor_died(executor)
                            return False
                        inbox += chunk
                        self._answers(inbox, executor)
                        if executor.alive:
                            self._feed(executor)
                self._tick(executor)
        finally:
            sel.close()
        return True

    @property
    def _open(self) -> int:
        """Calls handed to the executor that have not ended, or still to hand over."""
        return sum(1 for c in self._calls.values() if c.state != "ended")

    def _feed(self, executor: WarmExecutor, *, first: bytes = b"") -> None:
        """Keep ``AHEAD`` calls with the executor, so it never waits for the next one
        (*first*: the batch's opening, sent with them)."""
        out = sum(1 for c in self._calls.values() if c.state in ("sent", "begun"))
        more = [] if out > AHEAD // 2 else \
            [c for c in self._calls.values() if c.state == "queued"][:AHEAD - out]
        data = first
        if more:
            head = {"calls": [{"i": c.index, "job": c.name, "key": c.key,
                               "workdir": str(self._sup.work_root / f"{c.name}.1")}
                              for c in more],
                    "sizes": [len(b) for c in more for b in c.blobs]}
            data += json.dumps(head).encode() + b"\n" + b"".join(b for c in more for b in c.blobs)
        if data:
            executor.ctrl.setblocking(True)
            executor.ctrl.sendall(data)
        for call in more:
            call.state = "sent"

    def _timeout(self) -> float:
        now = time.monotonic()
        waits = [1.0, self._next_drain - now]
        if self._pending.changes:
            waits.append(self._pending.since + FLUSH_SECONDS - now)
        current = self._current
        if current is not None:
            waits.append(current.began_mono + self._spec.max_runtime_in_seconds - now)
            if current.sink is not None:
                waits.append(current.sink.next_flush(now) - now)
        if self._kill_at is not None:
            waits.append(self._kill_at - now)
        return max(0.0, min(waits))

    def _tick(self, executor: WarmExecutor) -> None:
        now = time.monotonic()
        current = self._current
        if current is not None and not current.timed_out and not current.stop \
                and now >= current.began_mono + self._spec.max_runtime_in_seconds:
            current.timed_out = True
            _kill(executor, signal.SIGKILL)
        if self._kill_at is not None and now >= self._kill_at:
            _kill(executor, signal.SIGKILL)
            self._kill_at = None
        if current is not None and current.sink is not None:
            current.sink.maybe_flush(now)
        self._maybe_flush()

    def _answers(self, inbox: bytearray, executor: WarmExecutor) -> None:
        """Handle every complete answer in *inbox*."""
        while (end := inbox.find(b"\n")) >= 0:
            head = json.loads(bytes(inbox[:end]))
            need = sum(head.get("sizes") or ())
            if len(inbox) < end + 1 + need:
                return  # its blobs are on the way
            data = bytes(inbox[end + 1:end + 1 + need])
            del inbox[:end + 1 + need]
            call = self._calls[int(head["i"])]
            if head.get("skipped"):
                self._end(call, JobStatus.STOPPED, reason="stopped before it started")
                continue
            self._output.read(executor.out_fd)  # all of its output came before its answer
            self._call_ended(call, head, data)
            if head.get("discard"):
                sys.stderr.write(f"[shoal] warm executor discarded: {head['discard']}\n")
                executor.alive = False  # it exits; the next calls go to a fresh one

    def _call_ended(self, call: _Call, head: dict[str, Any], data: bytes) -> None:
        began, ended = head.get("t") or (call.began, time.time())
        if call.state != "begun":  # its marker is read by now; be safe anyway
            self._begin(call, began)
        if self._current is call:
            self._output.release()
        sizes = head.get("sizes") or []
        payload = Payload(data[:sizes[0]], data[sizes[0]:]) if len(sizes) == 2 else None
        rc, kind = int(head["exit"]), head.get("kind")
        if rc == EXIT_OK and kind == "results" and payload is not None:
            self._end(call, Outcome(JobStatus.COMPLETED, exit_code=0), at=ended,
                      payload=("results", payload))
        elif rc == EXIT_RAISED and kind == "exception" and payload is not None:
            detail = head.get("summary") or {}
            self._end(call, Outcome(JobStatus.FAILED, FailureKind.USER_ERROR,
                                    f"{detail.get('type', 'exception')}: "
                                    f"{detail.get('message', '')}", exit_code=rc),
                      at=ended, payload=("exception", payload))
        elif rc == EXIT_REFUSED and head.get("error"):
            error = head["error"]
            self._end(call, Outcome(JobStatus.FAILED, FailureKind(error.get("kind", "internal")),
                                    str(error.get("message")), exit_code=rc), at=ended)
        else:
            self._end(call, self._died_outcome(call, rc), at=ended)

    def _died_outcome(self, call: _Call, rc: int) -> Outcome:
        """How a call ends whose process ended under it (as for a job of its own)."""
        ended = ended_by_shoal(self._spec, rc, stopped=call.stop, timed_out=call.timed_out)
        if ended is not None:
            return ended
        if rc < 0:
            return Outcome(JobStatus.FAILED, FailureKind.SIGNAL, killed_text(rc), exit_code=rc)
        tail = call.sink.tail(20) if call.sink is not None else ""
        return Outcome(JobStatus.FAILED, FailureKind.EXIT_CODE,
                       f"the job process exited with code {rc}; last output:\n{tail}",
                       exit_code=rc)

    def _executor_died(self, executor: WarmExecutor) -> None:
        with contextlib.suppress(OSError):
            self._output.read(executor.out_fd)
        try:
            _, status = os.waitpid(executor.pid, 0)
            rc = os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            rc = -int(signal.SIGKILL)
        executor.alive = False
        executor.close()
        self._sup.forget_executor()
        self._kill_at = None
        call = self._current
        if call is not None and call.state == "begun":
            self._output.release()
            self._end(call, self._died_outcome(call, rc))
        for other in self._calls.values():
            if other.state == "sent":
                if other.stop:
                    self._end(other, JobStatus.STOPPED, reason="stopped before it started")
                else:
                    other.state = "queued"  # to the next executor
        self._current = None

    # --- output -----------------------------------------------------------------------

    def _marked(self, index: int, began: float) -> None:
        self._begin(self._calls[index], began)

    def _write(self, data: bytes) -> None:
        call = self._current
        if call is None:  # the executor's own output, outside any call
            sys.stderr.buffer.write(data)
            return
        if call.sink is None:
            call.sink = self._sink_for(call.name)
        call.sink.write(data)

    def _sink_for(self, name: str) -> LogSink:
        # A job that prints nothing gets no log file: LogSink opens it at the first write.
        return LogSink(self._svc.artifacts, log_key(name), self._sup.work_root / f"{name}.log",
                       redact=self._hidden)

    # --- state ----------------------------------------------------------------------------

    def _begin(self, call: _Call, began: float) -> None:
        if call.state == "begun" or call.state == "ended":
            return
        call.state, call.began, call.began_mono = "begun", began, time.monotonic()
        self._current = call
        self._began = True
        at = datetime.fromtimestamp(began, UTC)
        name = JobName(call.name)
        self._queue(JobChange(name, JobStatus.STARTING, expected=JobStatus.PENDING, at=at,
                              attempt=1),
                    JobChange(name, JobStatus.RUNNING, expected=JobStatus.STARTING, at=at,
                              env_setup_seconds=0.0))
        if call.stop and self._executor is not None:  # asked to stop on its way: stop it now
            _kill(self._executor, signal.SIGTERM)
            self._kill_at = time.monotonic() + self._spec.stop_grace_period_in_seconds

    def _end(self, call: _Call, outcome: Outcome | JobStatus, *, at: float | None = None,
             kind: FailureKind | None = None, reason: str | None = None,
             payload: tuple[str, Payload] | None = None) -> None:
        if isinstance(outcome, JobStatus):
            status, code = outcome, None
        else:
            status, kind, reason, code = outcome.status, outcome.kind, outcome.reason, \
                outcome.exit_code
        if reason and self._hidden:  # a reason may quote a secret value: masked
            reason = mask_text(reason, self._hidden)
        if call.sink is not None:
            call.sink.close()  # the whole log is stored before the job is recorded ended
        if self._current is call:
            self._current = None
        call.state = "ended"
        change = JobChange(JobName(call.name), status, reason=reason, failure_kind=kind,
                           exit_code=code,
                           at=None if at is None else datetime.fromtimestamp(at, UTC))
        self._queue(change)
        self._pending.ends.append((len(self._pending.changes) - 1, call.name, payload))

    def _queue(self, *changes: JobChange) -> None:
        if not self._pending.changes:
            self._pending.since = time.monotonic()
        self._pending.changes.extend(changes)

    def _maybe_flush(self) -> None:
        pending = self._pending
        if pending.changes and (len(pending.ends) >= FLUSH_JOBS
                                or time.monotonic() - pending.since >= FLUSH_SECONDS):
            self._flush()

    def _fail_unrecorded(self, reason: str) -> None:
        """After a failure of the supervisor: every job whose end is not recorded fails (a
        result that may not have been stored is not reported)."""
        pending = self._pending
        unrecorded = {name for _, name, _ in pending.ends}
        self._pending = _Pending([c for c in pending.changes if not c.status.is_terminal],
                                 [], pending.since)
        for call in self._calls.values():
            if call.state != "ended" or call.name in unrecorded:
                self._end(call, JobStatus.FAILED, kind=FailureKind.INTERNAL, reason=reason)
        self._flush()

    def _flush(self) -> None:
        """Store the results of the calls that ended, record what is pending in one
        transaction, then tell the client which jobs ended (with their results)."""
        pending, self._pending = self._pending, _Pending()
        try:
            outcomes = [(name, p[0], p[1]) for _, name, p in pending.ends if p is not None]
            # Parts are numbered 1, 2... without gaps: readers look in order. Each is stored
            # before the ends it holds are recorded (with them, through a team server).
            files = outcome_files(self._batch, self._part + 1, outcomes) if outcomes else {}
            applied = self._advance(pending.changes, files) if pending.changes or files else []
            if outcomes:
                self._part += 1
        except BaseException:
            self._pending = pending  # nothing was recorded: still to do
            raise
        if self._notify is None or not pending.ends:
            return
        jobs: list[list[Any]] = []
        data: list[bytes] = []
        for position, name, payload in pending.ends:
            change = pending.changes[position] if position >= 0 else None
            ok = change is not None and applied[position]
            # Only a recorded end is reported as such; otherwise the client reads the record.
            status = str(change.status) if ok and change is not None else None
            sent = (payload[1].data, payload[1].metadata) \
                if status == JobStatus.COMPLETED and payload is not None else ()
            jobs.append([name, status, [len(b) for b in sent]])
            data.extend(sent)
        self._notify({"jobs": jobs}, b"".join(data))

    def _advance(self, changes: list[JobChange], files: dict[str, bytes]) -> list[bool]:
        """Record *changes* after storing *files*: through the claimer of a batch handed
        over with its take (a team server: no request of the worker's), else (or once the
        claimer could not) through the stores."""
        if self._handed is not None:
            applied = self._handed[1].record([c.to_json() for c in changes], files)
            if applied is not None:
                self._svc.applied(changes, applied)
                return applied
            self._handed = None  # it said why in the log; the stores' answer counts
        return self._svc.advance_many(changes, files=files)

    def _on_stop(self, executor: WarmExecutor | None) -> None:
        """A SIGTERM: stop the calls whose jobs were asked to stop; if none was, the worker
        retires after this batch (as for a single job)."""
        sup = self._sup
        sup.take_signal()
        if executor is not None:
            self._output.read(executor.out_fd)  # which call runs now
        open_calls = [c for c in self._calls.values() if c.state != "ended"]
        if not open_calls:
            return
        asked = {r.name for r in self._svc.metadata.list_jobs(JobQuery(
            names=[c.name for c in open_calls], statuses=(JobStatus.STOPPING,),
            limit=len(open_calls)))}
        if not asked:  # a SIGTERM nobody asked for through a job
            sup.retire_later(f"a stop signal came, but no job of batch {self._batch} was "
                             "asked to stop")
            return
        skip = []
        for call in open_calls:
            if call.name not in asked or call.stop:
                continue
            call.stop = True
            if call.state == "queued":
                self._end(call, JobStatus.STOPPED, reason="stopped before it started")
            elif call.state == "sent":
                skip.append(call.index)
            elif call.state == "begun" and executor is not None:
                _kill(executor, signal.SIGTERM)
                self._kill_at = time.monotonic() + self._spec.stop_grace_period_in_seconds
        if skip and executor is not None:
            with contextlib.suppress(OSError):
                executor.ctrl.setblocking(True)
                executor.ctrl.sendall(json.dumps({"skip": skip}).encode() + b"\n")


def _kill(executor: WarmExecutor, sig: signal.Signals) -> None:
    """Signal the executor's process group; it is never handed another call (it may have
    finished its call just before the signal, and then dies between batches)."""
    executor.alive = False
    killpg(executor.pid, sig)


_HANDLE: dict[int, dict[str, Any]] = {}


def _own_handle(sup: Supervisor) -> dict[str, Any]:
    """The supervisor's handle, read from /proc once per process."""
    pid = os.getpid()
    if pid not in _HANDLE:
        _HANDLE.clear()
        _HANDLE[pid] = sup.own_handle()
    return _HANDLE[pid]
