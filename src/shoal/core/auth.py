"""Users and API tokens of a team server (``shoal server``): frozen values and pure checks.

A token is shown once, when it is made; the store keeps only its SHA-256 (``token_hash``).
Scopes are levels: ``read`` < ``write`` < ``admin``; a token allows its level and those below.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from shoal.errors import InvalidArgumentError

__all__ = ["TOKEN_PREFIX", "ApiToken", "Scope", "User", "check_user_name", "hash_token",
           "new_token"]

#: Every token starts with this, so a leaked one is recognisable (secret scanners, logs).
TOKEN_PREFIX = "shoal_"
_USER = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9._-]{0,63}")


class Scope(StrEnum):
    READ = "read"
    WRITE = "write"
    ADMIN = "admin"

    def allows(self, needed: Scope) -> bool:
        order = (Scope.READ, Scope.WRITE, Scope.ADMIN)
        return order.index(self) >= order.index(needed)


@dataclass(frozen=True, slots=True)
class User:
    name: str
    is_admin: bool
    created_at: datetime


@dataclass(frozen=True, slots=True)
class ApiToken:
    """A token's record; the token itself is never stored."""

    id: str
    user: str
    name: str
    scope: Scope
    created_at: datetime
    expires_at: datetime | None = None
    revoked_at: datetime | None = None

    def usable_at(self, now: datetime) -> bool:
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)


def check_user_name(name: object) -> str:
    if not isinstance(name, str) or _USER.fullmatch(name) is None:
        raise InvalidArgumentError(
            f"user name {name!r} is not valid: 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit", argument="user", value=repr(name))
    return name


def new_token() -> str:
    """A fresh token: the prefix and 32 random bytes (URL-safe base64)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """The stored form of *token*: its SHA-256, hex."""
    return hashlib.sha256(token.encode()).hexdigest()
