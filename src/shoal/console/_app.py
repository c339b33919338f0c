"""The console's ASGI app: its sign-in middleware, the login page, errors as pages, the
static files; the pages themselves are in ``_jobs.py`` and ``_runs.py``."""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import quote

from fastapi import FastAPI, Request
from starlette.responses import RedirectResponse, Response
from starlette.staticfiles import StaticFiles

from shoal.console._admin import ListEnvironments, admin_routes
from shoal.console._endpoints import endpoint_routes
from shoal.console._forms import read_form, require_csrf
from shoal.console._jobs import Cancel, job_routes
from shoal.console._render import base_url, page
from shoal.console._runs import run_routes
from shoal.console._session import COOKIE, Sessions, utcnow
from shoal.core.ports import ArtifactStore, AuthStore, EndpointStore, JobStore, RunStore
from shoal.errors import AuthenticationError, ShoalError

__all__ = ["create_console", "local_path"]

logger = logging.getLogger(__name__)

_STATIC = Path(__file__).parent / "static"
#: Only this origin's files run: no inline script or style, so an escaped value that slipped
#: through could still not execute (htmx's inline indicator style is turned off in base.html).
_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; "
        "object-src 'none'")
_OPEN = ("/login", "/static/")


def create_console(*, jobs: JobStore, runs: RunStore, artifacts: ArtifactStore,
                   cancel: Cancel, auth: AuthStore | None, secret: bytes,
                   endpoints: EndpointStore | None = None,
                   environments: ListEnvironments | None = None) -> FastAPI:
    """The web console over these stores (*endpoints*, *environments* None: their pages
    say they cannot be read here). *cancel* stops a job (``JobService.cancel``);
    *auth* None serves without login (``shoal ui``; loopback only), else a token signs in;
    *secret* (≥ 16 bytes) signs the session cookies and CSRF tokens."""
    sessions = Sessions(auth, secret)
    app = FastAPI(title="shoal console", docs_url=None, redoc_url=None, openapi_url=None)
    app.mount("/static", StaticFiles(directory=_STATIC), name="static")

    @app.middleware("http")
    async def sign_in(request: Request,
                      call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        return await _signed_in(sessions, request, call_next)

    @app.get("/")
    def home(request: Request) -> RedirectResponse:
        return RedirectResponse(f"{base_url(request)}/jobs", status_code=303)

    @app.get("/login")
    def login_page(request: Request, next: str = "") -> Response:
        return page(request, "login.html", next=local_path(next), error=None)

    @app.post("/login")
    async def login(request: Request) -> Response:
        form = await read_form(request)
        target = local_path(form.get("next", ""))
        try:
            cookie = sessions.login(form.get("token", ""), utcnow())
        except AuthenticationError as e:
            return page(request, "login.html", status_code=401, next=target, error=e.message)
        response = RedirectResponse(f"{base_url(request)}{target or '/jobs'}", status_code=303)
        _set_cookie(request, response, cookie)
        return response

    @app.post("/logout")
    async def logout(request: Request) -> Response:
        await require_csrf(sessions, request)
        response = RedirectResponse(f"{base_url(request)}/login", status_code=303)
        response.delete_cookie(COOKIE, path=base_url(request) or "/")
        return response

    app.include_router(job_routes(jobs, artifacts, runs, cancel, sessions))
    app.include_router(run_routes(runs, artifacts))
    app.include_router(endpoint_routes(endpoints, sessions))
    app.include_router(admin_routes(environments, auth, sessions))
    app.add_exception_handler(ShoalError, _error_page)
    return app


async def _signed_in(sessions: Sessions, request: Request,
                     call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    """Put the principal and the CSRF token on the request; send a visitor who is not
    signed in to the login page (a console without login signs everyone in as local)."""
    path = request.url.path.removeprefix(base_url(request))
    cookie = request.cookies.get(COOKIE)
    principal = sessions.principal(cookie, utcnow())
    fresh = None
    if principal is None and not sessions.login_required:
        cookie = fresh = sessions.local_cookie(utcnow())
        principal = sessions.principal(cookie, utcnow())
    request.state.principal = principal
    request.state.login_required = sessions.login_required
    request.state.csrf = sessions.csrf(cookie) if principal is not None and cookie else ""
    request.state.cookie = cookie if principal is not None else None
    if principal is None and not path.startswith(_OPEN):
        back = quote(path, safe="/") + _query(request)  # the path comes decoded
        target = f"{base_url(request)}/login?next={quote(back, safe='')}"
        if request.headers.get("hx-request"):  # a partial update: send the whole page there
            return Response(status_code=204, headers={"HX-Redirect": target})
        return RedirectResponse(target, status_code=303)
    response = await call_next(request)
    if fresh is not None:
        _set_cookie(request, response, fresh)
    response.headers["Content-Security-Policy"] = _CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    # Pages hold live state and a CSRF token: never stored. Static files revalidate (ETag).
    response.headers.setdefault("Cache-Control",
                                "no-cache" if path.startswith("/static/") else "no-store")
    return response


def _query(request: Request) -> str:
    return f"?{request.url.query}" if request.url.query else ""


#: A path and query inside this site: printable URL characters only (browsers drop tabs and
#: newlines, so "/\t/evil.example" would become "//evil.example"), and never "//" first.
_LOCAL_PATH = re.compile(r"/(?!/)[A-Za-z0-9._~!$&'()*+,;=:@%/?-]*")


def local_path(target: str) -> str:
    """*target* if it is a path inside the console, else "" (no open redirect)."""
    return target if _LOCAL_PATH.fullmatch(target) else ""


def _set_cookie(request: Request, response: Response, value: str) -> None:
    response.set_cookie(COOKIE, value, httponly=True, samesite="strict",
                        secure=request.url.scheme == "https", path=base_url(request) or "/",
                        max_age=12 * 3600)


async def _error_page(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ShoalError)
    if exc.http_status >= 500:
        logger.error("console %s %s: %s", request.method, request.url.path, exc)
    return page(request, "error.html", status_code=exc.http_status, code=exc.code,
                message=exc.message)
