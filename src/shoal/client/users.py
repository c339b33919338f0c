"""``HttpUserAdmin``: a team server's users and API tokens managed over ``/users`` and
``/tokens`` (admin only, server/_users.py). A token made is returned once, with its record;
the server keeps its hash."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

from shoal.client.http import ServerConnection
from shoal.core.auth import ApiToken, Scope, User

__all__ = ["HttpUserAdmin"]


def _time(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def _user(body: Mapping[str, Any]) -> User:
    return User(str(body["name"]), bool(body["is_admin"]),
                datetime.fromisoformat(body["created_at"]))


def _token(body: Mapping[str, Any]) -> ApiToken:
    return ApiToken(str(body["id"]), str(body["user"]), str(body["name"]), Scope(body["scope"]),
                    datetime.fromisoformat(body["created_at"]), _time(body.get("expires_at")),
                    _time(body.get("revoked_at")))


class HttpUserAdmin:
    """Users and tokens of the server behind *connection* (the caller must be an admin)."""

    def __init__(self, connection: ServerConnection) -> None:
        self._http = connection

    def list_users(self) -> list[User]:
        return [_user(u) for u in self._http.call("GET", "/users")]

    def create_user(self, name: str, *, is_admin: bool = False) -> User:
        return _user(self._http.call("POST", "/users",
                                     json={"name": name, "is_admin": is_admin}))

    def list_tokens(self, user: str | None = None) -> list[ApiToken]:
        params = None if user is None else {"user": user}
        return [_token(t) for t in self._http.call("GET", "/tokens", params=params)]

    def create_token(self, user: str, name: str, *, scope: Scope,
                     expires_in: timedelta | None = None,
                     create_user: bool = False) -> tuple[str, ApiToken]:
        """A new token of *user*: ``(token, record)``; the token is shown nowhere else."""
        body = {"user": user, "name": name, "scope": scope.value, "create_user": create_user,
                "expires_in_seconds": None if expires_in is None
                else expires_in.total_seconds()}
        made = self._http.call("POST", "/tokens", json=body)
        return str(made["token"]), _token(made["record"])

    def revoke_token(self, token_id: str) -> ApiToken:
        return _token(self._http.call("POST", f"/tokens/{quote(token_id, safe='')}/revoke"))
