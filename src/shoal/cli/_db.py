"""``shoal db upgrade``: bring a metadata database to the schema this code expects."""

from __future__ import annotations

from typing import Annotated

import typer

from shoal.cli._context import out, state

__all__ = ["app"]

app = typer.Typer(help="Manage the metadata database.", no_args_is_help=True,
                  rich_markup_mode=None)


@app.command()
def upgrade(
    url: Annotated[str | None, typer.Argument(
        help="Database URL (sqlite:///PATH or postgresql://USER@HOST/DB); default: the "
             "configured metadata URL (SHOAL_METADATA_URL, else sqlite under the home).")] = None,
) -> None:
    """Create or migrate the shoal schema in a database (safe to run again)."""
    from shoal.storage.sql import redact_url, upgrade_schema

    if url is None:
        from shoal.cli._remote import refuse_through_server
        from shoal.config import Settings

        refuse_through_server("db upgrade")
        url = Settings(**state.session_kwargs()).resolved_metadata_url()
    revision = upgrade_schema(url)
    out().print(f"metadata database {redact_url(url)} is at schema revision {revision}")
