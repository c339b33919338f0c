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
import hashlib
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Query, Request

from shoal.core.auth import ApiToken
from shoal.core.jobs import JobName
from shoal.core.ports import ExecContext, JobStore, JobWaiter
from shoal.core.secrets import JOB_SECRETS_VAR, is_secret_name
from shoal.errors import InvalidArgumentError, NotFoundError, PermissionDeniedError
from shoal.server._jobtokens import JobTokens
from shoal.server._signals import Signals
from shoal.server._wire_launches import (
    AliveOut,
    BackendOut,
    CheckIn,
    HandleIn,
    LaunchIn,
    LaunchOut,
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
_MAX_POLL_S = 60.0
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
        self._user_secrets = state / "user-secrets"
        self._claims: dict[str, _Claim] = {}
        self._lock = threading.Lock()

    @property
    def store(self) -> JobStore:
        return self.session.jobs.metadata

    def user_secret_path(self, user: str) -> Path:
        return self._user_secrets / hashlib.sha256(user.encode()).hexdigest()[:32]

    def job_env(self, client: Mapping[str, str], token: str) -> dict[str, str]:
        """A supervisor's environment on this host (see module)."""
        env = {k: v for k, v in self.session.supervisor_env().items()
               if k not in _STORE_VARS and not k.startswith("AWS_") and not is_secret_name(k)}
        env.update({k: client[k] for k in _FROM_CLIENT if k in client})
        env.update(SHOAL_HOME=str(self.session.home), SHOAL_SERVER_URL=self.url,
                   SHOAL_TOKEN=token)
        return env

    def hold(self, launch: str, user: str, names: Sequence[str], waiter: JobWaiter,
             batch: bool) -> None:
        claim = _Claim(user, tuple(names), waiter, batch, self.signals, f"launch:{launch}")
        now = time.monotonic()
        with self._lock:
            for key in [k for k, c in self._claims.items() if c.ended_at
                        and now - c.ended_at > _KEEP_DONE_S]:
                del self._claims[key]
            self._claims[launch] = claim
        threading.Thread(target=claim.drain, name=f"shoal-claim-{launch}", daemon=True).start()

    def claim(self, launch: str) -> _Claim | None:
        with self._lock:
            return self._claims.get(launch)


class _Claim:
    """A warm worker's claim the server holds for a client: read on its own thread."""

    def __init__(self, user: str, names: tuple[str, ...], waiter: JobWaiter, batch: bool,
                 signals: Signals, key: str) -> None:
        self.user, self.names, self._waiter, self._batch = user, names, waiter, batch
        self._signals, self.key = signals, key
        self.messages: list[tuple[dict[str, Any], bytes]] = []
        self.done = self.lost = False
        self.ended_at = 0.0

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


def _check_context(jobs: ServerJobs, body: LaunchIn) -> tuple[str, ...]:
    """The jobs *body* launches; refused unless it is shoal's supervisor for recorded jobs
    that have not ended."""
    if body.entrypoint != _SUPERVISOR or body.prepare not in (None, _PREPARE):
        raise InvalidArgumentError(
            f"the server starts only shoal's supervisor ({_SUPERVISOR}), not "
            f"{body.entrypoint!r} (prepare {body.prepare!r})", entrypoint=body.entrypoint)
    names = tuple(body.batch) or (body.job,)
    expected = (body.job, *body.batch) if body.batch else (body.job,)
    if tuple(body.args) != expected:
        raise InvalidArgumentError(f"the launch of {body.job} names jobs {body.args!r} that are "
                                   f"not its own {list(expected)!r}", job=body.job)
    for name in names:
        record = jobs.store.get_job(name)
        if record.is_terminal:
            raise InvalidArgumentError(f"job {name} has ended ({record.status}): there is no "
                                       "supervisor to start for it", job=name)
    return names


def launch_routes(jobs: ServerJobs) -> APIRouter:  # noqa: C901 - one small closure per route
    api = APIRouter()
    backend = jobs.session.backend

    @api.get("/launches/backend", tags=["launches"])
    def backend_name() -> BackendOut:
        return BackendOut(name=backend.name)

    @api.post("/launches/check", tags=["launches"], status_code=204)
    def check_submission(body: CheckIn) -> None:
        backend.check_submission(jobs.job_env(body.env, ""))

    @api.post("/launches", tags=["launches"], status_code=201)
    def launch(body: LaunchIn, request: Request) -> LaunchOut:
        user = _principal(request).user
        names = _check_context(jobs, body)
        token = jobs.tokens.mint(user, names, body.job if body.batch else None)
        pool = None if body.pool is None else \
            hashlib.sha256(f"{body.pool}|user:{user}".encode()).hexdigest()  # no shared workers
        ctx = ExecContext(job=JobName(body.job), entrypoint=body.entrypoint,
                          args=tuple(body.args), env=jobs.job_env(body.env, token),
                          prepare=body.prepare, pool=pool,
                          keep_alive_seconds=body.keep_alive_seconds, cpus=body.cpus,
                          gpus=body.gpus, memory_mib=body.memory_mib, hosts=body.hosts,
                          batch=tuple(body.batch))
        info = backend.launch(ctx)
        if info.waiter is not None:
            jobs.hold(body.job, user, names, info.waiter, bool(body.batch))
        return LaunchOut(backend=info.backend, pid=info.pid, host=info.host,
                         start_ticks=info.start_ticks, extra=dict(info.extra),
                         warm=info.waiter is not None)

    @api.post("/launches/alive", tags=["launches"])
    def is_alive(body: HandleIn) -> AliveOut:
        return AliveOut(alive=backend.is_alive(body.handle))

    @api.post("/launches/stop", tags=["launches"], status_code=204)
    def signal_stop(body: HandleIn) -> None:
        # Only the supervisor of a job that has not ended: a handle is the client's word.
        if not any(r.handle == body.handle for r in jobs.store.iter_unfinished()):
            raise NotFoundError(f"no unfinished job has the supervisor {body.handle!r}: "
                                "nothing to stop", handle=str(body.handle))
        backend.signal_stop(body.handle)

    @api.get("/launches/{launch}/messages", tags=["launches"])
    async def messages(launch: str, request: Request,
                       after: Annotated[int, Query(ge=0)] = 0,
                       timeout: Annotated[float, Query(ge=0)] = 30.0) -> MessagesOut:
        claim = jobs.claim(launch)
        if claim is None:  # the server restarted since, or no warm worker took it
            return MessagesOut(messages=[], done=True, lost=True)
        user = _principal(request).user
        if claim.user != user:
            raise PermissionDeniedError(f"launch {launch} is user {claim.user!r}'s, not "
                                        f"{user!r}'s", action="read_launch", user=user)
        deadline = time.monotonic() + min(timeout, _MAX_POLL_S)
        while len(claim.messages) <= after and not claim.done:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            await jobs.signals.wait(claim.key, left)
        return MessagesOut(messages=[MessageOut(header=h, data=base64.b64encode(d).decode())
                                     for h, d in claim.messages[after:]],
                           done=claim.done and len(claim.messages) >= after, lost=claim.lost)

    @api.post("/keys/job-secret", tags=["keys"])
    def job_secret(body: SecretIn, request: Request) -> SecretOut:
        # The caller's own user secret: another user's job gets a key its payloads were not
        # signed with. (Owner checks come with owners on records.)
        from shoal.jobs.keys import load_user_secret
        from shoal.serialization.keys import job_secret as derive

        secret = load_user_secret(jobs.user_secret_path(_principal(request).user))
        return SecretOut(secret=derive(secret, body.job, body.salt))

    @api.post("/keys/job-secrets", tags=["keys"])
    def job_secrets(body: SecretsIn, request: Request) -> SecretsOut:
        """``job-secret`` for a batch's jobs at once (a map's 64 calls: one request)."""
        from shoal.jobs.keys import load_user_secret
        from shoal.serialization.keys import job_secret as derive

        secret = load_user_secret(jobs.user_secret_path(_principal(request).user))
        return SecretsOut(secrets=[derive(secret, j.job, j.salt) for j in body.jobs])

    return api
