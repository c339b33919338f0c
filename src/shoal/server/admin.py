"""Starting the team server and managing its users and tokens on the server's own store
(``shoal server``, ``shoal server init``, ``shoal tokens ...``): these commands run on the
server's host, with the server's settings, and need no token."""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from shoal.core.auth import ApiToken, Scope, hash_token, new_token
from shoal.core.ports import AuthStore
from shoal.errors import AlreadyExistsError, ConfigError, InvalidArgumentError
from shoal.session import Session

if TYPE_CHECKING:
    import uvicorn

__all__ = ["NewToken", "check_bind", "check_public_url", "create_token", "init_admin",
           "is_loopback", "serve", "serve_settings", "server_config",
           "supervisor_url"]

logger = logging.getLogger(__name__)
S = TypeVar("S")


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


_WILDCARDS = ("0.0.0.0", "::", "")
#: What ``shoal server --backend`` takes (``ray`` with ``--ray-address`` for any cluster).
_SERVER_BACKENDS = ("local", "ray")


def check_public_url(url: str) -> str:
    """*url* (``--public-url`` / ``SHOAL_SERVER_PUBLIC_URL``) without its trailing slash, or a
    ``ConfigError`` naming what is wrong with it."""
    from urllib.parse import urlsplit

    parts = urlsplit(url.strip())
    problem = None
    if parts.scheme not in ("http", "https"):
        problem = "it does not start with http:// or https://"
    elif not parts.hostname:
        problem = "it names no host"
    elif parts.hostname in _WILDCARDS or parts.hostname == "[::]":
        problem = f"{parts.hostname} is a wildcard bind address, which no one can connect to"
    elif parts.query or parts.fragment:
        problem = "it has a query or fragment"
    elif parts.path.rstrip("/").endswith("/api/v1"):
        problem = "it ends with /api/v1, which clients add themselves"
    else:
        try:
            parts.port  # noqa: B018 - a port out of range raises here
        except ValueError as e:
            problem = f"its port is {str(e)[0].lower()}{str(e)[1:]}"
    if problem:
        raise ConfigError(
            f"the server's public URL {url!r} cannot be used: {problem}. Give the URL jobs' "
            "supervisors reach this server at, such as http://10.0.0.5:8765 (--public-url or "
            "SHOAL_SERVER_PUBLIC_URL)", setting="SHOAL_SERVER_PUBLIC_URL", value=url)
    return url.strip().rstrip("/")


def serve_settings(*, backend: str | None, ray_address: str | None,
                   public_url: str | None) -> dict[str, Any]:
    """The session settings ``shoal server``'s ``--backend``, ``--ray-address`` and
    ``--public-url`` give (a flag beats its ``SHOAL_*`` setting), checked."""
    from shoal.config import Settings

    out: dict[str, Any] = {}
    if backend is not None:
        if backend not in _SERVER_BACKENDS:
            raise InvalidArgumentError(
                f"--backend {backend!r} is not one of {', '.join(_SERVER_BACKENDS)} (for a "
                "Ray Client address: --backend ray --ray-address ray://host:10001)",
                argument="backend")
        out["backend"] = backend
    if ray_address is not None:
        chosen = backend or Settings().backend
        if chosen.startswith("ray://"):
            raise InvalidArgumentError(
                f"--ray-address {ray_address!r} and SHOAL_BACKEND={chosen} both name a "
                "cluster: pass --backend ray with --ray-address, or drop --ray-address",
                argument="ray_address")
        if chosen != "ray":
            raise InvalidArgumentError(
                f"--ray-address {ray_address!r} is for the ray backend, but jobs would run on "
                f"{chosen!r}: add --backend ray", argument="ray_address")
        out["ray_address"] = ray_address
    if public_url is not None:
        out["server_public_url"] = check_public_url(public_url)
    return out


def supervisor_url(host: str, port: int, *, public_url: str | None, backend: str) -> str:
    """The URL the supervisors of jobs on *backend* reach this server at.

    The public URL when one is given; else the bound address, except that a wildcard bind
    (``0.0.0.0``, ``::``) is ``127.0.0.1`` on the local backend (its supervisors run on this
    host) and refused on Ray: the nodes of a cluster need one address that reaches this host
    from theirs, and this host may have several (or none that a name lookup gives right), so
    it is not guessed."""
    if public_url:
        return check_public_url(public_url)
    if host in _WILDCARDS:
        if backend == "local":
            return f"http://127.0.0.1:{port}"
        raise ConfigError(
            f"serving on {host or '0.0.0.0'!r} with the {backend!r} backend needs a public "
            "URL: the jobs' supervisors run on the cluster's nodes and must reach this server "
            "at an address of this host that those nodes can connect to, which a wildcard "
            f"bind does not name. Pass --public-url http://<this host's address>:{port} (or "
            "set SHOAL_SERVER_PUBLIC_URL), or bind that address with --host",
            host=host, backend=backend)
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


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
    """The uvicorn configuration ``serve`` runs: the app over the session's stores, its jobs
    on the session's backend (``SHOAL_BACKEND``), their supervisors told the server's
    ``supervisor_url``."""
    check_bind(host, auth=auth)
    own = supervisor_url(host, port, public_url=session.settings.server_public_url,
                         backend=session.settings.backend)
    from shoal._internal.extras import require

    require("server", "the team server (shoal server)", "fastapi", "uvicorn", "jinja2")
    import uvicorn

    from shoal.server._endpoint_runtime import ServerEndpoints
    from shoal.server._launches import ServerJobs
    from shoal.server._signals import NotifyingJobStore, Signals
    from shoal.server.app import create_app

    # Its stores answer at once, without waiting out an outage: a request that finds the
    # database away is a 503 naming it (server/app.py), so no server thread sits out the
    # outage; clients wait for the store themselves (their SHOAL_STORE_OUTAGE_SECONDS).
    store = _at_once(session.metadata)
    if auth and not is_loopback(host):
        logger.warning("serving on %s over plain HTTP: tokens travel unencrypted; put a TLS "
                       "proxy in front for a network you do not trust", host)
    signals = Signals()
    server_jobs = ServerJobs(session, own, signals)
    jobs = NotifyingJobStore(store, signals)
    from shoal.console import server_console

    app = create_app(store, store if auth else None, jobs=jobs,
                     endpoints=store, artifacts=_at_once(session.artifacts),
                     upload_dir=session.home / "uploads",
                     max_upload_bytes=session.settings.server_max_upload_bytes,
                     server_jobs=server_jobs,
                     server_endpoints=ServerEndpoints(
                         session, store, url=own, tokens=server_jobs.tokens), users=store,
                     console=server_console(session, jobs, store if auth else None),
                     max_invocation_bytes=session.settings.server_max_invocation_bytes)
    # One process, no websockets (no route needs them: their protocol module is then never
    # imported). One process also keeps TCP_NODELAY on accepted sockets: asyncio and uvloop
    # set it on the sockets of the server they create, while the sockets of uvicorn's
    # --workers lose it (uvicorn issue 3149; tests/integration/test_server_sockets.py).
    return uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                          lifespan="off", ws="none", interface="asgi3")


def _at_once(store: S) -> S:
    """*store* without the session's outage wrapper (``storage/outage.py``)."""
    from shoal.storage.outage import OutageTolerant

    inner: S = store.inner if isinstance(store, OutageTolerant) else store
    return inner


def serve(session: Session, *, host: str, port: int, auth: bool) -> None:
    """Serve ``/api/v1`` over the session's stores until interrupted."""
    config = server_config(session, host=host, port=port, auth=auth)
    import uvicorn

    logger.info("shoal server on http://%s:%d/api/v1 (auth: %s; jobs on %s, their "
                "supervisors reach it at %s)", host, port, "tokens" if auth else "none",
                session.settings.backend,
                supervisor_url(host, port, public_url=session.settings.server_public_url,
                               backend=session.settings.backend))
    uvicorn.Server(config).run()
