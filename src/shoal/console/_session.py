"""Console sign-in: an API token traded once for a session cookie, and the CSRF token of
every change.

The cookie (``shoal_console``, HttpOnly, SameSite=Strict, Path = the console's root) holds
the token's SHA-256, its user and an expiry, signed with HMAC-SHA256 under the console's
secret; never the token itself. Each request re-reads the token by its hash, so revoking or
expiring the token ends the session at once. Without auth (``shoal ui``, ``shoal server
--no-auth``) the cookie names the local user and exists only to carry the CSRF token.

The CSRF token is an HMAC of the cookie's value: a page gets it (a hidden field, and the
``X-CSRF-Token`` header htmx sends), and every POST must return it. A page from another
origin can neither read it nor, with SameSite=Strict, send the cookie.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from shoal.core.auth import ApiToken, Scope, hash_token
from shoal.core.ports import AuthStore
from shoal.errors import AuthenticationError

__all__ = ["COOKIE", "Principal", "Sessions"]

COOKIE = "shoal_console"
_LIFETIME = timedelta(hours=12)
_LOCAL = "local"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a console request acts for."""

    user: str
    scope: Scope
    is_admin: bool

    def may_change(self, owner: str) -> bool:
        """Whether this user may cancel or change what *owner* owns (the API's rule)."""
        return self.scope.allows(Scope.WRITE) and (self.is_admin or self.user == owner)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Sessions:
    """Mints and checks session cookies and CSRF tokens under *secret* (see the module);
    *auth* None: no login, everyone is the local admin."""

    def __init__(self, auth: AuthStore | None, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("the console's secret needs at least 16 bytes")
        self._auth = auth
        self._secret = secret

    @property
    def login_required(self) -> bool:
        return self._auth is not None

    def _mac(self, purpose: str, text: str) -> str:
        return _b64(hmac.new(self._secret, f"{purpose}|{text}".encode(), hashlib.sha256).digest())

    def _cookie(self, token_hash: str, user: str, now: datetime) -> str:
        body = _b64(json.dumps({"h": token_hash, "u": user,
                                "e": int((now + _LIFETIME).timestamp())}).encode())
        return f"{body}.{self._mac('session', body)}"

    def local_cookie(self, now: datetime) -> str:
        """The cookie of a console without login."""
        return self._cookie("", _LOCAL, now)

    def login(self, token: str, now: datetime) -> str:
        """The cookie for *token*; AuthenticationError saying why it is refused."""
        if self._auth is None:
            return self.local_cookie(now)
        digest = hash_token(token.strip())
        found = self._usable(self._auth.token_by_hash(digest), now)
        return self._cookie(digest, found.user, now)

    @staticmethod
    def _usable(found: ApiToken | None, now: datetime) -> ApiToken:
        if found is None:
            raise AuthenticationError("that token is not known to this server (mistyped, or "
                                      "made for another server)")
        if found.revoked_at is not None:
            raise AuthenticationError(f"the token {found.name!r} of user {found.user!r} was "
                                      "revoked; ask an admin for a new one ('shoal tokens "
                                      "create')", token=found.name, user=found.user)
        if not found.usable_at(now):
            raise AuthenticationError(f"the token {found.name!r} of user {found.user!r} has "
                                      "expired; ask an admin for a new one",
                                      token=found.name, user=found.user)
        return found

    def principal(self, cookie: str | None, now: datetime) -> Principal | None:
        """Who *cookie* signs in, or None when it is missing, forged, expired or its token
        no longer works."""
        if not cookie:
            return None
        body, _, mac = cookie.partition(".")
        if not hmac.compare_digest(mac, self._mac("session", body)):
            return None
        try:
            data = json.loads(_unb64(body))
            token_hash, user, expiry = str(data["h"]), str(data["u"]), int(data["e"])
        except (ValueError, KeyError, TypeError):
            return None
        if expiry <= now.timestamp():
            return None
        if self._auth is None:
            return Principal(_LOCAL, Scope.ADMIN, True) if user == _LOCAL else None
        try:
            found = self._usable(self._auth.token_by_hash(token_hash), now)
        except AuthenticationError:
            return None
        if found.user != user:
            return None
        account = self._auth.find_user(user)
        return Principal(user, found.scope, account is not None and account.is_admin)

    def csrf(self, cookie: str) -> str:
        return self._mac("csrf", cookie)

    def csrf_ok(self, cookie: str | None, sent: str | None) -> bool:
        return bool(cookie) and bool(sent) and hmac.compare_digest(
            str(sent), self.csrf(str(cookie)))


def utcnow() -> datetime:
    return datetime.now(UTC)
