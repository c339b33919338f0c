"""The ports the layers above depend on. Implementations live in storage/ and backends/."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from shoal.core.auth import ApiToken, Scope, User
from shoal.core.downsample import MetricBuckets
from shoal.core.endpoints import (
    EndpointConfig,
    EndpointInstance,
    EndpointRecord,
    EndpointStatus,
)
from shoal.core.experiments import (
    ExperimentRecord,
    MetricPoint,
    MetricSummary,
    ParameterValue,
    RunArtifact,
    RunRecord,
    RunStatus,
)
from shoal.core.jobs import FailureKind, JobChange, JobName, JobRecord, JobSpec, JobStatus

__all__ = ["LOST_HOSTS", "RANK_HOST_LAUNCHER", "RANK_MASTER_ADDR", "ArtifactStore", "AuthStore",
           "Backend",
           "BatchLauncher", "BatchTaker", "EndpointStore", "ExecContext", "HandedJob", "HandedTake",
           "InlineTaking", "Handle", "JobEnds", "JobKeys", "JobQuery", "JobSort", "JobStore",
           "JobWaiter", "LaunchInfo", "LossReporter", "MetadataStore", "MetricStore", "OutcomeRecorder",
           "RunStore", "SaltingKeys",
           "SupervisorLoss", "WarmPoolHost", "WarmWorkerEndpoint"]


@runtime_checkable
class ArtifactStore(Protocol):
    """Bytes under keys (``<job>/function/payload.pkl``); writes are atomic."""

    @property
    def root(self) -> str: ...
    def uri(self, key: str) -> str: ...
    def local_path(self, key: str) -> str | None:
        """The file's path on this machine when the store is local disk, else None."""
        ...
    def put_bytes(self, key: str, data: bytes) -> None: ...
    def put_file(self, key: str, local: str | os.PathLike[str]) -> None: ...
    def get_file(self, key: str, local: str | os.PathLike[str]) -> None: ...
    def get_bytes(self, key: str) -> bytes: ...
    def read_range(self, key: str, start: int) -> bytes: ...
    def exists(self, key: str) -> bool: ...
    def delete_prefix(self, prefix: str) -> None: ...
    def list_keys(self, prefix: str) -> list[str]: ...
    def disk_usage(self, prefix: str) -> int:
        """Bytes stored under *prefix* (0 when nothing is)."""
        ...


class JobSort(StrEnum):
    """What a job list is ordered by (``JobQuery.sort``)."""

    CREATED = "created"
    NAME = "name"
    STATUS = "status"
    #: ``ended_at - started_at``; jobs that have not ended come last in either direction.
    DURATION = "duration"


@dataclass(frozen=True, slots=True)
class JobQuery:
    statuses: Sequence[JobStatus] = ()
    name_prefix: str | None = None
    name_contains: str | None = None
    created_after: datetime | None = None
    #: Only jobs that ended before this (so only ended jobs).
    ended_before: datetime | None = None
    #: Only these jobs (e.g. the jobs of one batch); empty means no such filter.
    names: Sequence[str] = ()
    #: Only the jobs of this user (``JobRecord.owner``).
    owner: str | None = None
    #: Keyset paging: only jobs after this ``(created_at, name)`` in the newest-first order
    #: (the last job of the previous page), so every page is an index range, never an offset.
    before: tuple[datetime, str] | None = None
    limit: int = 100
    #: Only jobs carrying every one of these ``(key, value)`` tags (``JobSpec.tags``).
    tags: Sequence[tuple[str, str]] = ()
    #: The order, ties broken by creation time, then name, in the same direction (so that
    #: a page's last job is an exact cursor); newest first by default.
    sort: JobSort = JobSort.CREATED
    descending: bool = True
    #: Keyset paging in any order: only jobs after the job of this name (the last of the
    #: previous page) in the query's order, by its values now. JobNotFound if it is gone.
    after: str | None = None


#: A backend's handle on a job's supervisor as stored on its record (``LaunchInfo.to_json``):
#: JSON, whose keys beyond ``backend``/``pid``/``host``/``start_ticks`` each backend chooses.
Handle = Mapping[str, Any]


@runtime_checkable
class JobStore(Protocol):
    """Job records, their transitions and their small payloads (``JobService``'s store)."""

    def create_job(self, spec: JobSpec, *, key_salt: str, backend: str,
                   owner: str = "local") -> JobRecord:
        """*key_salt*: the random salt the job's keys are derived with (not a key); *owner*:
        the user it belongs to (a team server passes its caller's)."""
        ...
    def create_jobs(self, specs: Sequence[JobSpec], *, key_salts: Sequence[str],
                    backend: str, owner: str = "local") -> list[JobRecord]:
        """Create every job or none (one transaction); AlreadyExistsError names the clashes."""
        ...
    def get_job(self, name: str) -> JobRecord: ...
    def find_job(self, name: str) -> JobRecord | None: ...
    def list_jobs(self, query: JobQuery) -> list[JobRecord]: ...
    def get_job_key_salt(self, name: str) -> str:
        """The job's key salt; "" for a job recorded before keys were derived (schema 0004)."""
        ...
    def put_job_payloads(self, name: str, payloads: Mapping[str, tuple[bytes, bytes]]) -> None:
        """Store (replace) small payloads of job *name*, ``{kind: (pickle, metadata)}``."""
        ...
    def get_job_payload(self, name: str, kind: str) -> tuple[bytes, bytes] | None:
        """A payload stored by put_job_payloads; None when it is not held here."""
        ...
    def job_payload_bytes(self, name: str) -> int:
        """Bytes of job *name*'s payloads held here."""
        ...
    def update_job(
        self, name: str, *, status: JobStatus, expected: JobStatus | None = None,
        reason: str | None = None, failure_kind: FailureKind | None = None,
        exit_code: int | None = None, attempt: int | None = None,
        handle: Handle | None = None, env_setup_seconds: float | None = None,
        want_record: bool = True, expected_attempt: int | None = None,
    ) -> JobRecord | None:
        """Move job *name* to *status* (only along ``core.jobs.TRANSITIONS``, and only from
        *expected* when given, and at *expected_attempt* when given: InvalidTransitionError
        otherwise); the record after, or None without *want_record*."""
        ...
    def update_jobs(self, changes: Sequence[JobChange]) -> list[bool]:
        """Apply many transitions in one transaction, in order; for each, whether it was
        applied (False: the move is not allowed from the job's status then, which is left
        as it was). Changes of one job apply one after the other."""
        ...
    def set_handle(self, name: str, handle: Handle) -> None: ...
    def set_handles(self, names: Sequence[str], handle: Handle) -> dict[str, JobStatus]:
        """Record *handle* on each named job that has not ended (one transaction); return
        every named job's status."""
        ...
    def iter_unfinished(self) -> Iterator[JobRecord]: ...
    def delete_jobs(self, names: Sequence[str]) -> list[str]:
        """Remove the named jobs that have ended (record, history, metrics, run links), in
        one transaction; the names removed. Jobs still running are left alone."""
        ...


@runtime_checkable
class MetricStore(Protocol):
    """Metrics of any owner: ``run:<experiment>/<run>`` or ``job:<name>`` (core.experiments).
    A job's supervisor writes its job's metrics here; runs read them back."""

    def add_metrics(self, owner: str, points: Sequence[MetricPoint]) -> None: ...
    def get_metrics(self, owner: str, name: str | None = None) -> list[MetricPoint]: ...
    def metric_names(self, owner: str) -> list[str]: ...
    def metric_summaries(self, owner: str) -> list[MetricSummary]: ...
    def last_metrics(self, owners: Sequence[str]) -> dict[str, dict[str, float]]:
        """The last value of each metric of each of *owners*, in one read: ``{owner: {name:
        value}}`` (an owner without metrics is absent)."""
        ...
    def metric_buckets(self, owner: str, name: str, buckets: int) -> MetricBuckets:
        """*owner*'s metric *name* as a chart *buckets* pixels wide draws it: at most
        ``2 * buckets`` points, the lowest and highest of each bucket in x order (every
        point of a shorter series; ``core.downsample``); no series is an empty one."""
        ...


@runtime_checkable
class RunStore(MetricStore, Protocol):
    """Experiments, their runs (named within their experiment) and metrics."""

    def ensure_experiment(self, name: str, *, display_name: str | None = None,
                          tags: Mapping[str, str] | None = None,
                          owner: str = "local") -> ExperimentRecord:
        """The experiment, created (owned by *owner*) if it is new."""
        ...
    def find_experiment(self, name: str) -> ExperimentRecord | None: ...
    def get_experiment(self, name: str) -> ExperimentRecord: ...
    def list_experiments(self) -> list[ExperimentRecord]: ...
    def create_run(self, experiment_name: str, run_name: str, *,
                   display_name: str | None = None,
                   tags: Mapping[str, str] | None = None, owner: str = "local") -> RunRecord: ...
    def find_run(self, experiment_name: str, run_name: str) -> RunRecord | None: ...
    def get_run(self, experiment_name: str, run_name: str) -> RunRecord: ...
    def list_runs(self, experiment_name: str) -> list[RunRecord]: ...
    def last_metric_of_runs(self, experiment_name: str, name: str) -> dict[str, float]:
        """The last value of metric *name* of every run of the experiment that has it, in one
        read: ``{run name: value}`` (what the runs table sorts by)."""
        ...
    def runs_for_job(self, job_name: str) -> list[RunRecord]: ...
    def end_run(self, experiment_name: str, run_name: str, *, status: RunStatus) -> None: ...
    def resume_run(self, experiment_name: str, run_name: str) -> None: ...
    def set_run_parameters(self, experiment_name: str, run_name: str,
                           parameters: Mapping[str, ParameterValue]) -> None: ...
    def set_run_tags(self, experiment_name: str, run_name: str,
                     tags: Mapping[str, str]) -> None: ...
    def add_run_artifact(self, experiment_name: str, run_name: str,
                         artifact: RunArtifact) -> None: ...
    def link_run_job(self, experiment_name: str, run_name: str, job_name: str) -> None: ...
    def delete_run(self, experiment_name: str, run_name: str) -> bool:
        """Remove a run and what hangs off it (parameters, tags, artifact records, job links,
        metrics); False when there was none."""
        ...
    def delete_experiment(self, name: str) -> int:
        """Remove an experiment and all its runs; how many runs went (-1: no experiment)."""
        ...


@runtime_checkable
class EndpointStore(Protocol):
    """Endpoints and the server instances behind them (core.endpoints)."""

    def create_endpoint(self, name: str, *, model_data: str, config: EndpointConfig,
                        owner: str = "local") -> EndpointRecord: ...
    def find_endpoint(self, name: str) -> EndpointRecord | None: ...
    def get_endpoint(self, name: str) -> EndpointRecord: ...
    def list_endpoints(self) -> list[EndpointRecord]: ...
    def update_endpoint(self, name: str, *, status: EndpointStatus,
                        expected: EndpointStatus | None = None,
                        failure_reason: str | None = None) -> EndpointRecord: ...
    def set_endpoint_supervisor(self, name: str, handle: Handle) -> None: ...
    def put_endpoint_instance(self, name: str, instance: EndpointInstance) -> None: ...
    def remove_endpoint_instances(self, name: str) -> None: ...
    def delete_endpoint(self, name: str) -> bool: ...


@runtime_checkable
class AuthStore(Protocol):
    """Users and API tokens of a team server (core.auth). Tokens are stored as hashes."""

    def create_user(self, name: str, *, is_admin: bool = False) -> User:
        """A new user; AlreadyExistsError naming it when the name is taken."""
        ...
    def find_user(self, name: str) -> User | None: ...
    def list_users(self) -> list[User]: ...
    def create_token(self, user: str, name: str, *, scope: Scope, token_hash: str,
                     expires_at: datetime | None = None) -> ApiToken:
        """Record a token of *user* (which must exist) by its hash; names are unique per
        user."""
        ...
    def token_by_hash(self, token_hash: str) -> ApiToken | None:
        """The token whose hash is *token_hash*, revoked and expired ones included."""
        ...
    def list_tokens(self, user: str | None = None) -> list[ApiToken]: ...
    def revoke_token(self, token_id: str) -> ApiToken:
        """Mark a token revoked (idempotent); NotFoundError naming it when there is none."""
        ...


class JobKeys(Protocol):
    """The secret (hex) of a job, given its name and the salt on its record: derived from
    the user's secret (``jobs.keys.UserKeys``) or asked of a team server
    (``client.keys.HttpJobKeys``)."""

    def secret(self, job: str, salt: str) -> str: ...

    def secrets(self, jobs: Sequence[tuple[str, str]]) -> list[str]:
        """The secrets of several ``(job, salt)`` at once, in order (a batch's jobs: one
        request through a team server)."""
        ...


@runtime_checkable
class SaltingKeys(Protocol):
    """``JobKeys`` that draw new jobs' salts themselves and derive their secrets without a
    request (a team server's client, under a key lease: ``client.keys.HttpJobKeys``)."""

    def new_secrets(self, jobs: Sequence[str]) -> list[tuple[str, str]]:
        """``(salt, secret)`` for each new job named in *jobs*, in order."""
        ...


class JobEnds(Protocol):
    """What tells a client that a job ended without it polling the record: a team server's
    long polls (``client.backend.HttpJobEnds``)."""

    def wait(self, name: str, timeout: float) -> bool:
        """True once job *name* has ended; False after *timeout* (or while the server does
        not answer)."""
        ...
    def follow_log(self, name: str, offset: int, on_output: Callable[[bytes], None],
                   timeout: float) -> int:
        """Stream job *name*'s log from *offset* to *on_output* until the job ends or
        *timeout* passes; the offset reached."""
        ...


@runtime_checkable
class MetadataStore(JobStore, RunStore, EndpointStore, AuthStore, Protocol):
    """All the metadata of one installation, in one store (``SqlMetadataStore``). Code that
    uses one domain depends on that domain's port instead."""

    def close(self) -> None:
        """Release connections; the store may be used again after (it reconnects)."""
        ...


#: Set in a supervisor's environment by a backend that placed the job's hosts on several
#: nodes: the module that runs another host's ranks on its node (``python -m MODULE
#: SPEC_JSON``), and the address of the first host, where rank 0 listens.
RANK_HOST_LAUNCHER = "SHOAL_RANK_HOST_LAUNCHER"
RANK_MASTER_ADDR = "SHOAL_RANK_MASTER_ADDR"
#: In the job's directory: a line per other host whose node or actor was lost mid-job (an
#: infrastructure failure: the attempt is retried).
LOST_HOSTS = "hosts-lost"


@dataclass(frozen=True, slots=True)
class HandedTake:
    """What a batch's supervisor would read to take its jobs, handed to a warm worker with
    the batch (a team server has both at hand: it has just recorded and stored them): the
    first job's record and the bytes of the batch's calls file. The worker then does not
    record its handle itself: it waits for the claimer to (``InlineTaking.give_statuses``).
    """

    record: JobRecord
    calls: bytes


@dataclass(frozen=True, slots=True)
class ExecContext:
    """What a backend starts: a dotted entry point, its arguments and its environment."""

    job: JobName
    entrypoint: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    #: Optional "module:function(env)" a fork server may run before forking, to warm caches.
    prepare: str | None = None
    #: Warm pool: jobs with the same key may run on a worker kept alive after an earlier job.
    pool: str | None = None
    keep_alive_seconds: float = 0.0
    #: What the job asks of a machine (its instance type); a cluster backend reserves it.
    cpus: float = 0.0
    gpus: int = 0
    memory_mib: int | None = None
    #: Machines the job spans (``instance_count``): a cluster backend places one such
    #: reservation per host (each of ``cpus``, ``gpus``, ``memory_mib``).
    hosts: int = 1
    #: Jobs handed over together to one warm worker (``JobService.submit_batch``); ``job`` then
    #: names the batch.
    batch: tuple[str, ...] = ()
    #: A batch's take, for a warm worker to be handed with it (``HandedTake``); a backend
    #: that cannot hand it over ignores it (the worker then reads it from the stores).
    take: HandedTake | None = None


class JobWaiter(Protocol):
    """A client's hold on the warm worker that took its job (or batch): it says when the job
    has ended, so the client need not poll the record. Closed once done."""

    @property
    def done(self) -> bool:
        """The worker said the job (or batch) ended, or went away."""
        ...
    def wait(self, timeout: float) -> bool:
        """True once the worker says the job ended (or the worker is gone); False on
        *timeout*."""
        ...
    def read(self, timeout: float) -> tuple[dict[str, Any], bytes] | None:
        """A batch's next message (JSON header, the bytes that follow it); None on timeout.
        ``{"done": true}`` ends the batch; a worker that went away reads ``{"lost": true}``."""
        ...
    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class LaunchInfo:
    """Facts about a launched supervisor, stored on the job record as its handle."""

    backend: str
    pid: int
    host: str
    start_ticks: int | None = None
    #: Set when a warm worker took the job: it reports the job's end; not persisted.
    waiter: JobWaiter | None = field(default=None, compare=False)
    #: Backend-specific facts that find the supervisor again (a Ray actor's name).
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "pid": self.pid, "host": self.host,
                "start_ticks": self.start_ticks, **self.extra}


@runtime_checkable
class Backend(Protocol):
    """Starts supervisors and reports facts about them; nothing more (it never writes job
    state). ``backends/memory.py`` is an in-memory implementation for tests."""

    @property
    def name(self) -> str:
        """What the backend is (``local``, ``ray``): recorded on each job."""
        ...

    def check_submission(self, env: Mapping[str, str]) -> None:
        """Before a job is recorded, with the supervisor's environment: raise (a ShoalError
        saying what to change) when its supervisor could not work where this backend runs
        it, e.g. stores on node-local paths and a cluster of several nodes."""
        ...
    def launch(self, ctx: ExecContext) -> LaunchInfo:
        """Start the supervisor of *ctx*; LaunchError when it cannot."""
        ...
    def is_alive(self, handle: Handle) -> bool | None:
        """True/False when known; None when this backend cannot tell (another host)."""
        ...
    def signal_stop(self, handle: Handle) -> None:
        """Ask the supervisor of *handle* to stop its job (it records the end itself)."""
        ...
    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class SupervisorLoss:
    """How a supervisor that is gone was lost, as its backend saw it (a fact, not a verdict:
    ``JobService`` turns it into the attempt's reason and failure kind)."""

    #: Its node died (declared dead by the cluster); False: the node lives on and only the
    #: supervisor's process (or the worker that held it) ended.
    node_lost: bool
    #: Where it ran, as a person finds it: ``node 3f2a... (10.0.0.7)``.
    where: str
    #: The backend's own words about the end (Ray's death cause), possibly empty.
    detail: str = ""


@runtime_checkable
class LossReporter(Protocol):
    """A backend that can tell, for a supervisor it reports gone, whether its node was lost
    or only its process (a cluster's; the local backend's one machine cannot be lost and
    still be asked)."""

    def supervisor_loss(self, handle: Handle) -> SupervisorLoss | None:
        """How the (gone) supervisor of *handle* was lost; None when the backend cannot
        tell. May raise BackendUnavailableError while the cluster does not answer."""
        ...


@runtime_checkable
class BatchLauncher(Protocol):
    """A backend that records a batch's jobs, stores their payload files and starts their
    supervisor in one call (a team server: one request instead of three, ``POST
    /launches/batch``). ``JobService.submit_batch`` uses it where the backend has it."""

    def create_and_launch(self, specs: Sequence[JobSpec], *, key_salts: Sequence[str],
                          files: Mapping[str, bytes], ctx: ExecContext
                          ) -> tuple[list[JobRecord], LaunchInfo | None, str | None]:
        """Record *specs* (``JobStore.create_jobs``), store *files* (artifact key -> bytes)
        and launch *ctx*. Raises, recording nothing, when the records cannot be created
        (``AlreadyExistsError`` naming the taken names, as ``create_jobs``). Once they are:
        ``(records, info, None)``, or ``(records, None, why)`` when the files could not be
        stored or the supervisor not started, the jobs then recorded failed saying why. A
        supervisor that is not a warm worker has its handle recorded on the jobs."""
        ...


@runtime_checkable
class BatchTaker(Protocol):
    """A job store that hands a batch's supervisor what it needs in one call (a team server:
    its handle on the jobs, the first job's record and the batch's calls, one request)."""

    def take_batch(self, names: Sequence[str], handle: Handle, batch: str
                   ) -> tuple[dict[str, JobStatus], JobRecord, bytes]:
        """``set_handles(names, handle)``'s statuses, ``get_job(names[0])`` read after it,
        and the bytes of batch *batch*'s calls file (``jobs/_batchfiles.py``)."""
        ...


@runtime_checkable
class InlineTaking(Protocol):
    """A warm worker's claim that was handed a batch's take (``ExecContext.take``): the
    claimer records the worker's handle on the jobs and gives it the statuses."""

    @property
    def takes_inline(self) -> bool:
        """The worker took the batch's take and waits for ``give_statuses``."""
        ...
    @property
    def worker_handle(self) -> Handle:
        """The handle to record on the batch's jobs."""
        ...
    def give_statuses(self, statuses: Mapping[str, JobStatus] | None, handle: Handle,
                      why: str | None = None) -> None:
        """``set_handles``' answer for the worker (None, with *why*: it runs nothing)."""
        ...
    def answer(self, message: Mapping[str, Any]) -> None:
        """The claimer's answer to the worker's request to record (``record``)."""
        ...


@runtime_checkable
class OutcomeRecorder(Protocol):
    """A job store that stores files with a transaction of changes in one call (a team
    server: a batch's outcome file and its jobs' ends, one request)."""

    def update_jobs_with_files(self, changes: Sequence[JobChange],
                               files: Mapping[str, bytes]) -> list[bool]:
        """Store *files* (artifact key -> bytes, each atomically, all before any change),
        then ``update_jobs(changes)``; which changes were applied. Nothing is changed when a
        file could not be stored."""
        ...


class HandedJob(Protocol):
    """What a client handed a warm worker: one job, or a batch (``job`` names the batch)."""

    @property
    def job(self) -> str: ...
    @property
    def env(self) -> dict[str, str]: ...
    @property
    def batch(self) -> tuple[str, ...]: ...
    @property
    def take(self) -> HandedTake | None:
        """The batch's take, when the claimer handed it over (``ExecContext.take``)."""
        ...


class WarmWorkerEndpoint(Protocol):
    """A warm worker's side of its pool: take the next job, report, retire when idle."""

    def release(self) -> None:
        """Become claimable (a worker opened busy, still on its first job)."""
        ...
    def next_job(self, keep_alive: float, should_stop: Callable[[], bool] = ...
                 ) -> HandedJob | None:
        """The next job handed over; None after *keep_alive* idle seconds, or once
        *should_stop*."""
        ...
    def notify(self, message: Mapping[str, Any], data: bytes = b"") -> None:
        """Tell the client of a batch about its jobs (read by ``JobWaiter.read``)."""
        ...
    def take_statuses(self, timeout: float) -> tuple[dict[str, JobStatus], Handle] | None:
        """After a job handed over with its take: the statuses ``set_handles`` gave the
        claimer and the handle it recorded; None when the claimer could not record it (or
        went away): the worker then runs nothing of that batch."""
        ...
    def record(self, changes: Sequence[Mapping[str, Any]], files: Mapping[str, bytes]
               ) -> list[bool] | None:
        """After a job handed over with its take: have the claimer store *files* and record
        *changes* (``JobChange.to_json``); which were applied, or None when it refused or
        went away (the worker then records through its stores)."""
        ...
    def job_done(self) -> None: ...
    def close(self) -> None: ...


@runtime_checkable
class WarmPoolHost(Protocol):
    """A backend whose supervisors can stay warm for the next job of their pool
    (``ExecContext.pool``): the supervisor's side of such a pool."""

    def warm_endpoint(self, directory: str, *, busy: bool = False) -> WarmWorkerEndpoint:
        """Listen on the pool in *directory*; with *busy*, claimable only after
        ``release()``."""
        ...
