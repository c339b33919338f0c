"""``shoal ui``: the console alone over a session's stores, on loopback, with no login (as
``mlflow ui``); and the console ``shoal server`` mounts, over the server's stores."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from fastapi import FastAPI

from shoal.console._app import create_console
from shoal.core.ports import AuthStore, JobStore
from shoal.session import Session

if TYPE_CHECKING:
    import uvicorn

__all__ = ["server_console", "ui_app", "ui_config"]


def ui_app(session: Session) -> FastAPI:
    """The console over *session*'s jobs, runs and artifacts (the embedded default, or a team
    server's through its HTTP clients when ``SHOAL_SERVER_URL`` is set), without login."""
    service = session.jobs
    # Environments are the job host's: through a team server, the server's (not read here).
    local = session.settings.server_url is None
    # A fresh secret per process: without login the cookie only carries the CSRF token.
    return create_console(jobs=service.metadata, runs=session.runs,
                          artifacts=session.artifacts, cancel=service.cancel, auth=None,
                          secret=os.urandom(32), endpoints=session.endpoint_store,
                          environments=session.env_builder.list if local else None)


def ui_config(session: Session, *, host: str, port: int) -> uvicorn.Config:
    """The uvicorn configuration ``shoal ui`` runs; a host that is not loopback is refused
    (there is no login)."""
    from shoal.errors import ConfigError

    if not _is_loopback(host):
        raise ConfigError(
            f"shoal ui serves without login, so only on a loopback address, not {host!r}; "
            "for a team, run 'shoal server' (its console at /console signs in with tokens)",
            host=host)
    import uvicorn

    return uvicorn.Config(ui_app(session), host=host, port=port, log_level="warning",
                          access_log=False, lifespan="off", ws="none", interface="asgi3")


def server_console(session: Session, jobs: JobStore, auth: AuthStore | None) -> FastAPI:
    """The console ``shoal server`` mounts: over the server's *jobs* store (the one whose
    writes wake waiters), its runs and artifacts; *auth* None for ``--no-auth``. Sessions are
    signed with ``<server home>/server/console-secret`` (0600, made on first use), so they
    survive a restart; deleting the file signs everyone out."""
    from shoal.jobs.keys import load_user_secret

    secret = load_user_secret(session.home / "server" / "console-secret")
    return create_console(jobs=jobs, runs=session.runs, artifacts=session.artifacts,
                          cancel=session.jobs.cancel, auth=auth, secret=secret,
                          endpoints=session.endpoint_store,
                          environments=session.env_builder.list)


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
