"""``shoal server``'s own command tree: the global options and the ``server`` sub-app, the
same objects the whole tree (``shoal.cli._app``) registers, so help and behaviour match."""

from __future__ import annotations

from shoal.cli import _server
from shoal.cli._options import root_app

__all__ = ["app"]

app = root_app()
app.add_typer(_server.server_app, name="server")
