"""What every ``shoal`` command does when this shell uses a team server (``SHOAL_SERVER_URL``
or ``shoal login``): each command is in exactly one table below, and
``tests/e2e/test_cli_through_server.py`` walks the command tree so a new command cannot be
left out.

- ``THROUGH_SERVER``: its work goes through the server (the server's stores and host).
- ``ON_THIS_MACHINE``: it is about this machine only (settings, the alias, a local Ray
  cluster, a model served in the foreground, the login itself) and works the same.
- ``REFUSED``: it makes no sense remotely; :func:`refuse_through_server` says why and what to
  run instead.
"""

from __future__ import annotations

from shoal.cli._context import state

__all__ = ["ON_THIS_MACHINE", "REFUSED", "THROUGH_SERVER", "refuse_through_server"]

THROUGH_SERVER = frozenset({
    "gc", "jobs list", "jobs describe", "jobs metrics", "jobs logs", "jobs cancel",
    "jobs submit", "jobs delete", "experiments list", "experiments runs", "runs show",
    "llm finetune", "workers list", "workers stop", "tokens create", "tokens list",
    "tokens revoke", "users create", "users list", "whoami", "endpoints list",
    "endpoints describe", "endpoints invoke", "endpoints delete",
})
ON_THIS_MACHINE = frozenset({
    "serve", "config show", "bundle build", "bundle verify", "ray up", "ray down",
    "alias install", "alias uninstall", "alias status", "login", "logout",
})
_OWN = ("Run it on the server's host, where SHOAL_SERVER_URL is not set (and no 'shoal login' "
        "is current: 'shoal logout'), or unset it here to work on this machine's own stores")
REFUSED: dict[str, str] = {
    "ui": "'shoal ui' serves this machine's own stores; the team server serves its own web "
          "console: open <server URL>/console and log in with your token",
    "demo": "'shoal demo' runs its examples on this machine's own stores and backend. Unset "
            "SHOAL_SERVER_URL ('shoal logout' for a login) to run it here",
    "db upgrade": "the team server's database is upgraded on the server's host, by whoever "
                  "runs the server: 'shoal db upgrade' there (or give this command the "
                  "database URL itself)",
    "envs list": "jobs through a team server build their environments on the server's host, "
                 f"in its cache. {_OWN}",
    "envs prune": "jobs through a team server build their environments on the server's "
                  f"host, in its cache. {_OWN}",
    "server": "'shoal server' serves this host's own stores and is no client of another "
              "server. Start it where SHOAL_SERVER_URL is not set",
    "server init": "'shoal server init' creates the first admin in this host's own store. "
                   "Run it on the server's host without SHOAL_SERVER_URL; from here an admin "
                   "adds users with 'shoal users create' and tokens with 'shoal tokens "
                   "create'",
}


def refuse_through_server(command: str, *, env_only: bool = False) -> None:
    """A ConfigError saying why *command* (a key of ``REFUSED``) does not run through a team
    server, when this shell uses one (*env_only*: only one set by ``SHOAL_SERVER_URL``, for
    the server's own commands, which never use a stored login)."""
    from shoal.errors import ConfigError

    if env_only:
        from shoal.config import shoal_environ

        url = shoal_environ().get("SHOAL_SERVER_URL")
    else:
        url = state.session().settings.server_url
    if url is not None:
        raise ConfigError(f"this shell uses the team server {url} (SHOAL_SERVER_URL or "
                          f"'shoal login'): {REFUSED[command]}", command=command,
                          setting="SHOAL_SERVER_URL", value=url)
