"""Frozen domain types and ports; no I/O lives here."""

from shoal.core.clock import Clock, IdFactory, RandomIdFactory, SystemClock, job_name_for
from shoal.core.experiments import (
    ExperimentRecord,
    MetricPoint,
    MetricSummary,
    RunArtifact,
    RunRecord,
    RunStatus,
    job_owner,
    run_owner,
)
from shoal.core.jobs import (
    TRANSITIONS,
    FailureKind,
    JobChange,
    JobEvent,
    JobKind,
    JobName,
    JobRecord,
    JobSpec,
    JobStatus,
    check_transition,
)
from shoal.core.ports import (
    ArtifactStore,
    Backend,
    ExecContext,
    JobQuery,
    LaunchInfo,
    MetadataStore,
)
from shoal.core.resources import INSTANCE_TYPES, InstanceType, resolve_instance_type

__all__ = [
    "INSTANCE_TYPES",
    "TRANSITIONS",
    "ArtifactStore",
    "Backend",
    "Clock",
    "ExecContext",
    "ExperimentRecord",
    "FailureKind",
    "IdFactory",
    "InstanceType",
    "JobChange",
    "JobEvent",
    "JobKind",
    "JobName",
    "JobQuery",
    "JobRecord",
    "JobSpec",
    "JobStatus",
    "LaunchInfo",
    "MetadataStore",
    "MetricPoint",
    "MetricSummary",
    "RandomIdFactory",
    "RunArtifact",
    "RunRecord",
    "RunStatus",
    "SystemClock",
    "check_transition",
    "job_name_for",
    "job_owner",
    "resolve_instance_type",
    "run_owner",
]
