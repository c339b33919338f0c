"""The team server's ASGI app (FastAPI): ``/api/v1`` over a metadata store, its errors as
``{"error": {code, message, details}}`` with the error class's HTTP status."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse

from shoal.core.api import API_PREFIX, API_VERSION
from shoal.core.auth import ApiToken
from shoal.core.ports import ArtifactStore, AuthStore, EndpointStore, JobStore, RunStore
from shoal.errors import ArtifactStoreError, ShoalError, StorageError
from shoal.server._artifacts import DEFAULT_MAX_UPLOAD_BYTES, artifact_routes
from shoal.server._auth import Authorizer
from shoal.server._endpoints import endpoint_files_guard, endpoint_routes
from shoal.server._jobs import job_routes
from shoal.server._runs import run_routes
from shoal.server._wire import VersionOut, WhoAmIOut

if TYPE_CHECKING:
    from starlette.types import ASGIApp

    from shoal.server._endpoint_runtime import ServerEndpoints
    from shoal.server._launches import ServerJobs

__all__ = ["CONSOLE_PREFIX", "create_app", "shoal_version"]

#: Where the web console is mounted.
CONSOLE_PREFIX = "/console"

logger = logging.getLogger(__name__)


def shoal_version() -> str:
    import sys
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("shoal")
    except PackageNotFoundError:  # a source tree that is not installed: the package's own
        return str(getattr(sys.modules["shoal"], "__version__", "unknown"))


def create_app(runs: RunStore, auth: AuthStore | None, *, jobs: JobStore | None = None,
               endpoints: EndpointStore | None = None, artifacts: ArtifactStore | None = None,
               upload_dir: Path | None = None,
               max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES,
               server_jobs: ServerJobs | None = None,
               server_endpoints: ServerEndpoints | None = None,
               users: AuthStore | None = None,
               console: ASGIApp | None = None,
               max_invocation_bytes: int | None = None) -> ASGIApp:
    """The app over *runs* (and *jobs*, *endpoints*, *artifacts* when given: their routes
    are served only then); *auth* None serves without tokens (``--no-auth``, loopback). Uploads to
    *artifacts* spool in *upload_dir* (the system's temporary directory when None), up to
    *max_upload_bytes* each. *server_jobs*: jobs on the server's backend (launches, keys,
    waits, live logs, job tokens); *server_endpoints*: endpoints on the server's host (their
    runtime's routes, and ``POST /endpoints/{name}/invocations`` to the model servers of
    those it started, bodies up to *max_invocation_bytes*: 6 MiB when None); *users*: the
    admin routes over users and tokens; *console*: the web console (``shoal.console``), served
    at ``/console`` (and ``/`` leads there). With *jobs*, job-status reads are answered in
    front of FastAPI (``server/_fastreads.py``), and with *server_jobs* the warm path's
    writes too (``server/_fastwrites.py``)."""
    app = FastAPI(title="shoal server", version=shoal_version(),
                  openapi_url=f"{API_PREFIX}/openapi.json", docs_url=f"{API_PREFIX}/docs",
                  redoc_url=None)
    info = VersionOut(api_version=API_VERSION, shoal_version=shoal_version(),
                      auth=auth is not None)

    @app.get(f"{API_PREFIX}/version", tags=["server"])
    def get_version() -> VersionOut:
        return info

    authorizer = Authorizer(auth, None if server_jobs is None else server_jobs.tokens,
                            None if server_jobs is None else server_jobs.grants,
                            endpoints=endpoints)
    authorized = APIRouter(dependencies=[Depends(authorizer)])

    @authorized.get("/whoami", tags=["server"])
    def whoami(request: Request) -> WhoAmIOut:
        token: ApiToken = request.state.principal
        return WhoAmIOut(user=token.user, token=token.name, scope=token.scope.value)

    authorized.include_router(run_routes(runs))
    fast: list[APIRouter] = []  # what holds the warm path's writes (server/_fastwrites.py)
    if jobs is not None:
        fast.append(job_routes(jobs, artifacts))
        authorized.include_router(fast[-1])
    if endpoints is not None:
        authorized.include_router(endpoint_routes(endpoints, instance_guard=(
            None if server_endpoints is None else server_endpoints.check_instance)))
    if artifacts is not None:
        guard = None if endpoints is None else endpoint_files_guard(endpoints)
        authorized.include_router(artifact_routes(artifacts, upload_dir=upload_dir,
                                                  max_upload_bytes=max_upload_bytes,
                                                  guard=guard))
    if users is not None:
        from shoal.server._users import user_routes

        authorized.include_router(user_routes(users))
    if server_jobs is not None:
        from shoal.server._jobwait import wait_routes
        from shoal.server._launches import launch_routes
        from shoal.server._maintenance import maintenance_routes

        fast.append(launch_routes(server_jobs))
        authorized.include_router(fast[-1])
        authorized.include_router(wait_routes(server_jobs))
        authorized.include_router(maintenance_routes(server_jobs.session))
    if server_endpoints is not None:
        from shoal.server._endpoint_runtime import runtime_routes
        from shoal.server._invocations import (
            DEFAULT_MAX_INVOCATION_BYTES,
            Invoker,
            invocation_routes,
        )

        authorized.include_router(runtime_routes(server_endpoints))
        authorized.include_router(invocation_routes(Invoker(
            server_endpoints.store, started_here=server_endpoints.sealed,
            max_bytes=max_invocation_bytes or DEFAULT_MAX_INVOCATION_BYTES)))
    app.include_router(authorized, prefix=API_PREFIX)
    if console is not None:
        app.mount(CONSOLE_PREFIX, console)

        @app.get("/", include_in_schema=False)
        def home() -> RedirectResponse:
            return RedirectResponse(f"{CONSOLE_PREFIX}/", status_code=303)
    app.add_exception_handler(ShoalError, _shoal_error)
    app.add_exception_handler(RequestValidationError, _invalid_request)
    if jobs is None:
        return app
    from shoal.server._fastreads import FastJobReads
    from shoal.server._fastwrites import FastWrites

    front: ASGIApp = app
    if server_jobs is not None:
        front = FastWrites(app, fast, authorizer, _error_answer)
    return FastJobReads(front, jobs, authorizer, _error_answer)


def _body(code: str, message: str, details: dict[str, Any]) -> dict[str, Any]:
    return {"error": {"code": code, "message": message,
                      "details": {k: _detail(v) for k, v in details.items()}}}


def _detail(value: Any) -> Any:
    """A detail as JSON: scalars and lists of them as they are (``jobs=[...]``), else text."""
    scalar = (str, int, float, bool, type(None))
    if isinstance(value, scalar):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, scalar) for v in value):
        return list(value)
    return str(value)


def _error_answer(method: str, path: str, exc: ShoalError) -> JSONResponse:
    """The answer to a request that raised *exc* (also the fast job reads' answer)."""
    if isinstance(exc, StorageError) and exc.details.get("transient"):
        return _store_away(method, path, exc)
    if exc.http_status >= 500:
        logger.error("%s %s: %s", method, path, exc)
    return JSONResponse(_body(exc.code, exc.message, exc.details), status_code=exc.http_status)


async def _shoal_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ShoalError)
    return _error_answer(request.method, request.url.path, exc)


def _store_away(method: str, path: str, exc: StorageError) -> JSONResponse:
    """A store of the server's that does not answer (a database restart): 503 naming it and
    its reason, still ``transient`` so clients wait it out (``storage/outage.py``); the
    server itself stays up and answers again once the store is back."""
    what = "artifact" if isinstance(exc, ArtifactStoreError) else "metadata"
    url = exc.details.get("url")  # redacted by the store: a password shows as ***
    hidden = " (password hidden)" if "***" in str(url) else ""
    store = f"the {what} store at {url}{hidden}" if url else f"the {what} store"
    message = (f"{store} of this shoal server does not answer: {exc.message}. The server "
               "is up and answers again once the store is back; clients wait for it up to "
               "SHOAL_STORE_OUTAGE_SECONDS")
    logger.warning("%s %s: %s", method, path, message)
    return JSONResponse(_body(exc.code, message, exc.details), status_code=503,
                        headers={"Retry-After": "1"})


async def _invalid_request(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                         for e in exc.errors()[:5])
    return JSONResponse(_body("INVALID_ARGUMENT", f"invalid request to {request.method} "
                              f"{request.url.path}: {problems}", {}), status_code=400)
