"""The team server's ASGI app (FastAPI): ``/api/v1`` over a metadata store, its errors as
``{"error": {code, message, details}}`` with the error class's HTTP status."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from shoal.client.http import API_PREFIX, API_VERSION
from shoal.core.auth import ApiToken
from shoal.core.ports import AuthStore, RunStore
from shoal.errors import ShoalError
from shoal.server._auth import Authorizer
from shoal.server._runs import run_routes
from shoal.server._wire import VersionOut, WhoAmIOut

if TYPE_CHECKING:
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


def create_app(runs: RunStore, auth: AuthStore | None, *,
               jobs: ServerJobs | None = None) -> FastAPI:
    """The app over *runs*; *auth* None serves without tokens (``--no-auth``, loopback);
    *jobs*: jobs on the server's backend (launches, keys, waits, live logs, job tokens)."""
    app = FastAPI(title="shoal server", version=shoal_version(),
                  openapi_url=f"{API_PREFIX}/openapi.json", docs_url=f"{API_PREFIX}/docs",
                  redoc_url=None)
    info = VersionOut(api_version=API_VERSION, shoal_version=shoal_version(),
                      auth=auth is not None)

    @app.get(f"{API_PREFIX}/version", tags=["server"])
    def get_version() -> VersionOut:
        return info

    authorized = APIRouter(dependencies=[Depends(Authorizer(
        auth, None if jobs is None else jobs.tokens))])

    @authorized.get("/whoami", tags=["server"])
    def whoami(request: Request) -> WhoAmIOut:
        token: ApiToken = request.state.principal
        return WhoAmIOut(user=token.user, token=token.name, scope=token.scope.value)

    authorized.include_router(run_routes(runs))
    if jobs is not None:
        from shoal.server._jobwait import wait_routes
        from shoal.server._launches import launch_routes

        authorized.include_router(launch_routes(jobs))
        authorized.include_router(wait_routes(jobs))
    app.include_router(authorized, prefix=API_PREFIX)
    app.add_exception_handler(ShoalError, _shoal_error)
    app.add_exception_handler(RequestValidationError, _invalid_request)
    return app


def _body(code: str, message: str, details: dict[str, Any]) -> dict[str, Any]:
    return {"error": {"code": code, "message": message,
                      "details": {k: v if isinstance(v, (str, int, float, bool, type(None)))
                                  else str(v) for k, v in details.items()}}}


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
