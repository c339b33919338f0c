"""Users and API tokens in the SQL metadata store (mixed into ``SqlMetadataStore``).

Tokens are looked up by their SHA-256 (a unique index); the token itself never reaches the
database.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.engine.interfaces import DBAPICursor

from shoal.core.auth import ApiToken, Scope, User, check_user_name
from shoal.core.clock import Clock
from shoal.errors import AlreadyExistsError, InvalidArgumentError, NotFoundError
from shoal.storage.sql._dbapi import Dbapi

__all__ = ["AuthTables"]

_TOKEN_COLUMNS = "id, user_name, name, scope, created_at, expires_at, revoked_at"


def _dt(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


def _token(row: Any) -> ApiToken:
    created = _dt(row[4])
    assert created is not None  # NOT NULL
    return ApiToken(id=row[0], user=row[1], name=row[2], scope=Scope(row[3]),
                    created_at=created, expires_at=_dt(row[5]), revoked_at=_dt(row[6]))


class AuthTables:
    """The users-and-tokens part of the SQL metadata store."""

    _db: Dbapi
    _clock: Clock

    def create_user(self, name: str, *, is_admin: bool = False) -> User:
        check_user_name(name)
        now = self._clock.now().timestamp()
        with self._db.tx(write=True) as cur:
            if self._user(cur, name) is not None:
                raise AlreadyExistsError(f"a user named {name!r} already exists", user=name)
            cur.execute(self._db.sql(
                "INSERT INTO users (name, is_admin, created_at) VALUES (?, ?, ?)"),
                (name, bool(is_admin), now))
        return User(name, bool(is_admin), datetime.fromtimestamp(now, UTC))

    def find_user(self, name: str) -> User | None:
        with self._db.tx(write=False) as cur:
            return self._user(cur, name)

    def list_users(self) -> list[User]:
        with self._db.tx(write=False) as cur:
            cur.execute("SELECT name, is_admin, created_at FROM users ORDER BY name")
            return [User(r[0], bool(r[1]), datetime.fromtimestamp(r[2], UTC))
                    for r in cur.fetchall()]

    def _user(self, cur: DBAPICursor, name: str) -> User | None:
        cur.execute(self._db.sql("SELECT name, is_admin, created_at FROM users WHERE name = ?"),
                    (name,))
        row = cur.fetchone()
        return None if row is None else User(row[0], bool(row[1]),
                                             datetime.fromtimestamp(row[2], UTC))

    def create_token(self, user: str, name: str, *, scope: Scope, token_hash: str,
                     expires_at: datetime | None = None) -> ApiToken:
        if not name or len(name) > 64:
            raise InvalidArgumentError(f"token name {name!r} must be 1-64 characters",
                                       argument="name")
        now = self._clock.now().timestamp()
        token_id = secrets.token_hex(8)
        expires = None if expires_at is None else expires_at.timestamp()
        with self._db.tx(write=True) as cur:
            owner = self._user(cur, user)
            if owner is None:
                raise NotFoundError(f"no user named {user!r}; 'shoal tokens create' makes one "
                                    "with --create-user", user=user)
            if scope is Scope.ADMIN and not owner.is_admin:
                raise InvalidArgumentError(f"user {user!r} is not an admin: an admin token "
                                           "needs an admin user", user=user, scope=scope.value)
            cur.execute(self._db.sql(
                "SELECT 1 FROM api_tokens WHERE user_name = ? AND name = ?"), (user, name))
            if cur.fetchone() is not None:
                raise AlreadyExistsError(f"user {user!r} already has a token named {name!r}",
                                         user=user, token=name)
            cur.execute(self._db.sql(
                f"INSERT INTO api_tokens ({_TOKEN_COLUMNS}, token_hash) "
                "VALUES (?, ?, ?, ?, ?, ?, NULL, ?)"),
                (token_id, user, name, scope.value, now, expires, token_hash))
        return ApiToken(token_id, user, name, scope, datetime.fromtimestamp(now, UTC),
                        expires_at=_dt(expires))

    def token_by_hash(self, token_hash: str) -> ApiToken | None:
        with self._db.tx(write=False) as cur:
            cur.execute(self._db.sql(
                f"SELECT {_TOKEN_COLUMNS} FROM api_tokens WHERE token_hash = ?"), (token_hash,))
            row = cur.fetchone()
        return None if row is None else _token(row)

    def list_tokens(self, user: str | None = None) -> list[ApiToken]:
        with self._db.tx(write=False) as cur:
            if user is None:
                cur.execute(f"SELECT {_TOKEN_COLUMNS} FROM api_tokens "
                            "ORDER BY user_name, created_at, name")
            else:
                cur.execute(self._db.sql(f"SELECT {_TOKEN_COLUMNS} FROM api_tokens "
                                         "WHERE user_name = ? ORDER BY created_at, name"),
                            (user,))
            return [_token(r) for r in cur.fetchall()]

    def revoke_token(self, token_id: str) -> ApiToken:
        now = self._clock.now().timestamp()
        with self._db.tx(write=True) as cur:
            cur.execute(self._db.sql("UPDATE api_tokens SET revoked_at = ? "
                                     "WHERE id = ? AND revoked_at IS NULL"), (now, token_id))
            cur.execute(self._db.sql(f"SELECT {_TOKEN_COLUMNS} FROM api_tokens WHERE id = ?"),
                        (token_id,))
            row = cur.fetchone()
        if row is None:
            raise NotFoundError(f"no token with id {token_id!r}; 'shoal tokens list' shows "
                                "them", token=token_id)
        return _token(row)
