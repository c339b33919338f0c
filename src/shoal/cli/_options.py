"""The options every ``shoal`` command takes (``--home``, ``-v``, ``--version``): one
callback that both the whole command tree and ``shoal server``'s own tree register."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated

import typer

from shoal.cli._context import EXIT_CODES_HELP, state

__all__ = ["global_options", "root_app"]


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


def global_options(
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


def root_app() -> typer.Typer:
    """The ``shoal`` command with its global options, before its sub-commands are added."""
    app = typer.Typer(
        name="shoal",
        help="shoal: run notebook code as tracked jobs, SageMaker-shaped, on this machine.\n\n"
             + EXIT_CODES_HELP,
        no_args_is_help=True,
        add_completion=True,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
    )
    app.callback()(global_options)
    return app
