"""The console's host pages: the cached job environments of the host that runs the jobs, and
(for admins, when sign-in is on) the users and their tokens, making a token (shown once, on
the page that answers the form) and revoking one; the store holds no token's secret."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from starlette.responses import RedirectResponse, Response

from shoal.console._forms import require_csrf
from shoal.console._render import ago, base_url, page
from shoal.console._session import Principal, Sessions, utcnow
from shoal.core.auth import Scope, check_user_name, hash_token, new_token
from shoal.core.ports import AuthStore
from shoal.errors import ConfigError, InvalidArgumentError, NotFoundError, PermissionDeniedError

if TYPE_CHECKING:
    from shoal.envs import EnvInfo

__all__ = ["ListEnvironments", "admin_routes"]

#: The longest expiry the tokens form offers, in days.
_MAX_DAYS = 3650

#: The cached environments (``UvEnvBuilder.list``).
ListEnvironments = Callable[[], Sequence["EnvInfo"]]


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _store(auth: AuthStore | None) -> AuthStore:
    if auth is None:
        raise ConfigError("this console has no sign-in (shoal ui), so no users or tokens; "
                          "make tokens on the team server ('shoal tokens create')")
    return auth


def admin_routes(environments: ListEnvironments | None, auth: AuthStore | None,
                 sessions: Sessions) -> APIRouter:
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

    def admin_of(request: Request, action: str, *, change: bool) -> Principal:
        principal: Principal = request.state.principal
        if not principal.is_admin:
            raise PermissionDeniedError(
                f"user {principal.user!r} may not {action}: only an admin may",
                action=action, user=principal.user)
        if change and not principal.scope.allows(Scope.ADMIN):
            raise PermissionDeniedError(
                f"user {principal.user!r} signed in with a {principal.scope.value} token; to "
                f"{action}, sign in with an admin token", action=action, user=principal.user)
        return principal

    def users_page(request: Request, status_code: int = 200, **made: Any) -> Response:
        if auth is None:
            return page(request, "users.html", users=None)
        admin_of(request, "list users and tokens", change=False)
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
        return page(request, "users.html", status_code=status_code, users=users,
                    scopes=[s.value for s in Scope], made=made or None)

    @api.get("/users")
    def users(request: Request) -> Response:
        return users_page(request)

    @api.post("/users/tokens")
    async def create_token(request: Request) -> Response:
        """A new token, shown on the page this once (the store keeps its hash only)."""
        form = await require_csrf(sessions, request)
        store = _store(auth)
        admin_of(request, "create tokens", change=True)
        user, name = form.get("user", "").strip(), form.get("name", "").strip()
        scope, days = form.get("scope", ""), form.get("expires_days", "").strip()
        if not name:
            raise InvalidArgumentError("a token needs a name (e.g. laptop, ci)", argument="name")
        if scope not in {s.value for s in Scope}:
            raise InvalidArgumentError(f"scope {scope!r} is not one of read, write, admin",
                                       argument="scope")
        expires = None
        if days:
            if not days.isdigit() or not 0 < int(days) <= _MAX_DAYS:
                raise InvalidArgumentError(f"expires in {days!r} days: give a whole number "
                                           f"of days from 1 to {_MAX_DAYS}, or leave it "
                                           "empty for no expiry", argument="expires_days")
            expires = utcnow() + timedelta(days=int(days))
        if store.find_user(check_user_name(user)) is None:
            if form.get("create_user") != "1":
                raise NotFoundError(f"there is no user {user!r}; tick 'create the user' to "
                                    "make one with the token", user=user)
            store.create_user(user)
        token = new_token()
        record = store.create_token(user, name, scope=Scope(scope),
                                    token_hash=hash_token(token), expires_at=expires)
        return users_page(request, status_code=201, token=token, user=record.user,
                          name=record.name, scope=record.scope.value)

    @api.post("/users/tokens/{token_id}/revoke")
    async def revoke_token(request: Request, token_id: str) -> Response:
        await require_csrf(sessions, request)
        store = _store(auth)
        admin_of(request, "revoke tokens", change=True)
        store.revoke_token(token_id)
        return RedirectResponse(f"{base_url(request)}/users", status_code=303)

    return api
