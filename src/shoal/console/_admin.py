"""The console's host pages: the cached job environments of the host that runs the jobs, and
(for admins, when sign-in is on) the users and their tokens; never a token's secret, which
the store does not hold."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from starlette.responses import Response

from shoal.console._render import ago, page
from shoal.console._session import Principal, utcnow
from shoal.core.ports import AuthStore
from shoal.errors import PermissionDeniedError

if TYPE_CHECKING:
    from shoal.envs import EnvInfo

__all__ = ["ListEnvironments", "admin_routes"]

#: The cached environments (``UvEnvBuilder.list``).
ListEnvironments = Callable[[], Sequence["EnvInfo"]]


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def admin_routes(environments: ListEnvironments | None, auth: AuthStore | None) -> APIRouter:
    api = APIRouter()

    @api.get("/environments")
    def environments_page(request: Request) -> Response:
        if environments is None:
            return page(request, "environments.html", envs=None)
        now = utcnow()

        def moment(ts: float) -> datetime:
            return datetime.fromtimestamp(ts, UTC)

        rows = [{"key": e.key, "packages": e.packages, "size": size(e.size_bytes),
                 "created": ago(moment(e.created_at), now),
                 "used": ago(moment(e.last_used_at), now)}
                for e in sorted(environments(), key=lambda e: -e.last_used_at)]
        return page(request, "environments.html", envs=rows)

    @api.get("/users")
    def users_page(request: Request) -> Response:
        if auth is None:
            return page(request, "users.html", users=None)
        principal: Principal = request.state.principal
        if not principal.is_admin:
            raise PermissionDeniedError(
                f"user {principal.user!r} may not list users and tokens: only an admin may",
                action="list users", user=principal.user)
        now = utcnow()
        tokens = auth.list_tokens()
        users = [{"name": u.name, "admin": u.is_admin, "age": ago(u.created_at, now),
                  "tokens": [{"name": t.name, "id": t.id, "scope": t.scope.value,
                              "expires": "" if t.expires_at is None
                              else f"{t.expires_at:%Y-%m-%d %H:%M}",
                              "state": "revoked" if t.revoked_at is not None
                              else "usable" if t.usable_at(now) else "expired"}
                             for t in tokens if t.user == u.name]}
                 for u in sorted(auth.list_users(), key=lambda u: u.name)]
        return page(request, "users.html", users=users)

    return api
