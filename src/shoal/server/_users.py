"""Routes that manage the server's users and API tokens (``shoal users``, ``shoal tokens``
from a laptop): ``/users`` and ``/tokens``, for an admin only (an admin-scope token of an
admin user); the token made is in the one answer, the store keeps its hash."""

from __future__ import annotations

from datetime import timedelta

from fastapi import APIRouter, Depends, Request

from shoal.core.auth import ApiToken, Scope
from shoal.core.ports import AuthStore
from shoal.errors import PermissionDeniedError
from shoal.server._wire_users import NewTokenOut, TokenIn, TokenOut, UserIn, UserOut
from shoal.server.admin import create_token

__all__ = ["require_admin", "user_routes"]


def require_admin(request: Request) -> None:
    """403 naming the route unless the caller is an admin with an admin-scope token (a
    server with ``--no-auth`` has one caller, its local admin)."""
    principal: ApiToken = request.state.principal
    users: AuthStore | None = getattr(request.state, "users", None)
    route = request.scope.get("route")
    action = getattr(route, "name", None) or f"{request.method} {request.url.path}"
    where = f"{action} ({request.method} {request.url.path})"
    if not principal.scope.allows(Scope.ADMIN):
        raise PermissionDeniedError(
            f"token {principal.name!r} of user {principal.user!r} has scope "
            f"{principal.scope.value}; {where} needs an admin token (an admin makes one with "
            "'shoal tokens create --scope admin')", action=action, user=principal.user,
            scope=principal.scope.value, needs=Scope.ADMIN.value)
    if users is not None:
        user = users.find_user(principal.user)
        if user is None or not user.is_admin:
            raise PermissionDeniedError(
                f"user {principal.user!r} is not an admin; {where} needs an admin "
                "('shoal users create NAME --admin' makes one)", action=action,
                user=principal.user, needs=Scope.ADMIN.value)


def user_routes(store: AuthStore) -> APIRouter:
    api = APIRouter(tags=["users"], dependencies=[Depends(require_admin)])

    @api.get("/users")
    def list_users() -> list[UserOut]:
        return [UserOut.of(u) for u in store.list_users()]

    @api.post("/users", status_code=201)
    def create_user(body: UserIn) -> UserOut:
        return UserOut.of(store.create_user(body.name, is_admin=body.is_admin))

    @api.get("/tokens")
    def list_tokens(user: str | None = None) -> list[TokenOut]:
        return [TokenOut.of(t) for t in store.list_tokens(user)]

    @api.post("/tokens", status_code=201)
    def create_api_token(body: TokenIn) -> NewTokenOut:
        if body.create_user and store.find_user(body.user) is None:
            store.create_user(body.user)
        made = create_token(store, body.user, body.name, scope=body.scope, expires_in=None
                            if body.expires_in_seconds is None
                            else timedelta(seconds=body.expires_in_seconds))
        return NewTokenOut(token=made.token, record=TokenOut.of(made.record))

    @api.post("/tokens/{token_id}/revoke")
    def revoke_token(token_id: str) -> TokenOut:
        return TokenOut.of(store.revoke_token(token_id))

    return api
