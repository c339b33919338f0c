"""The ports the layers above depend on. Implementations live in storage/ and backends/."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

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

__all__ = ["LOST_HOSTS", "RANK_HOST_LAUNCHER", "RANK_MASTER_ADDR", "ArtifactStore", "Backend", "ExecContext",
           "JobQuery", "LaunchInfo", "MetadataStore"]


@runtime_checkable
class ArtifactStore(Protocol):
    """Bytes under keys (``<job>/function/payload.pkl``); writes are atomic."""

    @property
    def root(self) -> str: ...
    def uri(self, key: str) -> str: ...
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
    limit: int = 100


@runtime_checkable
class MetadataStore(Protocol):
    def create_job(self, spec: JobSpec, *, key_salt: str, backend: str) -> JobRecord:
        """*key_salt*: the random salt the job's keys are derived with (not a key)."""
        ...
    def create_jobs(self, specs: Sequence[JobSpec], *, key_salts: Sequence[str],
                    backend: str) -> list[JobRecord]:
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
        handle: Mapping[str, Any] | None = None, env_setup_seconds: float | None = None,
        want_record: bool = True,
    ) -> JobRecord | None: ...
    def update_jobs(self, changes: Sequence[JobChange]) -> list[bool]:
        """Apply many transitions in one transaction, in order; for each, whether it was
        applied (False: the move is not allowed from the job's status then, which is left
        as it was). Changes of one job apply one after the other."""
        ...
    def set_handle(self, name: str, handle: Mapping[str, Any]) -> None: ...
    def set_handles(self, names: Sequence[str], handle: Mapping[str, Any]
                    ) -> dict[str, JobStatus]:
        """Record *handle* on each named job that has not ended (one transaction); return
        every named job's status."""
        ...
    def iter_unfinished(self) -> Iterator[JobRecord]: ...
    def delete_jobs(self, names: Sequence[str]) -> list[str]:
        """Remove the named jobs that have ended (record, history, metrics, run links), in
        one transaction; the names removed. Jobs still running are left alone."""
        ...
    def close(self) -> None: ...

    # Experiments and runs. Runs are named within their experiment.
    def ensure_experiment(self, name: str, *, display_name: str | None = None,
                          tags: Mapping[str, str] | None = None) -> ExperimentRecord: ...
    def find_experiment(self, name: str) -> ExperimentRecord | None: ...
    def get_experiment(self, name: str) -> ExperimentRecord: ...
    def list_experiments(self) -> list[ExperimentRecord]: ...
    def create_run(self, experiment_name: str, run_name: str, *,
                   display_name: str | None = None,
                   tags: Mapping[str, str] | None = None) -> RunRecord: ...
    def find_run(self, experiment_name: str, run_name: str) -> RunRecord | None: ...
    def get_run(self, experiment_name: str, run_name: str) -> RunRecord: ...
    def list_runs(self, experiment_name: str) -> list[RunRecord]: ...
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

    # Metrics of any owner: "run:<experiment>/<run>" or "job:<name>" (core.experiments).
    def add_metrics(self, owner: str, points: Sequence[MetricPoint]) -> None: ...
    def get_metrics(self, owner: str, name: str | None = None) -> list[MetricPoint]: ...
    def metric_names(self, owner: str) -> list[str]: ...
    def metric_summaries(self, owner: str) -> list[MetricSummary]: ...

    # Endpoints and the server instances behind them (core.endpoints).
    def create_endpoint(self, name: str, *, model_data: str,
                        config: EndpointConfig) -> EndpointRecord: ...
    def find_endpoint(self, name: str) -> EndpointRecord | None: ...
    def get_endpoint(self, name: str) -> EndpointRecord: ...
    def list_endpoints(self) -> list[EndpointRecord]: ...
    def update_endpoint(self, name: str, *, status: EndpointStatus,
                        expected: EndpointStatus | None = None,
                        failure_reason: str | None = None) -> EndpointRecord: ...
    def set_endpoint_supervisor(self, name: str, handle: Mapping[str, Any]) -> None: ...
    def put_endpoint_instance(self, name: str, instance: EndpointInstance) -> None: ...
    def remove_endpoint_instances(self, name: str) -> None: ...
    def delete_endpoint(self, name: str) -> bool: ...


#: Set in a supervisor's environment by a backend that placed the job's hosts on several
#: nodes: the module that runs another host's ranks on its node (``python -m MODULE
#: SPEC_JSON``), and the address of the first host, where rank 0 listens.
RANK_HOST_LAUNCHER = "SHOAL_RANK_HOST_LAUNCHER"
RANK_MASTER_ADDR = "SHOAL_RANK_MASTER_ADDR"
#: In the job's directory: a line per other host whose node or actor was lost mid-job (an
#: infrastructure failure: the attempt is retried).
LOST_HOSTS = "hosts-lost"


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


@dataclass(frozen=True, slots=True)
class LaunchInfo:
    """Facts about a launched supervisor, stored on the job record as its handle."""

    backend: str
    pid: int
    host: str
    start_ticks: int | None = None
    #: Something with ``wait(timeout) -> bool`` that returns True once the job has ended
    #: (a warm worker says so); not persisted.
    waiter: Any = field(default=None, compare=False)
    #: Backend-specific facts that find the supervisor again (a Ray actor's name).
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "pid": self.pid, "host": self.host,
                "start_ticks": self.start_ticks, **self.extra}


class Backend(Protocol):
    name: str

    def launch(self, ctx: ExecContext) -> LaunchInfo: ...
    def is_alive(self, handle: Mapping[str, Any]) -> bool | None:
        """True/False when known; None when this backend cannot tell (another host)."""
        ...
    def signal_stop(self, handle: Mapping[str, Any]) -> None: ...
    def close(self) -> None: ...
