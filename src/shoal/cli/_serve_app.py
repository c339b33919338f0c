"""``shoal server``'s own command tree: the global options and the ``server`` sub-app, the
same objects the whole tree (``shoal.cli._app``) registers, so help and behaviour match."""

from __future__ import annotations

import typer

from shoal.cli import _server
from shoal.cli._context import EXIT_CODES_HELP
from shoal.cli._options import global_options

__all__ = ["app"]

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
app.add_typer(_server.server_app, name="server")
