"""The pydantic models on the wire of the ``JobStore`` routes (``server/_jobs.py``).

A job's spec and handle travel as the JSON objects ``JobSpec.to_json`` and the backends make
(their fields are the core types' business, not the wire's); payload bytes travel base64'd.
``shoal.client.jobs`` decodes the same JSON into ``core`` records without pydantic.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from shoal.core.jobs import FailureKind, JobChange, JobName, JobRecord, JobSpec, JobStatus

__all__ = ["ChangesIn", "CreateIn", "CreateManyIn", "DeleteIn", "EventOut", "HandleIn",
           "HandlesIn", "JobOut", "TakeIn", "TakeOut", "PayloadOut", "PayloadsIn", "UpdateIn"]


class EventOut(BaseModel):
    status: JobStatus
    at: datetime
    reason: str | None = None


class JobOut(BaseModel):
    name: str
    spec: dict[str, Any]
    status: JobStatus
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    attempt: int
    failure_kind: FailureKind | None
    failure_reason: str | None
    exit_code: int | None
    backend: str
    handle: dict[str, Any]
    env_setup_seconds: float | None
    events: list[EventOut]
    owner: str = "local"

    @classmethod
    def of(cls, r: JobRecord) -> JobOut:
        return cls(name=r.name, spec=r.spec.to_json(), status=r.status,
                   created_at=r.created_at, updated_at=r.updated_at, started_at=r.started_at,
                   ended_at=r.ended_at, attempt=r.attempt, failure_kind=r.failure_kind,
                   failure_reason=r.failure_reason, exit_code=r.exit_code, backend=r.backend,
                   handle=dict(r.handle), env_setup_seconds=r.env_setup_seconds,
                   events=[EventOut(status=e.status, at=e.at, reason=e.reason)
                           for e in r.events], owner=r.owner)


class CreateIn(BaseModel):
    spec: dict[str, Any]
    key_salt: str
    backend: str

    def job_spec(self) -> JobSpec:
        return JobSpec.from_json(self.spec)


class CreateManyIn(BaseModel):
    specs: list[dict[str, Any]]
    key_salts: list[str]
    backend: str


class PayloadsIn(BaseModel):
    #: kind -> [pickle, metadata], each base64.
    payloads: dict[str, tuple[str, str]]


class PayloadOut(BaseModel):
    pickle: str
    metadata: str


class UpdateIn(BaseModel):
    status: JobStatus
    expected: JobStatus | None = None
    reason: str | None = None
    failure_kind: FailureKind | None = None
    exit_code: int | None = None
    attempt: int | None = None
    handle: dict[str, Any] | None = None
    env_setup_seconds: float | None = None
    want_record: bool = True
    expected_attempt: int | None = None


class ChangeIn(BaseModel):
    name: str
    status: JobStatus
    expected: JobStatus | None = None
    at: datetime | None = None
    reason: str | None = None
    failure_kind: FailureKind | None = None
    exit_code: int | None = None
    attempt: int | None = None
    env_setup_seconds: float | None = None

    def change(self) -> JobChange:
        return JobChange(JobName(self.name), self.status, self.expected, self.at, self.reason,
                         self.failure_kind, self.exit_code, self.attempt,
                         self.env_setup_seconds)


class ChangesIn(BaseModel):
    changes: list[ChangeIn]
    #: Files stored before the changes are applied (artifact key -> base64): a batch's
    #: outcome part with its jobs' ends (``OutcomeRecorder``).
    files: dict[str, str] = Field(default_factory=dict)


class HandleIn(BaseModel):
    handle: dict[str, Any]


class HandlesIn(BaseModel):
    names: list[str]
    handle: dict[str, Any]


class TakeIn(HandlesIn):
    #: The batch whose calls file comes back with the statuses.
    batch: str


class TakeOut(BaseModel):
    """What a batch's supervisor takes: ``set_handles``' statuses, the first job's record
    and the batch's calls file (base64)."""

    statuses: dict[str, JobStatus]
    record: JobOut
    calls: str


class DeleteIn(BaseModel):
    names: list[str] = Field(default_factory=list)
