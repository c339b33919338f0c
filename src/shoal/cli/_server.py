"""``shoal server`` (serve the team API) and ``shoal server init``, run on the server's host
on its store (its ``SHOAL_HOME`` / ``SHOAL_METADATA_URL``); ``shoal tokens`` and ``shoal
users``: through the team server when one is set (``SHOAL_SERVER_URL`` or ``shoal login``, an
admin's token), else on this host's store directly."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Annotated

import typer

from shoal.cli._context import err, out, state
from shoal.cli._remote import refuse_through_server

if TYPE_CHECKING:
    from shoal.client import HttpUserAdmin
    from shoal.core.auth import ApiToken, Scope, User

__all__ = ["server_app", "tokens_app", "users_app"]

server_app = typer.Typer(help="The team server (preview): an HTTP API over this host's stores.",
                         invoke_without_command=True, rich_markup_mode=None)
tokens_app = typer.Typer(help="API tokens of the team server (through it when one is set, as "
                         "an admin; else on this host's store).",
                         no_args_is_help=True, rich_markup_mode=None)
users_app = typer.Typer(help="Users of the team server (through it when one is set, as an "
                        "admin; else on this host's store).",
                        no_args_is_help=True, rich_markup_mode=None)


@server_app.callback()
def server(
    ctx: typer.Context,
    host: Annotated[str, typer.Option(help="Address to bind; a non-loopback one needs auth.")]
        = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8765,
    no_auth: Annotated[bool, typer.Option(
        "--no-auth", help="Serve without tokens (loopback addresses only).")] = False,
    backend: Annotated[str | None, typer.Option(
        help="Where jobs submitted through the server run: local (this host) or ray (a "
             "cluster). Default: SHOAL_BACKEND, else local.")] = None,
    ray_address: Annotated[str | None, typer.Option(
        help="With --backend ray: the cluster (host:6379, ray://host:10001, auto). Default: "
             "SHOAL_RAY_ADDRESS, else auto.")] = None,
    public_url: Annotated[str | None, typer.Option(
        help="The URL jobs' supervisors reach this server at (needed on Ray when binding "
             "0.0.0.0). Default: SHOAL_SERVER_PUBLIC_URL, else the bound address.")] = None,
) -> None:
    """Serve /api/v1 (experiments, runs, metrics, jobs) over this host's stores; jobs run on
    the server's backend."""
    if ctx.invoked_subcommand is not None:
        return
    from shoal.server.admin import check_bind, serve, serve_settings, supervisor_url

    check_bind(host, auth=not no_auth)
    refuse_through_server("server", env_only=True)
    session = state.session(direct=True, **serve_settings(backend=backend,
                                                          ray_address=ray_address,
                                                          public_url=public_url))
    settings = session.settings
    url = supervisor_url(host, port, public_url=settings.server_public_url,
                         backend=settings.backend)
    where = "this host" if settings.backend == "local" else \
        f"Ray at {settings.ray_address if settings.backend == 'ray' else settings.backend}"
    # A plain line, not rich's console: rich is not imported to start a server.
    typer.echo(f"shoal server: http://{host}:{port}/api/v1 "
               f"(auth: {'none' if no_auth else 'tokens'}); jobs run on {where}, their "
               f"supervisors reach it at {url}; Ctrl-C stops it", err=True)
    serve(session, host=host, port=port, auth=not no_auth)


@server_app.command()
def init(
    user: Annotated[str, typer.Option(help="Name of the first admin.")] = "admin",
) -> None:
    """Create the first admin and print its token (shown once)."""
    from shoal.server.admin import init_admin

    refuse_through_server("server init", env_only=True)
    made = init_admin(state.session(direct=True).metadata, user)
    err().print(f"admin {user!r} created; its token (shown once, keep it safe):")
    out().print(made.token, soft_wrap=True, highlight=False)


def _remote() -> HttpUserAdmin | None:
    """The team server's user admin when this shell uses one, else None (this host's
    store)."""
    session = state.session()
    if session.settings.server_url is None:
        return None
    from shoal.client import HttpUserAdmin

    return HttpUserAdmin(session.server_connection())


def _scope(scope: str) -> Scope:
    from shoal.core.auth import Scope
    from shoal.errors import InvalidArgumentError

    try:
        return Scope(scope)
    except ValueError:
        raise InvalidArgumentError(f"--scope {scope!r} is not one of read, write, admin",
                                   argument="scope") from None


def _token_json(t: ApiToken) -> dict[str, object]:
    from shoal.cli._render import iso

    return {"id": t.id, "user": t.user, "name": t.name, "scope": t.scope.value,
            "created_at": iso(t.created_at), "expires_at": iso(t.expires_at),
            "revoked_at": iso(t.revoked_at)}


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
    from shoal.server.admin import create_token

    level = _scope(scope)
    expires = None if expires_days is None else timedelta(days=expires_days)
    remote = _remote()
    if remote is not None:
        token, record = remote.create_token(user, name, scope=level, expires_in=expires,
                                            create_user=create_user)
    else:
        store = state.session().metadata
        if create_user and store.find_user(user) is None:
            store.create_user(user)
        made = create_token(store, user, name, scope=level, expires_in=expires)
        token, record = made.token, made.record
    err().print(f"token {name!r} of {user!r} (id {record.id}, scope {level.value}); "
                "shown once:")
    out().print(token, soft_wrap=True, highlight=False)


@tokens_app.command("list")
def list_(user: Annotated[str | None, typer.Option(help="Only this user's tokens.")] = None,
          as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
          ) -> None:
    """List tokens (never the tokens themselves)."""
    from shoal.cli._render import print_json

    remote = _remote()
    tokens = remote.list_tokens(user) if remote is not None else \
        state.session().metadata.list_tokens(user)
    if as_json:
        print_json([_token_json(t) for t in tokens])
        return
    for t in tokens:
        state_ = "revoked" if t.revoked_at else (
            f"expires {t.expires_at:%Y-%m-%d %H:%M}" if t.expires_at else "no expiry")
        out().print(f"{t.id}  {t.user}  {t.name}  {t.scope.value}  {state_}", highlight=False)


@tokens_app.command()
def revoke(token_id: Annotated[str, typer.Argument(help="The id 'tokens list' shows.")]) -> None:
    """Revoke a token: the server refuses it from the next request on."""
    remote = _remote()
    token = remote.revoke_token(token_id) if remote is not None else \
        state.session().metadata.revoke_token(token_id)
    out().print(f"revoked token {token.name!r} of {token.user!r} ({token.id})")


@users_app.command("create")
def create_user_(
    name: Annotated[str, typer.Argument(help="The new user's name.")],
    admin: Annotated[bool, typer.Option("--admin", help="Make the user an admin.")] = False,
) -> None:
    """Add a user (then give them a token with 'shoal tokens create --user NAME')."""
    remote = _remote()
    made = remote.create_user(name, is_admin=admin) if remote is not None else \
        state.session().metadata.create_user(name, is_admin=admin)
    out().print(f"user {made.name!r} created{' (admin)' if made.is_admin else ''}; make "
                f"its token with 'shoal tokens create --user {made.name} --name NAME'",
                highlight=False)


@users_app.command("list")
def list_users(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
               ) -> None:
    """List the server's users."""
    from shoal.cli._render import format_time, iso, print_json

    remote = _remote()
    users: list[User] = remote.list_users() if remote is not None else \
        state.session().metadata.list_users()
    if as_json:
        print_json([{"name": u.name, "is_admin": u.is_admin,
                     "created_at": iso(u.created_at)} for u in users])
        return
    for u in users:
        out().print(f"{u.name}  {'admin' if u.is_admin else 'user'}  "
                    f"{format_time(u.created_at)}", highlight=False)
