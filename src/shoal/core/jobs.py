"""Job lifecycle and job domain types: frozen values, no I/O."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar, NewType, Self

from shoal.errors import InvalidTransitionError

__all__ = [
    "TRANSITIONS",
    "BatchRef",
    "ClientRef",
    "Distribution",
    "FailureKind",
    "JobChange",
    "JobEvent",
    "JobKind",
    "JobName",
    "JobRecord",
    "JobSpec",
    "JobStatus",
    "RunRef",
    "TrainingSpec",
    "Workdir",
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
    NODE_LOST = "node_lost"            # a node of the job (its supervisor's, another host's) died
    INTERNAL = "internal"              # a shoal bug or a store failure


class JobKind(StrEnum):
    FUNCTION = "function"
    SCRIPT = "script"


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What to run and how. Everything here is persisted on the job record (``to_json``)."""

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
    keep_alive_period_in_seconds: float = 0.0
    tags: tuple[tuple[str, str], ...] = ()
    python_version: str = ""
    #: Keys that mean something on SageMaker but nothing on this backend (role, VPC, KMS, image).
    inert_settings: Mapping[str, Any] = field(default_factory=dict)
    #: The client's import path, prepended to a job's on the client's own interpreter.
    sys_path: tuple[str, ...] = ()
    #: The experiment run the caller had open (``with Run(...)``), linked to the job.
    run: RunRef | None = None
    #: ``job_conda_env``: the named conda environment the job runs in.
    conda_env: str | None = None
    #: Why a GPU instance type ran on the CPU (``allow_cpu_fallback``), if it did.
    gpu_fallback: str | None = None
    #: A conda file's ``python=`` must then be the client's (``strict_versions``).
    strict_versions: bool = False
    #: Several ranks (torchrun); None: one process.
    distribution: Distribution | None = None
    #: A function job's ``CheckpointLocation`` URI (its supervisor restores and syncs it).
    checkpoint_s3_uri: str | None = None
    #: ``include_local_workdir``: the packed working directory that travels with the job.
    workdir: Workdir | None = None
    #: A script job's training settings (``Estimator.fit``).
    training: TrainingSpec | None = None
    #: ``import sagemaker`` works in the job (as in SageMaker's framework containers).
    sagemaker_alias: bool = False
    #: What the job's framework setup printed (also warned once on the client).
    framework_notices: tuple[str, ...] = ()
    #: The hand-over to a warm worker the job was submitted in, if any.
    batch: BatchRef | None = None
    #: The process that submitted the job (a record whose client died unlaunched ends at once).
    client: ClientRef | None = None
    #: Where each resolved option's value came from (``RemoteOptions.sources``): option name
    #: -> "explicit argument", "default", or the defaults file ("user file /path"); empty
    #: on specs recorded before sources were (the console says "not recorded").
    option_sources: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        # Not dataclasses.asdict: its deep copy cost ~0.5 ms a job on the hot path.
        data = {name: getattr(self, name) for name in _SPEC_FIELDS}
        data["tags"] = [list(t) for t in self.tags]
        data["environment_variables"] = dict(self.environment_variables)
        data["pre_execution_commands"] = list(self.pre_execution_commands)
        data["inert_settings"] = dict(self.inert_settings)
        data["sys_path"] = list(self.sys_path)
        data["framework_notices"] = list(self.framework_notices)
        data["option_sources"] = dict(self.option_sources)
        for name in _PART_FIELDS:
            part = getattr(self, name)
            data[name] = None if part is None else part.to_json()
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobSpec:
        """A spec from ``to_json``'s data, or from a record written before the typed fields
        (their values then stood under ``"extra"``, by the same names but ``workdir_*``)."""
        data = {**_legacy_extra(data.get("extra") or {}), **data}
        kwargs = {k: v for k, v in data.items() if k in _SPEC_NAMES}
        kwargs["name"] = JobName(kwargs["name"])
        kwargs["kind"] = JobKind(kwargs.get("kind", JobKind.FUNCTION))
        kwargs["tags"] = tuple((str(k), str(v)) for k, v in kwargs.get("tags", ()))
        kwargs["keep_alive_period_in_seconds"] = float(
            kwargs.get("keep_alive_period_in_seconds") or 0)
        for name in ("pre_execution_commands", "sys_path", "framework_notices"):
            kwargs[name] = tuple(kwargs.get(name) or ())
        kwargs["option_sources"] = {str(k): str(v)
                                    for k, v in (kwargs.get("option_sources") or {}).items()}
        for name, part in _PART_FIELDS.items():
            value = kwargs.get(name)
            kwargs[name] = None if not value else part.from_json(value)
        return cls(**kwargs)


def _legacy_extra(extra: Mapping[str, Any]) -> dict[str, Any]:
    """The typed fields of a spec stored with the old ``extra`` mapping."""
    fields = {k: v for k, v in extra.items() if k in _SPEC_NAMES}
    if extra.get("workdir_sha256"):
        fields["workdir"] = {"sha256": extra["workdir_sha256"],
                             "files": extra.get("workdir_files", 0),
                             "size_bytes": extra.get("workdir_bytes", 0)}
    return fields


class _Part:
    """A part of a spec whose fields are JSON values: stored as a mapping of them; read back
    ignoring names it does not know (a record from a later version)."""

    __slots__ = ()
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True, slots=True)
class RunRef(_Part):
    """An experiment run, by its names."""

    experiment_name: str
    run_name: str


@dataclass(frozen=True, slots=True)
class BatchRef(_Part):
    """The *index*-th job of the hand-over (batch) *id*."""

    id: str
    index: int


@dataclass(frozen=True, slots=True)
class ClientRef(_Part):
    """The process that submitted a job: its host, pid and start time (clock ticks)."""

    host: str
    pid: int
    start_ticks: int | None = None


@dataclass(frozen=True, slots=True)
class Distribution(_Part):
    """How many processes a job runs: hosts × processes per host (torchrun's ranks)."""

    hosts: int = 1
    per_host: int = 1
    torchrun: bool = False

    @property
    def world(self) -> int:
        return self.hosts * self.per_host


@dataclass(frozen=True, slots=True)
class Workdir(_Part):
    """The packed working directory of a job (``workdir/<sha256>.zip`` in its prefix)."""

    sha256: str
    files: int = 0
    size_bytes: int = 0


@dataclass(frozen=True, slots=True)
class TrainingSpec:
    """A script job's training settings: what ``Estimator.fit`` asked for, under SageMaker's
    names (the supervisor lays the container directory out from it)."""

    entry_point: str
    #: ``sourcedir.tar.gz`` in the job's prefix, and its URI (``SM_MODULE_DIR``).
    source_key: str = ""
    source_uri: str = ""
    hyperparameters: Mapping[str, Any] = field(default_factory=dict)
    #: channel name -> the resolved ``TrainingInput`` (``uri``, ``input_mode``...).
    channels: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    output_path: str | None = None
    #: Where the outputs go when no output_path is given (the session's artifact root).
    output_root: str | None = None
    metric_definitions: tuple[Mapping[str, str], ...] = ()
    checkpoint_s3_uri: str | None = None
    checkpoint_local_path: str | None = None
    instance_count: int = 1
    volume_size: int = 30
    input_mode: str = "File"
    #: The estimator's ``distribution`` argument, as given.
    distribution_config: Mapping[str, Any] = field(default_factory=dict)
    #: (distribution, version pin) of a framework estimator's framework.
    framework: tuple[str, str] | None = None
    framework_module: str = ""
    estimator: str = ""

    def model_data(self, job: str, default_root: str) -> str:
        """``<output_path>/<job>/output/model.tar.gz``: where *job*'s model goes (under
        *default_root*, the session's artifact root, when the spec names no root)."""
        root = self.output_path or self.output_root or default_root
        return f"{str(root).rstrip('/')}/{job}/output/model.tar.gz"

    def to_json(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in _TRAINING_FIELDS}
        data["hyperparameters"] = dict(self.hyperparameters)
        data["channels"] = {n: dict(c) for n, c in self.channels.items()}
        data["metric_definitions"] = [dict(d) for d in self.metric_definitions]
        data["distribution_config"] = dict(self.distribution_config)
        data["framework"] = list(self.framework) if self.framework else None
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrainingSpec:
        kwargs = {k: v for k, v in data.items() if k in _TRAINING_FIELDS and v is not None}
        # records before the typed fields held the checkpoint URI twice, once as checkpoint_uri
        kwargs.setdefault("checkpoint_s3_uri", data.get("checkpoint_uri"))
        kwargs["metric_definitions"] = tuple(kwargs.get("metric_definitions") or ())
        framework = kwargs.get("framework")
        kwargs["framework"] = (str(framework[0]), str(framework[1])) if framework else None
        return cls(**kwargs)


_TRAINING_FIELDS = tuple(f.name for f in dataclasses.fields(TrainingSpec))
_PART_FIELDS: Mapping[str, Any] = {
    "run": RunRef, "distribution": Distribution, "workdir": Workdir, "training": TrainingSpec,
    "batch": BatchRef, "client": ClientRef}
_SPEC_FIELDS = tuple(f.name for f in dataclasses.fields(JobSpec))
_SPEC_NAMES = frozenset(_SPEC_FIELDS)


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

    def to_json(self) -> dict[str, Any]:
        """The change as JSON: the shape of the team server's ``ChangeIn``."""
        def text(value: StrEnum | None) -> str | None:
            return None if value is None else str(value)

        return {"name": self.name, "status": str(self.status), "expected": text(self.expected),
                "at": None if self.at is None else self.at.isoformat(), "reason": self.reason,
                "failure_kind": text(self.failure_kind), "exit_code": self.exit_code,
                "attempt": self.attempt, "env_setup_seconds": self.env_setup_seconds}


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
    #: The user who submitted it (``local`` without a team server, and for rows older than
    #: schema 0007).
    owner: str = "local"

    @property
    def is_terminal(self) -> bool:
        return self.status.is_terminal

    def to_json(self) -> dict[str, Any]:
        """The record as JSON: the shape of the team server's ``JobOut``."""
        def at(value: datetime | None) -> str | None:
            return None if value is None else value.isoformat()

        return {"name": self.name, "spec": self.spec.to_json(), "status": str(self.status),
                "created_at": at(self.created_at), "updated_at": at(self.updated_at),
                "started_at": at(self.started_at), "ended_at": at(self.ended_at),
                "attempt": self.attempt,
                "failure_kind": None if self.failure_kind is None else str(self.failure_kind),
                "failure_reason": self.failure_reason, "exit_code": self.exit_code,
                "backend": self.backend, "handle": dict(self.handle),
                "env_setup_seconds": self.env_setup_seconds,
                "events": [{"status": str(e.status), "at": at(e.at), "reason": e.reason}
                           for e in self.events], "owner": self.owner}

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> JobRecord:
        """A record from ``to_json`` (or the server's ``JobOut``) JSON."""
        def at(value: str | None) -> datetime | None:
            return None if value is None else datetime.fromisoformat(value)

        kind = body["failure_kind"]
        return cls(
            name=JobName(body["name"]), spec=JobSpec.from_json(body["spec"]),
            status=JobStatus(body["status"]), created_at=datetime.fromisoformat(
                body["created_at"]), updated_at=datetime.fromisoformat(body["updated_at"]),
            started_at=at(body["started_at"]), ended_at=at(body["ended_at"]),
            attempt=int(body["attempt"]),
            failure_kind=None if kind is None else FailureKind(kind),
            failure_reason=body["failure_reason"], exit_code=body["exit_code"],
            backend=body["backend"], handle=dict(body["handle"]),
            env_setup_seconds=body["env_setup_seconds"],
            events=tuple(JobEvent(JobStatus(e["status"]), datetime.fromisoformat(e["at"]),
                                  e["reason"]) for e in body["events"]),
            owner=str(body.get("owner", "local")))

    @property
    def duration_seconds(self) -> float | None:
        """Seconds from running to its end; None until the job has both."""
        if self.started_at is None or self.ended_at is None:
            return None
        return (self.ended_at - self.started_at).total_seconds()
