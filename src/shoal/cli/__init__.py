"""The ``shoal`` command: find, inspect, follow and stop jobs; show configuration; upgrade
the database; run the demo.

Example::

    $ shoal jobs list --status failed --since 2h
    $ shoal jobs describe divide-241130-120000-ab12cd
    $ shoal jobs logs divide-241130-120000-ab12cd -f

Errors print one red line (the traceback with ``-v``) and exit with a documented status
(``ExitCode``). Heavy modules are imported inside the commands, so ``shoal --help`` is fast.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

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
    _ray,
    _server,
    _workers,
)
from shoal.cli._context import EXIT_CODES_HELP, ExitCode, err, exit_code_for, state

__all__ = ["app", "main"]

app = typer.Typer(
    name="shoal",
    help="shoal: run notebook code as tracked jobs, SageMaker-shaped, on this machine.\n\n"
         + EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
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
_endpoints.register_serve(app)
_jobs.app.command("submit", context_settings=_jobs_admin.SUBMIT_CONTEXT)(_jobs_admin.submit)
_jobs.app.command("delete")(_jobs_admin.delete)
app.command("gc")(_jobs_admin.gc)


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        import shoal

        try:
            installed = version("shoal")
        except PackageNotFoundError:  # run from a source tree that is not installed
            installed = shoal.__version__
        typer.echo(f"shoal {installed} (Python {sys.version.split()[0]})")
        raise typer.Exit()


@app.callback()
def _global_options(
    home: Annotated[Path | None, typer.Option(
        "--home", help="shoal home directory (overrides SHOAL_HOME; default ~/.shoal).",
        file_okay=False, resolve_path=True)] = None,
    verbose: Annotated[int, typer.Option(
        "--verbose", "-v", count=True,
        help="Log shoal's INFO records (-vv: DEBUG) and show tracebacks of errors.")] = 0,
    version: Annotated[bool, typer.Option(
        "--version", "-V", callback=_print_version, is_eager=True,
        help="Print shoal's version and exit.")] = False,
) -> None:
    state.home = home
    state.verbose = verbose
    from shoal._internal.logconfig import configure

    configure(logging.DEBUG if verbose > 1 else logging.INFO if verbose else logging.WARNING)


@app.command()
def demo() -> None:
    """Run the seed examples as real jobs and show how to find each one again."""
    from shoal._internal.extras import needs_extra

    with needs_extra("all", "shoal demo"):  # it shows every feature
        from shoal.cli._demo import run_demo

        run_demo()


def _report(error: BaseException) -> ExitCode:
    from rich.text import Text

    code = exit_code_for(error)
    if state.verbose:
        import traceback

        err().print(Text("".join(traceback.format_exception(error)).rstrip(), style="dim"))
    message = str(error) or type(error).__name__
    if code == ExitCode.INTERNAL:
        message = (f"internal error: {type(error).__name__}: {message}"
                   + ("" if state.verbose else " (run with -v for the traceback)"))
    err().print(Text(f"error: {message}", style="bold red"))
    return code


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``shoal`` console script."""
    code: int = ExitCode.OK
    try:
        app(args=list(argv) if argv is not None else None, prog_name="shoal")
    except SystemExit as e:  # click's normal way out: 0, 2 for usage, or a command's Exit
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:
        err().print("[red]interrupted[/]")
        code = ExitCode.INTERRUPTED
    except Exception as e:  # every error ends as one line and a documented exit code
        code = _report(e)
    finally:
        state.close()
    sys.exit(code)
