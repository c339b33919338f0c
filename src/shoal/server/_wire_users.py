"""The pydantic models of the users and tokens routes (``server/_users.py``)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from shoal.core.auth import ApiToken, Scope, User

__all__ = ["NewTokenOut", "TokenIn", "TokenOut", "UserIn", "UserOut"]


class UserIn(BaseModel):
    name: str
    is_admin: bool = False


class UserOut(BaseModel):
    name: str
    is_admin: bool
    created_at: datetime

    @classmethod
    def of(cls, user: User) -> UserOut:
        return cls(name=user.name, is_admin=user.is_admin, created_at=user.created_at)


class TokenIn(BaseModel):
    user: str
    name: str
    scope: Scope = Scope.READ
    #: Seconds until the token expires; None: never.
    expires_in_seconds: float | None = Field(default=None, gt=0)
    #: Create *user* (not an admin) when there is no such user yet.
    create_user: bool = False


class TokenOut(BaseModel):
    """A token's record: never the token itself, nor its hash."""

    id: str
    user: str
    name: str
    scope: Scope
    created_at: datetime
    expires_at: datetime | None = None
    revoked_at: datetime | None = None

    @classmethod
    def of(cls, token: ApiToken) -> TokenOut:
        return cls(id=token.id, user=token.user, name=token.name, scope=token.scope,
                   created_at=token.created_at, expires_at=token.expires_at,
                   revoked_at=token.revoked_at)


class NewTokenOut(BaseModel):
    """A token just made: *token* is in this one answer and nowhere else."""

    token: str
    record: TokenOut
