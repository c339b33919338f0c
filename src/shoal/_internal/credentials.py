"""The logins ``shoal login`` keeps: ``$XDG_CONFIG_HOME/shoal/credentials`` (``~/.config/...``).

One JSON document, mode 0600 in a 0700 directory, owned by the user, replaced atomically
(a private temporary file renamed over it), so a crash never leaves half of it::

    {"version": 1, "current": "https://shoal.example:8765",
     "servers": {"https://shoal.example:8765": {"token": "shoal_...", "user": "ann",
                                                 "saved_at": "2025-01-01T12:00:00+00:00"}}}

Several servers may be stored (``shoal login URL`` again switches to a stored one);
``current`` is the one a ``Session`` uses when
``SHOAL_SERVER_URL`` is not set (``shoal.config.Settings``). A file others may read, of
another user, or that is not this document is a ``ConfigError`` naming it: the token in it
is as good as a password. This module does no environment lookups: callers give the path.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from shoal.errors import ConfigError

__all__ = ["Credentials", "Login", "normalise_url", "read_credentials", "remove_login",
           "save_login", "write_credentials"]

_VERSION = 1
_MAX_BYTES = 1 << 20  # far more than any number of logins; refuses some other big file


@dataclass(frozen=True, slots=True)
class Login:
    """One server's login: its URL, token (never printed) and the user the token is."""

    url: str
    token: str = field(repr=False)
    user: str
    saved_at: str = ""


@dataclass(frozen=True, slots=True)
class Credentials:
    """The whole file: every stored login, by URL, and the current one's URL."""

    current: str | None = None
    servers: dict[str, Login] = field(default_factory=dict)

    def current_login(self) -> Login | None:
        return None if self.current is None else self.servers.get(self.current)


def normalise_url(url: str) -> str:
    """*url* as logins are keyed: no trailing ``/`` and no ``/api/v1`` (the API's prefix)."""
    url = url.strip().rstrip("/")
    if url.endswith("/api/v1"):
        url = url[: -len("/api/v1")].rstrip("/")
    return url


def read_credentials(path: Path) -> Credentials:
    """The logins in *path*; none when it does not exist. ConfigError for a file others may
    read, of another user, or that is not a credentials document."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return Credentials()
    except OSError as e:
        raise ConfigError(f"cannot read the shoal credentials file {path}: {e.strerror}; "
                          f"fix it or delete it and run 'shoal login URL' again",
                          path=str(path)) from e
    try:
        st = os.fstat(fd)
        _check_private(path, st)
        data = os.read(fd, _MAX_BYTES + 1)
    finally:
        os.close(fd)
    return _parse(path, data)


def _check_private(path: Path, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"the shoal credentials file {path} is not a regular file; remove "
                          "it and run 'shoal login URL' again", path=str(path))
    if st.st_uid != os.getuid():
        raise ConfigError(f"the shoal credentials file {path} belongs to another user (uid "
                          f"{st.st_uid}); remove it and run 'shoal login URL' again",
                          path=str(path), uid=st.st_uid)
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise ConfigError(
            f"the shoal credentials file {path} may be read by other users (mode {mode:04o}): "
            f"the tokens in it are as good as passwords. Run 'chmod 600 {path}'; if others "
            "may have read it, revoke its tokens ('shoal tokens revoke') and log in again",
            path=str(path), mode=f"{mode:04o}")


def _parse(path: Path, data: bytes) -> Credentials:
    def bad(why: str) -> ConfigError:
        return ConfigError(f"the shoal credentials file {path} is not valid ({why}); delete "
                           "it and run 'shoal login URL' again", path=str(path))

    if len(data) > _MAX_BYTES:
        raise bad(f"over {_MAX_BYTES} bytes")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise bad(f"not JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("version") != _VERSION:
        raise bad(f"not a version-{_VERSION} credentials document")
    servers = doc.get("servers")
    current = doc.get("current")
    if not isinstance(servers, dict) or not (current is None or isinstance(current, str)):
        raise bad("'servers' must be an object and 'current' a URL or null")
    logins: dict[str, Login] = {}
    for url, entry in servers.items():
        if not isinstance(entry, dict) or not all(
                isinstance(entry.get(k), str) and entry.get(k) for k in ("token", "user")):
            raise bad(f"the entry of {url!r} needs a 'token' and a 'user'")
        logins[url] = Login(url, entry["token"], entry["user"], str(entry.get("saved_at", "")))
    if current is not None and current not in logins:
        raise bad(f"'current' is {current!r}, which has no entry under 'servers'")
    return Credentials(current, logins)


def write_credentials(path: Path, credentials: Credentials) -> None:
    """Replace *path* with *credentials* atomically (0600; its directory made 0700); with no
    login left, remove the file."""
    if not credentials.servers:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return
    doc = {"version": _VERSION, "current": credentials.current,
           "servers": {url: {"token": login.token, "user": login.user,
                             "saved_at": login.saved_at}
                       for url, login in sorted(credentials.servers.items())}}
    folder = path.parent
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = folder / f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            try:
                os.fchmod(fd, 0o600)  # whatever the umask
                os.write(fd, (json.dumps(doc, indent=2) + "\n").encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
    except OSError as e:
        raise ConfigError(f"cannot write the shoal credentials file {path}: {e.strerror or e}",
                          path=str(path)) from e


def save_login(path: Path, login: Login) -> Credentials:
    """Store *login* (replacing the same URL's) and make it the current one."""
    found = read_credentials(path)
    stamped = Login(login.url, login.token, login.user,
                    login.saved_at or datetime.now(UTC).isoformat(timespec="seconds"))
    saved = Credentials(stamped.url, {**found.servers, stamped.url: stamped})
    write_credentials(path, saved)
    return saved


def remove_login(path: Path, url: str | None = None) -> Login | None:
    """Forget the login of *url* (default: the current one) and return it, or None when there
    was none. Forgetting the current one leaves none current (sessions then use their own
    stores) rather than switching to another server unasked."""
    found = read_credentials(path)
    url = found.current if url is None else normalise_url(url)
    if url is None or url not in found.servers:
        return None
    rest = {u: login for u, login in found.servers.items() if u != url}
    current = found.current if found.current in rest else None
    write_credentials(path, Credentials(current, rest))
    return found.servers[url]
