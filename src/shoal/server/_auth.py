"""Bearer tokens on every route but ``/version``: 401 without a usable token, 403 when its
scope does not allow the action (reads need ``read``, writes ``write``).

A job token (``server/_jobtokens.py``, what a job's supervisor sends) is a write token of the
job's owner limited to its own jobs: the job named in the path (``{name}``/``{job}``), the
artifact key or prefix (``key``/``prefix``), the metrics owner (``owner=job:<name>``) must be
its own, and routes that name jobs in their body call ``require_jobs``; the run its job is
linked to on the server's record (``JobGrants``: the run's own routes, ``owner=run:...``, its
``experiments/<exp>/<run>/`` files) too; any other route is refused (403 naming the token's
job and what it tried to reach), and so is every write once the token's jobs have ended.

An endpoint's replica token (``shoale_``, what the Ray Serve replicas of an endpoint the
server started send) reaches the artifact routes only, for its endpoint's keys
(``EndpointToken.may_touch_key``), and writes only while its endpoint exists and is its
user's."""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import NoReturn

from fastapi import Request

from shoal.core.auth import ApiToken, Scope, hash_token
from shoal.core.ports import AuthStore, EndpointStore
from shoal.errors import AuthenticationError, PermissionDeniedError
from shoal.server._jobtokens import (
    ENDPOINT_TOKEN_PREFIX,
    JOB_TOKEN_PREFIX,
    RUN_FILES,
    EndpointToken,
    JobGrants,
    JobToken,
    JobTokens,
)

__all__ = ["LOCAL_PRINCIPAL", "Authorizer", "job_token_of", "require_jobs"]

_API = "/api/v1"
#: Where a job token may go at all (each then checked against its jobs).
_JOB_ROUTES = ("/jobs", "/job-transitions", "/job-handles", "/artifacts", "/artifact-store",
               "/metrics", "/whoami", "/experiments/")
#: Routes that name nothing a job token could overreach with.
_HARMLESS = frozenset({"/whoami", "/artifact-store"})
#: Where an endpoint's replica token may go (with a key or prefix of its endpoint's).
_REPLICA_ROUTES = frozenset({"/artifacts", "/artifacts/exists", "/artifacts/keys"})

_READS = frozenset({"GET", "HEAD", "OPTIONS"})
#: How long a user token's record, once read, is trusted without reading it again: a token
#: revoked with ``shoal tokens revoke`` (straight on the store) is refused that much later at
#: most. Its lookup was ~40 % of the server's CPU per job-status read (docs/performance.md).
TOKEN_CACHE_SECONDS = 1.0
_TOKEN_CACHE_MAX = 4096
#: The principal of a server started with ``--no-auth`` (loopback only).
LOCAL_PRINCIPAL = ApiToken("local", "local", "no-auth", Scope.ADMIN,
                           datetime.fromtimestamp(0, UTC))


class Authorizer:
    """The FastAPI dependency that authenticates and authorizes one request."""

    def __init__(self, store: AuthStore | None, job_tokens: JobTokens | None = None,
                 grants: JobGrants | None = None,
                 endpoints: EndpointStore | None = None) -> None:
        self._store = store  # None: --no-auth
        self._job_tokens = job_tokens
        self._grants = grants
        self._endpoints = endpoints
        #: token hash -> (its record, when it was read): known tokens only
        self._known: dict[str, tuple[ApiToken, float]] = {}

    async def __call__(self, request: Request) -> ApiToken:
        # On the event loop, not in FastAPI's thread pool: a job token is an HMAC, a user's
        # token one indexed query (~30 us on SQLite), both far less than the thread hop it
        # saves on every request (bench/server.py framework: 1.17 ms sync vs 0.79 ms async).
        job = self._job_token(request)
        replica = None if job is not None else self._replica_token(request)
        if job is not None:
            token = ApiToken(f"job:{job.shown}", job.user, job.shown, Scope.WRITE,
                             datetime.fromtimestamp(0, UTC))
            request.state.job_token = job
            _check_job_route(job, request, self._grants)
        elif replica is not None:
            token = ApiToken(f"replica:{replica.shown}", replica.user, replica.shown,
                             Scope.WRITE, datetime.fromtimestamp(0, UTC))
            request.state.job_token = None
            _check_replica_route(replica, request, self._endpoints)
        else:
            token = LOCAL_PRINCIPAL if self._store is None else self._authenticate(request)
            request.state.job_token = None
        needed = Scope.READ if request.method in _READS else Scope.WRITE
        if not token.scope.allows(needed):
            route = request.scope.get("route")
            action = getattr(route, "name", None) or f"{request.method} {request.url.path}"
            raise PermissionDeniedError(
                f"token {token.name!r} of user {token.user!r} has scope {token.scope.value}; "
                f"{action} ({request.method} {request.url.path}) needs a {needed.value} token",
                action=action, scope=token.scope.value, needs=needed.value, user=token.user)
        request.state.principal = token
        request.state.users = self._store  # for the owner checks (server/_owners.py)
        return token

    def _job_token(self, request: Request) -> JobToken | None:
        """The job token the request carries (verified), or None for any other."""
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        value = value.strip()
        if scheme.lower() != "bearer" or not value.startswith(JOB_TOKEN_PREFIX) or \
                self._job_tokens is None:
            return None
        return self._job_tokens.verify(value)

    def _replica_token(self, request: Request) -> EndpointToken | None:
        """The endpoint replica token the request carries (verified), or None."""
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        value = value.strip()
        if scheme.lower() != "bearer" or not value.startswith(ENDPOINT_TOKEN_PREFIX) or \
                self._job_tokens is None:
            return None
        return self._job_tokens.verify_endpoint(value)

    def _authenticate(self, request: Request) -> ApiToken:
        assert self._store is not None
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise AuthenticationError(
                "this shoal server needs an API token: send 'Authorization: Bearer TOKEN' "
                "(set SHOAL_TOKEN; an admin makes one with 'shoal tokens create')")
        # Looked up by its SHA-256 (a unique index): what timing can reveal is about the
        # hash, never the secret, so no byte-by-byte comparison of the token happens.
        digest = hash_token(value.strip())
        found = self._token_by_hash(digest)
        if found is None:
            raise AuthenticationError("the API token is not known to this server (mistyped, or "
                                      "made for another server)")
        if found.revoked_at is not None:
            raise AuthenticationError(f"the API token {found.name!r} of user {found.user!r} "
                                      "was revoked", token=found.name, user=found.user)
        if not found.usable_at(datetime.now(UTC)):
            raise AuthenticationError(
                f"the API token {found.name!r} of user {found.user!r} expired at "
                f"{found.expires_at:%Y-%m-%d %H:%M:%S} UTC", token=found.name, user=found.user)
        return found

    def _token_by_hash(self, digest: str) -> ApiToken | None:
        """The token's record, read again once it is ``TOKEN_CACHE_SECONDS`` old."""
        assert self._store is not None
        now = time.monotonic()
        known = self._known.get(digest)
        if known is not None and now - known[1] < TOKEN_CACHE_SECONDS:
            return known[0]
        found = self._store.token_by_hash(digest)
        if found is None:
            self._known.pop(digest, None)
            return None
        if len(self._known) >= _TOKEN_CACHE_MAX:
            self._known.clear()
        self._known[digest] = (found, now)
        return found


def job_token_of(request: Request) -> JobToken | None:
    """The job token of an authorized request, or None (a user's token)."""
    token: JobToken | None = getattr(request.state, "job_token", None)
    return token


def require_jobs(request: Request, names: Iterable[str], action: str) -> None:
    """For a route that names jobs in its body: a job token may name only its own."""
    job = job_token_of(request)
    if job is None:
        return
    for name in names:
        if name not in job.jobs:
            _refuse(job, f"{action} job {name}'s record")


def _refuse(job: JobToken, what: str, why: str | None = None) -> NoReturn:
    raise PermissionDeniedError(
        f"the job token of {job.shown} (user {job.user!r}) may not {what}: " + (why or
        "a job's token reaches only its own job's record, payloads, log, artifacts, metrics, "
        "checkpoints and the run it was submitted for"), action=what, user=job.user,
        job=min(job.jobs))


def _check_job_route(job: JobToken, request: Request,  # noqa: C901 - one rule per parameter
                     grants: JobGrants | None) -> None:
    """Refuse what *job*'s token may not reach on this route (see module)."""
    path = request.url.path.removeprefix(_API)
    write = request.method not in _READS
    verb = "change" if write else "read"
    if not path.startswith(_JOB_ROUTES) or path == "/jobs" and request.method != "GET":
        _refuse(job, f"call {request.method} {path}")
    params = {**request.query_params, **request.path_params}
    route = getattr(request.scope.get("route"), "name", None)
    checked = False
    if path == "/jobs":  # list_jobs: only by the names of its own jobs
        names = request.query_params.getlist("name")
        if not names:
            _refuse(job, "list jobs other than its own (name= its own jobs)")
        for listed in names:
            if listed not in job.jobs:
                _refuse(job, f"read job {listed}'s record")
        checked = True
    if path.startswith("/experiments/"):  # only its own run's routes, not its experiment's
        experiment, run = params.get("experiment"), params.get("run")
        if route not in RUN_ROUTES or experiment is None or run is None:
            _refuse(job, f"call {request.method} {path}")
        if grants is None or (experiment, run) not in grants.runs(job):
            _refuse_run(job, grants, f"{verb} run {run!r} of experiment {experiment!r}")
        checked = True
    for param in ("name", "job"):
        if param in request.path_params:
            checked = True
            if request.path_params[param] not in job.jobs:
                _refuse(job, f"{verb} job {request.path_params[param]}'s record")
    for param in ("key", "prefix"):
        if param in params:
            checked = True
            key = str(params[param])
            if job.may_touch_key(key, write=write) or \
                    grants is not None and grants.run_of_key(job, key):
                continue
            if key.lstrip("/").startswith(f"{RUN_FILES}/"):
                _refuse_run(job, grants, f"{verb} the artifact key {key!r} (another run's)")
            _refuse(job, f"{verb} the artifact key {key!r} (another job's)")
    if "owner" in params:
        checked = True
        owner = str(params["owner"])
        kind, _, rest = owner.partition(":")
        experiment, _, run = rest.partition("/")
        if kind == "run":
            if grants is None or (experiment, run) not in grants.runs(job):
                _refuse_run(job, grants, f"{verb} the metrics of {owner!r}")
        elif not (kind == "job" and rest in job.jobs):
            _refuse(job, f"{verb} the metrics of {owner!r}")
    if not checked and route not in BODY_CHECKED and path not in _HARMLESS:
        _refuse(job, f"call {request.method} {path}")
    if write and grants is not None:
        ended = grants.why_ended(job, _named_job(job, request, params))
        if ended is not None:
            _refuse(job, f"{verb} anything ({request.method} {path})",
                    f"{ended}, and a job's token writes nothing once its job has ended")


def _named_job(job: JobToken, request: Request, params: dict[str, str]) -> str | None:
    """The one job of *job*'s a request is about (its path, key or metrics owner), if any."""
    for param in ("name", "job"):
        if param in request.path_params:
            return str(request.path_params[param])
    named = str(params.get("key") or params.get("prefix") or "").lstrip("/").split("/", 1)[0]
    owner = str(params.get("owner", ""))
    if owner.startswith("job:"):
        named = owner[4:]
    return named if named in job.jobs else None


def _refuse_run(job: JobToken, grants: JobGrants | None, what: str) -> NoReturn:
    runs = sorted(grants.runs(job)) if grants is not None else []
    linked = ", ".join(f"{e}/{r}" for e, r in runs)
    _refuse(job, what, f"it reaches only the run its job was submitted for ({linked})"
            if runs else "its job was submitted for no run (no 'with Run(...)' open and no "
            "experiment_config)")


def _check_replica_route(replica: EndpointToken, request: Request,
                         endpoints: EndpointStore | None) -> None:
    """Refuse what an endpoint's replica token may not reach (see module)."""
    path = request.url.path.removeprefix(_API)
    write = request.method not in _READS
    if path in _HARMLESS and not write:
        return
    key = request.query_params.get("key") or request.query_params.get("prefix")
    what = f"{'change' if write else 'read'} the artifact key {key!r}" if key else \
        f"call {request.method} {path}"
    if path not in _REPLICA_ROUTES or key is None or request.method == "DELETE" or \
            not replica.may_touch_key(key, write=write):
        _refuse_replica(replica, what)
    if write:
        record = None if endpoints is None else endpoints.find_endpoint(replica.endpoint)
        if record is None or record.owner != replica.user:
            why = f"endpoint {replica.endpoint!r} is gone" if record is None else \
                f"endpoint {replica.endpoint!r} belongs to {record.owner!r}, not to the " \
                f"token's user {replica.user!r}"
            _refuse_replica(replica, what, f"{why}, and a replica token writes only while its "
                            "endpoint is its user's")


def _refuse_replica(replica: EndpointToken, what: str, why: str | None = None) -> NoReturn:
    raise PermissionDeniedError(
        f"the replica token of {replica.shown} (user {replica.user!r}) may not {what}: " +
        (why or "an endpoint's replicas reach only its model, code and requirements (read) "
         "and their logs (endpoints/<name>/logs/)"), action=what, user=replica.user,
        endpoint=replica.endpoint)


#: Routes that name their jobs in the body and check them with ``require_jobs``.
BODY_CHECKED = frozenset({"update_jobs", "set_handles", "take_batch"})
#: The routes of one run a job token may call for the run its job is linked to.
RUN_ROUTES = frozenset({"get_run", "end_run", "resume_run", "set_run_parameters",
                        "set_run_tags", "add_run_artifact"})
