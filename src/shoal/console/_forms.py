"""Forms posted to the console: their fields, and the CSRF check every change passes."""

from __future__ import annotations

from urllib.parse import parse_qs

from starlette.requests import Request

from shoal.console._session import COOKIE, Sessions
from shoal.errors import PermissionDeniedError

__all__ = ["read_form", "require_csrf"]


async def read_form(request: Request) -> dict[str, str]:
    """An urlencoded form's fields (the last value of each)."""
    body = (await request.body()).decode("utf-8", "replace")
    return {k: v[-1] for k, v in parse_qs(body, keep_blank_values=True).items()}


async def require_csrf(sessions: Sessions, request: Request) -> dict[str, str]:
    """The form of a change, once its CSRF token is checked (403 without it)."""
    form = await read_form(request)
    sent = request.headers.get("x-csrf-token") or form.get("csrf")
    if not sessions.csrf_ok(request.cookies.get(COOKIE), sent):
        raise PermissionDeniedError(
            f"{request.method} {request.url.path} was refused: it did not carry this page's "
            "CSRF token (reload the page and try again)", action=request.url.path)
    return form
