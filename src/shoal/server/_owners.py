"""Owner checks of the team server: everyone reads everything; only a record's owner or an
admin cancels, deletes or changes it.

Route files call :func:`caller` for the owner a new record gets, and :func:`require_owner`
before a change::

    require_owner(request, record.owner, "delete", f"run {run!r} of experiment {exp!r}")

The :class:`~shoal.server._auth.Authorizer` has put the request's principal (its token) and
the user store on ``request.state``; a server started with ``--no-auth`` has no user store,
and its one caller (``local``) may do everything.
"""

from __future__ import annotations

from fastapi import Request

from shoal.core.auth import ApiToken
from shoal.core.ports import AuthStore
from shoal.errors import PermissionDeniedError

__all__ = ["caller", "require_owner"]


def caller(request: Request) -> str:
    """The user the request acts for: the owner of what it creates."""
    principal: ApiToken = request.state.principal
    return principal.user


def require_owner(request: Request, owner: str, action: str, what: str) -> None:
    """Return when the caller owns *what* (owned by *owner*) or is an admin; otherwise
    PermissionDeniedError (403) naming the owner, the caller and the *action*."""
    principal: ApiToken = request.state.principal
    if principal.user == owner:
        return
    users: AuthStore | None = getattr(request.state, "users", None)
    if users is None:  # --no-auth: the only caller is the local admin
        return
    user = users.find_user(principal.user)
    if user is not None and user.is_admin:
        return
    raise PermissionDeniedError(
        f"user {principal.user!r} may not {action} {what}: it belongs to {owner!r}; only its "
        "owner or an admin may", action=action, owner=owner, user=principal.user, what=what)
