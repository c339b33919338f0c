"""``shoal server`` (serve the team API), ``shoal server init`` and ``shoal tokens``: run on
the server's host, on its store (its ``SHOAL_HOME`` / ``SHOAL_METADATA_URL``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

import typer

from shoal.cli._context import err, out, state

__all__ = ["server_app", "tokens_app"]

server_app = typer.Typer(help="The team server (preview): an HTTP API over this host's stores.",
                         invoke_without_command=True, rich_markup_mode=None)
tokens_app = typer.Typer(help="API tokens of the team server (run on the server's host).",
                         no_args_is_help=True, rich_markup_mode=None)


@server_app.callback()
def server(
    ctx: typer.Context,
    host: Annotated[str, typer.Option(help="Address to bind; a non-loopback one needs auth.")]
        = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8765,
    no_auth: Annotated[bool, typer.Option(
        "--no-auth", help="Serve without tokens (loopback addresses only).")] = False,
) -> None:
    """Serve /api/v1 (experiments, runs, metrics) over this host's stores."""
    if ctx.invoked_subcommand is not None:
        return
    from shoal.server.admin import check_bind, serve

    check_bind(host, auth=not no_auth)
    # A plain line, not rich's console: rich is not imported to start a server.
    typer.echo(f"shoal server: http://{host}:{port}/api/v1 "
               f"(auth: {'none' if no_auth else 'tokens'}); Ctrl-C stops it", err=True)
    serve(state.session(), host=host, port=port, auth=not no_auth)


@server_app.command()
def init(
    user: Annotated[str, typer.Option(help="Name of the first admin.")] = "admin",
) -> None:
    """Create the first admin and print its token (shown once)."""
    from shoal.server.admin import init_admin

    made = init_admin(state.session().metadata, user)
    err().print(f"admin {user!r} created; its token (shown once, keep it safe):")
    out().print(made.token, soft_wrap=True, highlight=False)


@tokens_app.command("create")
def create(
    user: Annotated[str, typer.Option(help="The token's user.")],
    name: Annotated[str, typer.Option(help="A name for the token (unique per user).")],
    scope: Annotated[str, typer.Option(help="read, write or admin.")] = "read",
    expires_days: Annotated[float | None, typer.Option(
        min=0.0, help="Days until it expires; default: never.")] = None,
    create_user: Annotated[bool, typer.Option(help="Create the user if it is new.")] = False,
) -> None:
    """Make a token and print it (shown once)."""
    from shoal.core.auth import Scope
    from shoal.errors import InvalidArgumentError
    from shoal.server.admin import create_token

    try:
        level = Scope(scope)
    except ValueError:
        raise InvalidArgumentError(f"--scope {scope!r} is not one of read, write, admin",
                                   argument="scope") from None
    store = state.session().metadata
    if create_user and store.find_user(user) is None:
        store.create_user(user)
    made = create_token(store, user, name, scope=level, expires_in=None if expires_days is None
                        else timedelta(days=expires_days))
    err().print(f"token {name!r} of {user!r} (id {made.record.id}, scope {level.value}); "
                "shown once:")
    out().print(made.token, soft_wrap=True, highlight=False)


@tokens_app.command("list")
def list_(user: Annotated[str | None, typer.Option(help="Only this user's tokens.")] = None,
          ) -> None:
    """List tokens (never the tokens themselves)."""
    for t in state.session().metadata.list_tokens(user):
        state_ = "revoked" if t.revoked_at else (
            f"expires {t.expires_at:%Y-%m-%d %H:%M}" if t.expires_at else "no expiry")
        out().print(f"{t.id}  {t.user}  {t.name}  {t.scope.value}  {state_}", highlight=False)


@tokens_app.command()
def revoke(token_id: Annotated[str, typer.Argument(help="The id 'tokens list' shows.")]) -> None:
    """Revoke a token: the server refuses it from the next request on."""
    token = state.session().metadata.revoke_token(token_id)
    out().print(f"revoked token {token.name!r} of {token.user!r} ({token.id})")
