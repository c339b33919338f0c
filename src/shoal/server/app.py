"""The team server's ASGI app (FastAPI): ``/api/v1`` over a metadata store, its errors as
``{"error": {code, message, details}}`` with the error class's HTTP status."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from shoal.core.api import API_PREFIX, API_VERSION
from shoal.core.auth import ApiToken
from shoal.core.ports import ArtifactStore, AuthStore, EndpointStore, JobStore, RunStore
from shoal.errors import ShoalError
from shoal.server._artifacts import DEFAULT_MAX_UPLOAD_BYTES, artifact_routes
from shoal.server._auth import Authorizer
from shoal.server._endpoints import endpoint_files_guard, endpoint_routes
from shoal.server._jobs import job_routes
from shoal.server._runs import run_routes
from shoal.server._wire import VersionOut, WhoAmIOut

if TYPE_CHECKING:
    from shoal.server._endpoint_runtime import ServerEndpoints
    from shoal.server._launches import ServerJobs

__all__ = ["create_app", "shoal_version"]

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
               max_invocation_bytes: int | None = None) -> FastAPI:
    """The app over *runs* (and *jobs*, *endpoints*, *artifacts* when given: their routes
    are served only then); *auth* None serves without tokens (``--no-auth``, loopback). Uploads to
    *artifacts* spool in *upload_dir* (the system's temporary directory when None), up to
    *max_upload_bytes* each. *server_jobs*: jobs on the server's backend (launches, keys,
    waits, live logs, job tokens); *server_endpoints*: endpoints on the server's host (their
    runtime's routes, and ``POST /endpoints/{name}/invocations`` to the model servers of
    those it started, bodies up to *max_invocation_bytes*: 6 MiB when None)."""
    app = FastAPI(title="shoal server", version=shoal_version(),
                  openapi_url=f"{API_PREFIX}/openapi.json", docs_url=f"{API_PREFIX}/docs",
                  redoc_url=None)
    info = VersionOut(api_version=API_VERSION, shoal_version=shoal_version(),
                      auth=auth is not None)

    @app.get(f"{API_PREFIX}/version", tags=["server"])
    def get_version() -> VersionOut:
        return info

    authorized = APIRouter(dependencies=[Depends(Authorizer(
        auth, None if server_jobs is None else server_jobs.tokens,
        None if server_jobs is None else server_jobs.grants))])

    @authorized.get("/whoami", tags=["server"])
    def whoami(request: Request) -> WhoAmIOut:
        token: ApiToken = request.state.principal
        return WhoAmIOut(user=token.user, token=token.name, scope=token.scope.value)

    authorized.include_router(run_routes(runs))
    if jobs is not None:
        authorized.include_router(job_routes(jobs))
    if endpoints is not None:
        authorized.include_router(endpoint_routes(endpoints, instance_guard=(
            None if server_endpoints is None else server_endpoints.check_instance)))
    if artifacts is not None:
        guard = None if endpoints is None else endpoint_files_guard(endpoints)
        authorized.include_router(artifact_routes(artifacts, upload_dir=upload_dir,
                                                  max_upload_bytes=max_upload_bytes,
                                                  guard=guard))
    if server_jobs is not None:
        from shoal.server._jobwait import wait_routes
        from shoal.server._launches import launch_routes

        authorized.include_router(launch_routes(server_jobs))
        authorized.include_router(wait_routes(server_jobs))
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
    app.add_exception_handler(ShoalError, _shoal_error)
    app.add_exception_handler(RequestValidationError, _invalid_request)
    return app


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


async def _shoal_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ShoalError)
    if exc.http_status >= 500:
        logger.error("%s %s: %s", request.method, request.url.path, exc)
    return JSONResponse(_body(exc.code, exc.message, exc.details), status_code=exc.http_status)


async def _invalid_request(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                         for e in exc.errors()[:5])
    return JSONResponse(_body("INVALID_ARGUMENT", f"invalid request to {request.method} "
                              f"{request.url.path}: {problems}", {}), status_code=400)
