"""How a job's attempt ended, from its process's exit code and what it left: one set of rules
for a function job, a script (training) job and a batched call (``_batchrun.py``)."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal.core.jobs import FailureKind, JobRecord, JobSpec, JobStatus
from shoal.errors import ShoalError
from shoal.jobs._entrypoint import EXIT_OK, EXIT_RAISED, EXIT_REFUSED
from shoal.jobs.workfiles import collect
from shoal.serialization import Payload

if TYPE_CHECKING:
    from shoal.jobs._training import TrainingAttempt
    from shoal.jobs.logsink import LogSink
    from shoal.jobs.service import JobService

__all__ = ["Outcome", "conclude", "ended_by_shoal", "killed_text"]


@dataclass(frozen=True, slots=True)
class Outcome:
    status: JobStatus
    kind: FailureKind | None = None
    reason: str | None = None
    exit_code: int | None = None
    retry: bool = False


def ended_by_shoal(spec: JobSpec, rc: int, *, stopped: bool, timed_out: bool
                   ) -> Outcome | None:
    """How a job ends that shoal stopped on request or killed at its time limit (None when
    it did neither)."""
    if stopped:
        return Outcome(JobStatus.STOPPED, reason="stopped on request", exit_code=rc)
    if timed_out:
        return Outcome(JobStatus.FAILED, FailureKind.TIMEOUT,
                       f"exceeded max_runtime_in_seconds={spec.max_runtime_in_seconds}; "
                       "the job was killed (SIGKILL)", exit_code=rc)
    return None


def killed_text(rc: int, what: str = "the job process") -> str:
    """Why a job failed whose process a signal shoal did not send killed (*rc* < 0)."""
    sig = signal.Signals(-rc).name if -rc in signal.valid_signals() else str(-rc)
    return (f"{what} was killed by signal {sig} ({-rc}), which shoal did not send (out of "
            "memory, or killed from outside)")


def conclude(service: JobService, record: JobRecord, workdir: Path, rc: int, sink: LogSink, *,
             stopped: bool, timed_out: bool, training: TrainingAttempt | None = None,
             inline: dict[str, Any] | None = None) -> Outcome:
    """The outcome of an attempt whose process exited with *rc*; a function job's result or
    exception (in *workdir*, or *inline* from a warm executor) is stored first, so a reader
    that sees the job's end finds it."""
    ended = ended_by_shoal(record.spec, rc, stopped=stopped, timed_out=timed_out)
    if ended is not None:
        return ended
    if training is not None and training.is_script:
        return _script_outcome(training, rc, sink)
    kind, blobs, detail = collect(workdir, inline)
    if rc == EXIT_OK and kind == "results" and blobs is not None:
        service.put_payload(record.name, "results", Payload(*blobs))
        return Outcome(JobStatus.COMPLETED, exit_code=0)
    if rc == EXIT_RAISED and kind == "exception" and blobs is not None:
        service.put_payload(record.name, "exception", Payload(*blobs))
        return Outcome(JobStatus.FAILED, FailureKind.USER_ERROR,
                       f"{detail.get('type', 'exception')}: {detail.get('message', '')}",
                       exit_code=rc)
    if rc == EXIT_REFUSED and kind == "error":
        failure = FailureKind(detail.get("kind", FailureKind.INTERNAL))
        return Outcome(JobStatus.FAILED, failure, str(detail.get("message")), exit_code=rc)
    if rc < 0:
        return Outcome(JobStatus.FAILED, FailureKind.SIGNAL, killed_text(rc), exit_code=rc,
                       retry=True)
    return Outcome(JobStatus.FAILED, FailureKind.EXIT_CODE,
                   f"the job process exited with code {rc}; last output:\n{sink.tail(20)}",
                   exit_code=rc)


def _script_outcome(training: TrainingAttempt, rc: int, sink: LogSink) -> Outcome:
    """A script's end: its model uploaded, or the AlgorithmError SageMaker reports."""
    if rc == 0:
        try:
            training.upload_outputs()
        except (ShoalError, OSError) as e:
            return Outcome(JobStatus.FAILED, FailureKind.INTERNAL,
                           f"the script succeeded but its model could not be uploaded: {e}",
                           exit_code=rc, retry=True)
        return Outcome(JobStatus.COMPLETED, exit_code=0)
    failure = training.failure_text()
    if rc < 0:
        what = killed_text(rc, "the training process")
        retry = True
    else:
        what = f"the training script {training.cfg.entry_point} exited with code {rc}"
        retry = False
    reason = f"AlgorithmError: {failure}\n({what})" if failure else \
        f"AlgorithmError: {what}; last output:\n{sink.tail(20)}"
    return Outcome(JobStatus.FAILED, FailureKind.SIGNAL if rc < 0 else FailureKind.EXIT_CODE,
                   reason, exit_code=rc, retry=retry)
