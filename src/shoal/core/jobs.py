"""Job lifecycle and job domain types: frozen values, no I/O."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, NewType

from shoal.errors import InvalidTransitionError

__all__ = [
    "TRANSITIONS",
    "FailureKind",
    "JobChange",
    "JobEvent",
    "JobKind",
    "JobName",
    "JobRecord",
    "JobSpec",
    "JobStatus",
    "check_transition",
]

JobName = NewType("JobName", str)


class JobStatus(StrEnum):
    PENDING = "pending"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    COMPLETED = "completed"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.STOPPED})

#: The only moves a job may make. ``starting -> pending`` is a retry going back to the queue.
TRANSITIONS: Mapping[JobStatus, frozenset[JobStatus]] = {
    JobStatus.PENDING: frozenset({JobStatus.STARTING, JobStatus.STOPPING, JobStatus.STOPPED,
                                  JobStatus.FAILED}),
    JobStatus.STARTING: frozenset({JobStatus.RUNNING, JobStatus.PENDING, JobStatus.STOPPING,
                                   JobStatus.FAILED}),
    JobStatus.RUNNING: frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.STOPPING,
                                  JobStatus.PENDING}),
    JobStatus.STOPPING: frozenset({JobStatus.STOPPED, JobStatus.FAILED, JobStatus.COMPLETED}),
    JobStatus.COMPLETED: frozenset(),
    JobStatus.FAILED: frozenset(),
    JobStatus.STOPPED: frozenset(),
}


def check_transition(job: str, current: JobStatus, new: JobStatus) -> None:
    """Raise InvalidTransitionError unless *current* may move to *new*."""
    if new not in TRANSITIONS[current]:
        raise InvalidTransitionError(
            f"job {job!r} cannot move from {current} to {new}"
            + (" (it has already ended)" if current.is_terminal else ""),
            job=job, current=str(current), new=str(new),
        )


class FailureKind(StrEnum):
    """Why a job failed; the client maps it to an exception type without reading text."""

    USER_ERROR = "user_error"          # the function raised; the exception is stored
    EXIT_CODE = "exit_code"            # the process exited non-zero without an exception
    SIGNAL = "signal"                  # killed by a signal nobody in shoal sent
    TIMEOUT = "timeout"                # max_runtime_in_seconds exceeded
    INTEGRITY = "integrity"            # a payload failed its HMAC check
    VERSION = "version"                # client/job Python or payload format mismatch
    ENVIRONMENT = "environment"        # the runtime environment could not be prepared
    SUPERVISOR_LOST = "supervisor_lost"  # the supervisor died; found by the reaper
    INTERNAL = "internal"              # a shoal bug or a store failure


class JobKind(StrEnum):
    FUNCTION = "function"
    SCRIPT = "script"


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What to run and how. Everything here is persisted on the job record."""

    name: JobName
    kind: JobKind = JobKind.FUNCTION
    function_name: str = ""
    instance_type: str | None = None
    cpus: float = 1.0
    memory_mib: int | None = None
    gpus: int = 0
    allow_cpu_fallback: bool = False
    environment_variables: Mapping[str, str] = field(default_factory=dict)
    dependencies: str | None = None
    pre_execution_commands: tuple[str, ...] = ()
    pre_execution_script: str | None = None
    max_runtime_in_seconds: int = 24 * 3600
    max_retry_attempts: int = 1
    stop_grace_period_in_seconds: float = 10.0
    keep_alive_period_in_seconds: int = 0
    tags: tuple[tuple[str, str], ...] = ()
    python_version: str = ""
    #: Keys that mean something on SageMaker but nothing on this backend (role, VPC, KMS, image).
    inert_settings: Mapping[str, Any] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        # Not dataclasses.asdict: its deep copy cost ~0.5 ms a job on the hot path.
        data = {name: getattr(self, name) for name in _SPEC_FIELDS}
        data["tags"] = [list(t) for t in self.tags]
        data["environment_variables"] = dict(self.environment_variables)
        data["pre_execution_commands"] = list(self.pre_execution_commands)
        data["inert_settings"] = dict(self.inert_settings)
        data["extra"] = dict(self.extra)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobSpec:
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["name"] = JobName(kwargs["name"])
        kwargs["kind"] = JobKind(kwargs.get("kind", JobKind.FUNCTION))
        kwargs["tags"] = tuple((str(k), str(v)) for k, v in kwargs.get("tags", ()))
        kwargs["pre_execution_commands"] = tuple(kwargs.get("pre_execution_commands", ()))
        return cls(**kwargs)


_SPEC_FIELDS = tuple(f.name for f in dataclasses.fields(JobSpec))


@dataclass(frozen=True, slots=True)
class JobEvent:
    status: JobStatus
    at: datetime
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class JobChange:
    """One transition of one job, for ``MetadataStore.update_jobs`` (many in one transaction).

    ``at`` is when it happened (None: when it is recorded); ``expected`` makes it conditional
    on the job's current status, as ``update_job(expected=...)`` does.
    """

    name: JobName
    status: JobStatus
    expected: JobStatus | None = None
    at: datetime | None = None
    reason: str | None = None
    failure_kind: FailureKind | None = None
    exit_code: int | None = None
    attempt: int | None = None
    env_setup_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A persisted snapshot of one job."""

    name: JobName
    spec: JobSpec
    status: JobStatus
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None = None
    ended_at: datetime | None = None
    attempt: int = 0
    failure_kind: FailureKind | None = None
    failure_reason: str | None = None
    exit_code: int | None = None
    backend: str = "local"
    #: Facts the backend reported about the supervisor (pid, start ticks, host).
    handle: Mapping[str, Any] = field(default_factory=dict)
    env_setup_seconds: float | None = None
    events: tuple[JobEvent, ...] = ()

    @property
    def is_terminal(self) -> bool:
        return self.status.is_terminal

    @property
    def duration_seconds(self) -> float | None:
        """Seconds from running to its end; None until the job has both."""
        if self.started_at is None or self.ended_at is None:
            return None
        return (self.ended_at - self.started_at).total_seconds()
