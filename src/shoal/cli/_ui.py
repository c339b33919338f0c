"""``shoal ui``: the web console over this machine's stores (as ``mlflow ui``)."""

from __future__ import annotations

from typing import Annotated

import typer

from shoal.cli._context import err, state

__all__ = ["ui"]


def ui(
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8766,
    host: Annotated[str, typer.Option(
        help="Loopback address to bind (there is no login).")] = "127.0.0.1",
) -> None:
    """Serve the web console (jobs, logs, experiments, charts) on loopback, no login."""
    from shoal._internal.extras import require
    from shoal.cli._remote import refuse_through_server

    refuse_through_server("ui")  # before anything opens

    require("server", "the web console (shoal ui)", "fastapi", "uvicorn", "jinja2")
    import uvicorn

    from shoal.console import ui_config

    config = ui_config(state.session(), host=host, port=port)
    err().print(f"shoal ui: http://{host}:{port}/ ; Ctrl-C stops it")
    uvicorn.Server(config).run()
