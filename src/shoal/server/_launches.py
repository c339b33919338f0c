"""Jobs on the server's backend: the ``Backend`` port's routes (``/launches``) and the
per-user ``JobKeys`` route (``/keys/job-secret``).

``POST /launches`` starts a job's (or batch's) supervisor with the server's own
``Session().backend`` after rewriting its environment: the client's store settings and
credentials go, the server's home, its own URL (``SHOAL_SERVER_URL``) and a job token for
those jobs alone (``SHOAL_TOKEN``) come in, so the supervisor's session is all-HTTP. Only
shoal's supervisor entry point is started, for recorded jobs that have not ended. A warm
worker's claim (``LaunchInfo.waiter``) stays with the server, which reads it on a thread of
its own and relays what it says (``GET /launches/{launch}/messages``, a long poll).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from shoal.core.auth import ApiToken
from shoal.core.jobs import FailureKind, JobChange, JobName, JobRecord, JobSpec, JobStatus
from shoal.core.ports import ExecContext, HandedTake, InlineTaking, JobStore, JobWaiter, LaunchInfo
from shoal.core.secrets import JOB_SECRETS_VAR, is_secret_name
from shoal.errors import InvalidArgumentError, NotFoundError, PermissionDeniedError, ShoalError
from shoal.jobs.batchclient import calls_key, is_batch_file, is_function_key
from shoal.server._jobtokens import JobGrants, JobToken, JobTokens
from shoal.server._owners import caller, require_owner
from shoal.server._signals import NotifyingJobStore, Signals
from shoal.server._wire_jobs import ChangeIn, JobOut
from shoal.server._wire_launches import (
    AliveOut,
    BackendOut,
    BatchLaunchIn,
    BatchLaunchOut,
    CheckIn,
    HandleIn,
    LaunchIn,
    LaunchOut,
    LeaseOut,
    MessageOut,
    MessagesOut,
    SecretIn,
    SecretOut,
    SecretsIn,
    SecretsOut,
)

if TYPE_CHECKING:
    from shoal.session import Session

__all__ = ["ServerJobs", "launch_routes"]

_SUPERVISOR = "shoal.session:supervisor_main"
_PREPARE = "shoal.session:warm_supervisor"
#: What a client's environment may still set in its supervisor's (the rest is the server's).
_FROM_CLIENT = (JOB_SECRETS_VAR, "SHOAL_JOB_PROCESS")
#: The server's store settings: a job reaches the stores through the server only.
_STORE_VARS = ("SHOAL_METADATA_URL", "SHOAL_ARTIFACT_URL", "SHOAL_SERVER_URL", "SHOAL_TOKEN")
#: The server's own credentials: object stores', and its Ray cluster's token (Ray's token
#: authentication: ``RAY_AUTH_MODE``/``RAY_AUTH_TOKEN_PATH``, set in the server's process
#: when it connects). A supervisor needs neither; the launchers of a job's other hosts get
#: the token from the Ray worker that starts them (``backends/ray.py``), on the node.
_SERVER_ONLY = ("AWS_", "RAY_AUTH_")
logger = logging.getLogger(__name__)

_MAX_POLL_S = 60.0
#: How long a poll that has every job's news waits for the worker's "done" behind it.
_DONE_AFTER_LAST_S = 0.1
#: A batch's calls up to this size go to its warm worker with the hand-over (its take);
#: larger ones it reads with ``PUT /job-handles/take``.
_HANDED_CALLS_MAX = 1 << 20
_KEEP_DONE_S = 600.0


class ServerJobs:
    """What the job routes share: the server's session (its stores and backend), its URL, the
    job-token minter, the per-user secrets and the claims of warm workers."""

    def __init__(self, session: Session, url: str, signals: Signals) -> None:
        self.session = session
        self.url = url.rstrip("/")
        self.signals = signals
        state = session.home / "server"
        self.tokens = JobTokens(state / "job-token-secret")
        self.grants = JobGrants(self.store)
        self._user_secrets = state / "user-secrets"
        self._claims: dict[str, _Claim] = {}
        self._lock = threading.Lock()
        self._drains = _Drains()
        self._notifying = NotifyingJobStore(self.store, signals)  # a claim's records

    @property
    def store(self) -> JobStore:
        return self.session.jobs.metadata

    def user_secret_path(self, user: str) -> Path:
        return self._user_secrets / hashlib.sha256(user.encode()).hexdigest()[:32]

    def job_env(self, client: Mapping[str, str], token: str) -> dict[str, str]:
        """A supervisor's environment on this host (see module)."""
        env = {k: v for k, v in self.session.supervisor_env().items()
               if k not in _STORE_VARS and not k.startswith(_SERVER_ONLY)
               and not is_secret_name(k)}
        env.update({k: client[k] for k in _FROM_CLIENT if k in client})
        env.update(SHOAL_HOME=str(self.session.home), SHOAL_SERVER_URL=self.url,
                   SHOAL_TOKEN=token)
        return env

    def hold(self, launch: str, user: str, names: Sequence[str], waiter: JobWaiter,
             batch: bool, job: JobToken | None = None) -> None:
        """Keep *waiter*, a warm worker's claim, and read it on a thread of its own. With
        *job* (what the batch's job token grants), a worker handed its take has its changes
        recorded here on the token's terms (``record_for``)."""
        recorder = None
        if job is not None and isinstance(waiter, InlineTaking):
            recorder = functools.partial(self.record_for, job)
        claim = _Claim(user, tuple(names), waiter, batch, self.signals, f"launch:{launch}",
                       recorder)
        now = time.monotonic()
        with self._lock:
            for key in [k for k, c in self._claims.items() if c.ended_at
                        and now - c.ended_at > _KEEP_DONE_S]:
                del self._claims[key]
            self._claims[launch] = claim
        self._drains.run(claim.drain)

    def claim(self, launch: str) -> _Claim | None:
        with self._lock:
            return self._claims.get(launch)

    def record_for(self, job: JobToken, message: Mapping[str, Any], data: bytes
                   ) -> dict[str, Any]:
        """A warm worker's request to record its batch's changes (``backends/_warm.py``), on
        the terms ``POST /job-transitions`` gives its job token: only the batch's jobs,
        files only where the token may write (``may_touch_key``), nothing once its jobs have
        ended; the files stored first, ends fired to the waiting routes. The answer is
        ``{"applied": [...]}`` or ``{"error": {"code", "message"}}``."""
        try:
            changes = [ChangeIn.model_validate(c).change() for c in message["record"]]
            for change in changes:
                if change.name not in job.jobs:
                    raise PermissionDeniedError(
                        f"the worker of batch {job.batch} may not record job {change.name}: "
                        "only its own batch's jobs", job=change.name)
            files: dict[str, bytes] = {}
            offset = 0
            for key, size in message.get("files") or ():
                if not job.may_touch_key(str(key), write=True):
                    raise PermissionDeniedError(
                        f"the worker of batch {job.batch} may not store the artifact key "
                        f"{key!r}: only its own jobs' and batch's files", key=str(key))
                files[str(key)] = data[offset:offset + int(size)]
                offset += int(size)
            ended = self.grants.why_ended(job)
            if ended is not None:
                raise PermissionDeniedError(f"{ended}, and a job's token writes nothing once "
                                            "its job has ended", job=min(job.jobs))
            for key, value in files.items():
                self.session.jobs.artifacts.put_bytes(key, value)
            return {"applied": self._notifying.update_jobs(changes)}
        except (ShoalError, ValidationError, KeyError, TypeError, ValueError) as e:
            code = e.code if isinstance(e, ShoalError) else "INVALID_ARGUMENT"
            logger.warning("a warm worker's changes of batch %s were not recorded: %s",
                           job.batch, e)
            return {"error": {"code": code, "message": str(e)}}


class _Drains:
    """Threads that read warm workers' claims, kept for the next claim once one ends:
    starting a thread per launch took 0.7-3.6 ms of the launch request on a loaded machine
    (``Thread.start`` waits until the thread runs). A claim never waits for a thread: when
    none is idle, one more starts (so at most as many as claims were read at once)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._idle = 0
        self._lock = threading.Lock()

    def run(self, fn: Callable[[], None]) -> None:
        with self._lock:
            spawn = self._idle == 0
            if not spawn:
                self._idle -= 1  # an idle thread takes it
        self._queue.put(fn)
        if spawn:
            threading.Thread(target=self._work, name="shoal-claims", daemon=True).start()

    def _work(self) -> None:
        while True:
            fn = self._queue.get()
            try:
                fn()
            except Exception:  # a claim's reader failing must not end the thread
                logger.exception("reading a warm worker's claim failed")
            with self._lock:
                self._idle += 1


class _Claim:
    """A warm worker's claim the server holds for a client: read on its own thread."""

    def __init__(self, user: str, names: tuple[str, ...], waiter: JobWaiter, batch: bool,
                 signals: Signals, key: str,
                 recorder: Callable[[Mapping[str, Any], bytes], dict[str, Any]] | None = None
                 ) -> None:
        self.user, self.names, self._waiter, self._batch = user, names, waiter, batch
        self._signals, self.key = signals, key
        self._recorder = recorder
        self.messages: list[tuple[dict[str, Any], bytes]] = []
        self.done = self.lost = False
        self.ended_at = 0.0
        self._unreported = set(names)  # jobs the worker has not said anything of yet

    @property
    def all_reported(self) -> bool:
        """The worker has reported every job of the batch: its ``done`` is coming."""
        return not self._unreported

    def drain(self) -> None:
        try:
            while self._batch:
                got = self._waiter.read(3600.0)
                if got is None:
                    continue
                message, data = got
                if message.get("done") or message.get("lost"):
                    self.lost = bool(message.get("lost"))
                    break
                if "record" in message:  # a worker handed its take records through us
                    answer = {"error": {"code": "INVALID_ARGUMENT", "message": "this claim "
                                        "records nothing"}} if self._recorder is None else \
                        self._recorder(message, data)
                    if isinstance(self._waiter, InlineTaking):
                        self._waiter.answer(answer)
                    continue
                for job in message.get("jobs", ()):
                    self._unreported.discard(str(job[0]))
                self.messages.append((message, data))
                self._signals.fire([self.key])
            while not self._batch and not self._waiter.wait(3600.0):
                pass
        finally:
            self._waiter.close()
            self.done, self.ended_at = True, time.monotonic()
            self._signals.fire([self.key, *self.names])


def _principal(request: Request) -> ApiToken:
    token: ApiToken = request.state.principal
    return token


def _check_entrypoint(body: LaunchIn) -> tuple[str, ...]:
    """The jobs *body* launches; refused unless it starts shoal's supervisor for them."""
    if body.entrypoint != _SUPERVISOR or body.prepare not in (None, _PREPARE):
        raise InvalidArgumentError(
            f"the server starts only shoal's supervisor ({_SUPERVISOR}), not "
            f"{body.entrypoint!r} (prepare {body.prepare!r})", entrypoint=body.entrypoint)
    names = tuple(body.batch) or (body.job,)
    expected = (body.job, *body.batch) if body.batch else (body.job,)
    if tuple(body.args) != expected:
        raise InvalidArgumentError(f"the launch of {body.job} names jobs {body.args!r} that are "
                                   f"not its own {list(expected)!r}", job=body.job)
    return names


def _check_context(jobs: ServerJobs, body: LaunchIn, request: Request
                   ) -> tuple[tuple[str, ...], str]:
    """The jobs *body* launches and their owner; refused unless it is shoal's supervisor for
    recorded jobs that have not ended, launched by their owner (or an admin)."""
    names = _check_entrypoint(body)
    owners = set()
    for name in names:
        record = jobs.store.get_job(name)
        if record.is_terminal:
            raise InvalidArgumentError(f"job {name} has ended ({record.status}): there is no "
                                       "supervisor to start for it", job=name)
        require_owner(request, record.owner, "launch", f"job {name!r}")
        owners.add(record.owner)
    if len(owners) > 1:
        raise InvalidArgumentError(f"the launch of {body.job} hands over jobs of several users "
                                   f"({', '.join(sorted(owners))}): launch each user's jobs on "
                                   "their own", job=body.job)
    return names, owners.pop()


def _launch_out(info: LaunchInfo) -> LaunchOut:
    return LaunchOut(backend=info.backend, pid=info.pid, host=info.host,
                     start_ticks=info.start_ticks, extra=dict(info.extra),
                     warm=info.waiter is not None)


def _batch_files(batch: str, files: Mapping[str, str]) -> dict[str, bytes]:
    """*files* decoded; each must be one of batch *batch*'s files or the content-addressed
    pickle of a function (``jobs/_batchfiles.py``)."""
    out = {}
    for key, text in files.items():
        try:
            data = base64.b64decode(text, validate=True)
        except ValueError as e:
            raise InvalidArgumentError(f"file {key!r} of batch {batch} is not base64: {e}",
                                       key=key, job=batch) from e
        if not (is_batch_file(key, batch) or is_function_key(key, data)):
            raise InvalidArgumentError(
                f"POST /launches/batch stores only the batch's own files (_batches/.../"
                f"{batch}.*) and function pickles under their digest (_functions/<sha256>/"
                f"payload.pkl), not {key!r}: store other files with PUT /artifacts",
                key=key, job=batch)
        out[key] = data
    return out


def launch_routes(jobs: ServerJobs) -> APIRouter:  # noqa: C901 - one small closure per route
    api = APIRouter()
    backend = jobs.session.backend

    @api.get("/launches/backend", tags=["launches"])
    def backend_name() -> BackendOut:
        return BackendOut(name=backend.name)

    @api.post("/launches/check", tags=["launches"], status_code=204)
    def check_submission(body: CheckIn) -> None:
        backend.check_submission(jobs.job_env(body.env, ""))

    def start(body: LaunchIn, names: tuple[str, ...], user: str,
              take: HandedTake | None = None) -> LaunchInfo:
        batch = body.job if body.batch else None
        token = jobs.tokens.mint(user, names, batch)
        pool = None if body.pool is None else \
            hashlib.sha256(f"{body.pool}|user:{user}".encode()).hexdigest()  # no shared workers
        ctx = ExecContext(job=JobName(body.job), entrypoint=body.entrypoint,
                          args=tuple(body.args), env=jobs.job_env(body.env, token),
                          prepare=body.prepare, pool=pool,
                          keep_alive_seconds=body.keep_alive_seconds, cpus=body.cpus,
                          gpus=body.gpus, memory_mib=body.memory_mib, hosts=body.hosts,
                          batch=tuple(body.batch), take=take)
        info = backend.launch(ctx)
        waiter = info.waiter
        if isinstance(waiter, InlineTaking) and waiter.takes_inline:
            # The worker was handed the batch's take: record its handle for it (one write
            # here instead of its own request) and tell it what set_handles said.
            handle = waiter.worker_handle
            try:
                statuses = jobs.store.set_handles(names, handle)
            except ShoalError as e:
                waiter.give_statuses(None, handle, why=str(e))
                waiter.close()
                raise
            waiter.give_statuses(statuses, handle)
        if info.waiter is not None:
            jobs.hold(body.job, user, names, info.waiter, bool(body.batch),
                      JobToken(user, frozenset(names), batch) if take is not None else None)
        return info

    @api.post("/launches", tags=["launches"], status_code=201)
    def launch(body: LaunchIn, request: Request) -> LaunchOut:
        # The job token is its jobs' owner's (an admin may launch them): what it may reach
        # is checked against their records, whose owner it must be (JobGrants).
        names, user = _check_context(jobs, body, request)
        return _launch_out(start(body, names, user))

    @api.post("/launches/batch", tags=["launches"], status_code=201)
    async def create_and_launch(body: BatchLaunchIn, request: Request) -> BatchLaunchOut:
        """A batch's records, files and launch in one request (``BatchLauncher``): the
        records are the caller's, so the launch is its owner's; the files may only be the
        batch's own and its function's content-addressed pickle. With ``wait``, a warm
        worker's first news (the messages poll's answer) comes with it."""
        out = await run_in_threadpool(launch_batch, body, request)
        return await with_news(out, body, request)

    async def with_news(out: BatchLaunchOut, body: BatchLaunchIn, request: Request
                        ) -> BatchLaunchOut:
        if body.wait > 0 and out.launch is not None and out.launch.warm:
            out.messages = await poll(body.launch.job, request, 0, body.wait)
        return out

    def launch_batch(body: BatchLaunchIn, request: Request) -> BatchLaunchOut:
        names = _check_entrypoint(body.launch)
        batch = body.launch.job
        specs = [JobSpec.from_json(s) for s in body.specs]
        if not body.launch.batch or tuple(s.name for s in specs) != names:
            raise InvalidArgumentError(
                f"POST /launches/batch records and launches one batch: the specs "
                f"({[s.name for s in specs]!r}) must be the jobs its launch names "
                f"({list(body.launch.batch)!r})", job=batch)
        if len(body.key_salts) != len(specs):
            raise InvalidArgumentError(f"create_jobs needs one key salt per spec: "
                                       f"{len(specs)} specs, {len(body.key_salts)} salts")
        files = _batch_files(batch, body.files)
        user = caller(request)
        records = jobs.store.create_jobs(specs, key_salts=body.key_salts, backend=backend.name,
                                         owner=user)
        try:
            store = jobs.session.jobs.artifacts
            for key, data in files.items():
                if not (is_function_key(key, data) and store.exists(key)):
                    store.put_bytes(key, data)
        except ShoalError as e:
            why = f"could not store the payloads of batch {batch}: {e}"
            return _failed_at_launch(records, why)
        calls = files.get(calls_key(batch))
        take = HandedTake(records[0], calls) \
            if calls is not None and len(calls) <= _HANDED_CALLS_MAX else None
        try:
            info = start(body.launch, names, user, take)
        except ShoalError as e:
            return _failed_at_launch(records, f"could not start the supervisor: {e}")
        if info.waiter is None:  # a new supervisor: it records its handle itself too
            jobs.store.set_handles(names, info.to_json())
        return BatchLaunchOut(records=[JobOut.of(r) for r in records],
                              launch=_launch_out(info))

    # server/_fastwrites.py runs the blocking part on its own threads, then the rest.
    setattr(create_and_launch, "fast_parts", (launch_batch, with_news))  # noqa: B010

    def _failed_at_launch(records: Sequence[JobRecord], why: str) -> BatchLaunchOut:
        names = [r.name for r in records]
        jobs.store.update_jobs([JobChange(n, JobStatus.FAILED, failure_kind=FailureKind.INTERNAL,
                                          reason=why) for n in names])
        jobs.signals.fire(names)
        return BatchLaunchOut(records=[JobOut.of(r) for r in records], error=why)

    @api.post("/launches/alive", tags=["launches"])
    def is_alive(body: HandleIn) -> AliveOut:
        return AliveOut(alive=backend.is_alive(body.handle))

    @api.post("/launches/stop", tags=["launches"], status_code=204)
    def signal_stop(body: HandleIn, request: Request) -> None:
        # Only the supervisor of a job that has not ended: a handle is the client's word.
        found = [r for r in jobs.store.iter_unfinished() if r.handle == body.handle]
        if not found:
            raise NotFoundError(f"no unfinished job has the supervisor {body.handle!r}: "
                                "nothing to stop", handle=str(body.handle))
        for record in found:  # a warm worker's handle is on each job it took
            require_owner(request, record.owner, "stop", f"job {record.name!r}")
        backend.signal_stop(body.handle)

    @api.get("/launches/{launch}/messages", tags=["launches"])
    async def messages(launch: str, request: Request,
                       after: Annotated[int, Query(ge=0)] = 0,
                       timeout: Annotated[float, Query(ge=0)] = 30.0) -> MessagesOut:
        return await poll(launch, request, after, timeout)

    async def poll(launch: str, request: Request, after: int, timeout: float) -> MessagesOut:
        claim = jobs.claim(launch)
        if claim is None:  # the server restarted since, or no warm worker took it
            return MessagesOut(messages=[], done=True, lost=True)
        # its jobs' owner's (or an admin's, who may have launched them)
        require_owner(request, claim.user, "read the messages of", f"launch {launch!r}")
        deadline = time.monotonic() + min(timeout, _MAX_POLL_S)
        def ready() -> bool:
            return len(claim.messages) > after or claim.done

        while not ready():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            await jobs.signals.wait(claim.key, left, ready)
        if not claim.done and claim.all_reported:
            # Its last jobs' news: the worker's "done" follows at once, and the client would
            # ask again for it (before it may hand the worker its next call): answer both.
            await jobs.signals.wait(claim.key, _DONE_AFTER_LAST_S, lambda: claim.done)
        return MessagesOut(messages=[MessageOut(header=h, data=base64.b64encode(d).decode())
                                     for h, d in claim.messages[after:]],
                           done=claim.done and len(claim.messages) >= after, lost=claim.lost)

    @api.post("/keys/job-secret", tags=["keys"])
    def job_secret(body: SecretIn, request: Request) -> SecretOut:
        # From the secret of the job's owner: only the owner (or an admin) gets it. A job not
        # recorded yet (a client signs its payloads before it creates the record) gets the
        # caller's, which it will own.
        from shoal.jobs.keys import load_user_secret
        from shoal.serialization.keys import job_secret as derive

        user = _principal(request).user
        record = jobs.store.find_job(body.job)
        if record is not None:
            require_owner(request, record.owner, "get the key of", f"job {body.job!r}")
            user = record.owner
        secret = load_user_secret(jobs.user_secret_path(user))
        return SecretOut(secret=derive(secret, body.job, body.salt))

    @api.post("/keys/lease", tags=["keys"])
    def key_lease(request: Request) -> LeaseOut:
        """A new key lease of the caller's (``serialization/keys.py``): the client derives
        the secrets of the jobs it salts under it, as ``job-secret`` would give them, without
        a request per job. A job's token gets none (the job routes only)."""
        from shoal.jobs.keys import load_user_secret
        from shoal.serialization.keys import lease_secret, new_lease

        lease = new_lease()
        secret = load_user_secret(jobs.user_secret_path(_principal(request).user))
        return LeaseOut(lease=lease, secret=lease_secret(secret, lease).hex())

    @api.post("/keys/job-secrets", tags=["keys"])
    def job_secrets(body: SecretsIn, request: Request) -> SecretsOut:
        """``job-secret`` for a batch's jobs at once (a map's 64 calls: one request), by the
        same rules: a recorded job's key from its owner's secret, for its owner or an admin."""
        from shoal.core.ports import JobQuery
        from shoal.jobs.keys import load_user_secret
        from shoal.serialization.keys import job_secret as derive

        caller = _principal(request).user
        names = [j.job for j in body.jobs]
        owners = {str(r.name): r.owner for r in jobs.store.list_jobs(
            JobQuery(names=names, limit=len(names)))} if names else {}
        for name, owner in owners.items():
            require_owner(request, owner, "get the key of", f"job {name!r}")
        secrets: dict[str, bytes] = {}

        def secret_of(user: str) -> bytes:
            if user not in secrets:
                secrets[user] = load_user_secret(jobs.user_secret_path(user))
            return secrets[user]

        return SecretsOut(secrets=[derive(secret_of(owners.get(j.job, caller)), j.job, j.salt)
                                   for j in body.jobs])

    return api
