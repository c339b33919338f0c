"""Starting the team server and managing its users and tokens on the server's own store
(``shoal server``, ``shoal server init``, ``shoal tokens ...``): these commands run on the
server's host, with the server's settings, and need no token."""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from shoal.core.auth import ApiToken, Scope, hash_token, new_token
from shoal.core.ports import AuthStore
from shoal.errors import AlreadyExistsError, ConfigError
from shoal.session import Session

if TYPE_CHECKING:
    import uvicorn

__all__ = ["NewToken", "check_bind", "create_token", "init_admin", "is_loopback", "serve",
           "server_config"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class NewToken:
    """A token just made: *token* is shown once and never stored."""

    token: str
    record: ApiToken


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: only 'localhost' counts as loopback
        return False


def check_bind(host: str, *, auth: bool) -> None:
    """Refuse a non-loopback bind without authentication, saying why."""
    if not auth and not is_loopback(host):
        raise ConfigError(
            f"refusing to serve on {host!r} without authentication: anyone who can reach that "
            "address could read and change every run and metric. Drop --no-auth (clients "
            "then send tokens: 'shoal server init' makes the first admin's), or bind "
            "127.0.0.1", host=host)


def create_token(store: AuthStore, user: str, name: str, *, scope: Scope,
                 expires_in: timedelta | None = None) -> NewToken:
    token = new_token()
    expires = None if expires_in is None else datetime.now(UTC) + expires_in
    record = store.create_token(user, name, scope=scope, token_hash=hash_token(token),
                                expires_at=expires)
    return NewToken(token, record)


def init_admin(store: AuthStore, user: str = "admin") -> NewToken:
    """The first admin and its admin token; refused once an admin exists."""
    admins = [u.name for u in store.list_users() if u.is_admin]
    if admins:
        raise AlreadyExistsError(
            f"this server is already initialised (admin: {', '.join(admins)}); make more "
            "tokens with 'shoal tokens create'", admins=",".join(admins))
    store.create_user(user, is_admin=True)
    return create_token(store, user, "init", scope=Scope.ADMIN)


def server_config(session: Session, *, host: str, port: int, auth: bool) -> uvicorn.Config:
    """The uvicorn configuration ``serve`` runs: the app over the session's stores."""
    check_bind(host, auth=auth)
    from shoal._internal.extras import require

    require("server", "the team server (shoal server)", "fastapi", "uvicorn", "jinja2")
    import uvicorn

    from shoal.server._launches import ServerJobs
    from shoal.server._signals import NotifyingJobStore, Signals
    from shoal.server.app import create_app

    store = session.metadata
    if auth and not is_loopback(host):
        logger.warning("serving on %s over plain HTTP: tokens travel unencrypted; put a TLS "
                       "proxy in front for a network you do not trust", host)
    # Jobs' supervisors run on this host and reach the server on the address it binds.
    own = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    signals = Signals()
    server_jobs = ServerJobs(session, f"http://{own}:{port}", signals)
    jobs = NotifyingJobStore(store, signals)
    from shoal.console import server_console

    app = create_app(store, store if auth else None, jobs=jobs,
                     endpoints=store, artifacts=session.artifacts,
                     upload_dir=session.home / "uploads",
                     max_upload_bytes=session.settings.server_max_upload_bytes,
                     server_jobs=server_jobs,
                     console=server_console(session, jobs, store if auth else None))
    # One process, no websockets (no route needs them: their protocol module is then never
    # imported). One process also keeps TCP_NODELAY on accepted sockets: asyncio and uvloop
    # set it on the sockets of the server they create, while the sockets of uvicorn's
    # --workers lose it (uvicorn issue 3149; tests/integration/test_server_sockets.py).
    return uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                          lifespan="off", ws="none", interface="asgi3")


def serve(session: Session, *, host: str, port: int, auth: bool) -> None:
    """Serve ``/api/v1`` over the session's stores until interrupted."""
    config = server_config(session, host=host, port=port, auth=auth)
    import uvicorn

    logger.info("shoal server on http://%s:%d/api/v1 (auth: %s)", host, port,
                "tokens" if auth else "none")
    uvicorn.Server(config).run()
