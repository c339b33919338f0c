"""The pydantic models on the wire of the launch, key, wait and log routes
(``server/_launches.py``, ``server/_jobwait.py``); ``shoal.client.backend`` and
``shoal.client.keys`` read the same JSON without pydantic."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from shoal.core.api import MAX_JOB_SECRETS_PER_REQUEST
from shoal.core.jobs import JobStatus
from shoal.server._wire_jobs import JobOut

__all__ = ["AliveOut", "BackendOut", "BatchLaunchIn", "BatchLaunchOut", "CheckIn", "HandleIn", "LaunchIn", "LaunchOut",
           "MessageOut", "MessagesOut", "SecretIn", "SecretOut", "SecretsIn", "SecretsOut",
           "WaitOut"]


class LaunchIn(BaseModel):
    """An ``ExecContext``: what the client's JobService asks the server's backend to start."""

    job: str
    entrypoint: str
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    prepare: str | None = None
    pool: str | None = None
    keep_alive_seconds: float = 0.0
    cpus: float = 0.0
    gpus: int = 0
    memory_mib: int | None = None
    hosts: int = 1
    batch: list[str] = Field(default_factory=list)


class LaunchOut(BaseModel):
    """A ``LaunchInfo``; ``warm`` when a warm worker took the job (the server holds its
    claim: read ``/launches/{job}/messages``)."""

    backend: str
    pid: int
    host: str
    start_ticks: int | None = None
    extra: dict[str, Any] = Field(default_factory=dict)
    warm: bool = False


class BatchLaunchIn(BaseModel):
    """``POST /launches/batch``: a batch's records (``create_jobs``), its files (artifact key
    -> base64: the calls and, the first time, the function's pickle) and its launch."""

    specs: list[dict[str, Any]]
    key_salts: list[str]
    files: dict[str, str] = Field(default_factory=dict)
    launch: LaunchIn
    #: Seconds to wait for a warm worker's first news, which then comes in the answer
    #: (``messages``, as ``GET /launches/{launch}/messages?after=0`` would give it).
    wait: float = Field(default=0.0, ge=0.0, le=60.0)


class BatchLaunchOut(BaseModel):
    """The records created; the launch, or (``launch`` null) why the jobs failed at it."""

    records: list[JobOut]
    launch: LaunchOut | None = None
    error: str | None = None
    #: With ``wait``, what the warm worker had said by then (its first news, maybe all).
    messages: MessagesOut | None = None


class CheckIn(BaseModel):
    env: dict[str, str] = Field(default_factory=dict)


class BackendOut(BaseModel):
    name: str


class HandleIn(BaseModel):
    handle: dict[str, Any]


class AliveOut(BaseModel):
    alive: bool | None


class MessageOut(BaseModel):
    """One message of a warm worker about its batch, and the bytes behind it (base64)."""

    header: dict[str, Any]
    data: str = ""


class MessagesOut(BaseModel):
    messages: list[MessageOut]
    #: The worker said the batch (or job) ended, or went away.
    done: bool
    lost: bool = False


class SecretIn(BaseModel):
    job: str
    salt: str


class SecretOut(BaseModel):
    secret: str


class SecretsIn(BaseModel):
    jobs: list[SecretIn] = Field(max_length=MAX_JOB_SECRETS_PER_REQUEST)


class SecretsOut(BaseModel):
    secrets: list[str]


class LeaseOut(BaseModel):
    """A key lease (``POST /keys/lease``): its id and secret (hex)."""

    lease: str
    secret: str


class WaitOut(BaseModel):
    name: str
    status: JobStatus
    ended: bool


BatchLaunchOut.model_rebuild()  # MessagesOut is defined after it
