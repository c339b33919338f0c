"""Bearer tokens on every route but ``/version``: 401 without a usable token, 403 when its
scope does not allow the action (reads need ``read``, writes ``write``)."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import Request

from shoal.core.auth import ApiToken, Scope, hash_token
from shoal.core.ports import AuthStore
from shoal.errors import AuthenticationError, PermissionDeniedError

__all__ = ["LOCAL_PRINCIPAL", "Authorizer"]

_READS = frozenset({"GET", "HEAD", "OPTIONS"})
#: The principal of a server started with ``--no-auth`` (loopback only).
LOCAL_PRINCIPAL = ApiToken("local", "local", "no-auth", Scope.ADMIN,
                           datetime.fromtimestamp(0, UTC))


class Authorizer:
    """The FastAPI dependency that authenticates and authorizes one request."""

    def __init__(self, store: AuthStore | None) -> None:
        self._store = store  # None: --no-auth

    def __call__(self, request: Request) -> ApiToken:
        token = LOCAL_PRINCIPAL if self._store is None else self._authenticate(request)
        needed = Scope.READ if request.method in _READS else Scope.WRITE
        if not token.scope.allows(needed):
            route = request.scope.get("route")
            action = getattr(route, "name", None) or f"{request.method} {request.url.path}"
            raise PermissionDeniedError(
                f"token {token.name!r} of user {token.user!r} has scope {token.scope.value}; "
                f"{action} ({request.method} {request.url.path}) needs a {needed.value} token",
                action=action, scope=token.scope.value, needs=needed.value, user=token.user)
        request.state.principal = token
        return token

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
        found = self._store.token_by_hash(digest)
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

