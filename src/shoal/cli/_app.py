"""The whole ``shoal`` command tree, built on import; ``shoal.cli.main`` imports it for every
command but ``shoal server`` (which needs only the server's sub-app, see ``shoal.cli``).

The ``shoal`` command: find, inspect, follow and stop jobs; show configuration; upgrade
the database; run the demo.

Example::

    $ shoal jobs list --status failed --since 2h
    $ shoal jobs describe divide-241130-120000-ab12cd
    $ shoal jobs logs divide-241130-120000-ab12cd -f

Errors print one red line (the traceback with ``-v``) and exit with a documented status
(``ExitCode``). Heavy modules are imported inside the commands, so ``shoal --help`` is fast.
"""

from __future__ import annotations

from shoal.cli import (
    _alias,
    _bundle,
    _config,
    _db,
    _endpoints,
    _envs,
    _experiments,
    _jobs,
    _jobs_admin,
    _llm,
    _login,
    _ray,
    _server,
    _ui,
    _workers,
)
from shoal.cli._options import root_app

__all__ = ["app"]

app = root_app()
app.add_typer(_jobs.app, name="jobs")
app.add_typer(_config.app, name="config")
app.add_typer(_db.app, name="db")
app.add_typer(_envs.app, name="envs")
app.add_typer(_bundle.app, name="bundle")
app.add_typer(_experiments.experiments_app, name="experiments")
app.add_typer(_experiments.runs_app, name="runs")
app.add_typer(_endpoints.app, name="endpoints")
app.add_typer(_llm.app, name="llm")
app.add_typer(_ray.app, name="ray")
app.add_typer(_alias.app, name="alias")
app.add_typer(_workers.app, name="workers")
app.add_typer(_server.server_app, name="server")
app.add_typer(_server.tokens_app, name="tokens")
app.add_typer(_server.users_app, name="users")
_endpoints.register_serve(app)
_jobs.app.command("submit", context_settings=_jobs_admin.SUBMIT_CONTEXT)(_jobs_admin.submit)
_jobs.app.command("delete")(_jobs_admin.delete)
app.command("gc")(_jobs_admin.gc)
app.command("login")(_login.login)
app.command("logout")(_login.logout)
app.command("whoami")(_login.whoami)
app.command("ui")(_ui.ui)


@app.command()
def demo() -> None:
    """Run the seed examples as real jobs and show how to find each one again."""
    from shoal._internal.extras import needs_extra
    from shoal.cli._remote import refuse_through_server

    refuse_through_server("demo")
    with needs_extra("all", "shoal demo"):  # it shows every feature
        from shoal.cli._demo import run_demo

        run_demo()
