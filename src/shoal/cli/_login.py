"""``shoal login URL``, ``shoal logout [URL]`` and ``shoal whoami``: a team server's token kept
in the credentials file (``shoal._internal.credentials``), which sessions then use."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from shoal.cli._context import err, out, state
from shoal.cli._render import print_json

__all__ = ["login", "logout", "whoami"]


def _credentials_path() -> Path:
    from shoal.config import Settings

    # server_url=None: the path alone, without reading (and judging) the file's login
    return Settings(server_url=None, **state.session_kwargs()).credentials_path()


def _read_token(url: str, given: str | None) -> str:
    """--token, else a line on stdin (piped), else the token stored for *url* (switching
    back to a server logged in to before), else a prompt (a terminal)."""
    from shoal._internal.credentials import read_credentials

    token = given
    if token is None and not sys.stdin.isatty():
        token = sys.stdin.readline().strip() or None
    if token is None:
        stored = read_credentials(_credentials_path()).servers.get(url)
        if stored is not None:
            return stored.token
    if token is None and sys.stdin.isatty():
        import getpass

        token = getpass.getpass(f"API token for {url} (not shown): ")
    token = (token or "").strip()
    if not token:
        from shoal.errors import InvalidArgumentError

        raise InvalidArgumentError(
            f"no API token given for {url} and none stored for it: pass --token, pipe it on "
            "stdin, or type it at the prompt (an admin makes one with 'shoal tokens create')",
            argument="token")
    return token


def _whoami(url: str, token: str) -> dict[str, str]:
    """The server's ``GET /api/v1/whoami`` for *token*, after its version check: an
    ApiError for a URL that is not a shoal server of this API version, an
    AuthenticationError for a wrong, revoked or expired token."""
    from shoal.client import ServerConnection
    from shoal.errors import ServerUnreachableError

    # Retried for ~13 s (0.1 s x 2^n, 7 times): a server started a moment ago (in the
    # background of the same script) is given time to answer; a wrong URL fails after that.
    try:
        with ServerConnection(url, token, timeout=15.0, retries=7, backoff=0.1) as connection:
            answer = connection.call("GET", "/whoami")
    except ServerUnreachableError as e:
        cause = e.__cause__
        raise ServerUnreachableError(
            f"cannot reach a shoal server at {url} for 13 s ({type(cause).__name__}: "
            f"{cause}); check the URL (the one 'shoal server' printed on its host) and that "
            "it runs", url=url) from e
    return {k: str(v) for k, v in answer.items()}


def login(
    url: Annotated[str, typer.Argument(help="The server, e.g. http://shoal.example:8765.")],
    token: Annotated[str | None, typer.Option(
        help="The API token (default: read from stdin when piped, else the token stored for "
             "URL, else asked for without echo).")] = None,
) -> None:
    """Check URL is a shoal server and the token works, then store the login (0600) and make
    it the current one: sessions use it when SHOAL_SERVER_URL is not set."""
    from shoal._internal.credentials import Login, normalise_url, save_login
    from shoal.config import shoal_environ

    url = normalise_url(url)
    secret = _read_token(url, token)
    who = _whoami(url, secret)  # raises, writing nothing, unless the server accepts it
    path = _credentials_path()
    save_login(path, Login(url, secret, who["user"]))
    out().print(f"logged in to {url} as {who['user']!r} (token {who['token']!r}, scope "
                f"{who['scope']}); login stored in {path}", highlight=False)
    env_url = shoal_environ().get("SHOAL_SERVER_URL")
    if env_url is not None and normalise_url(env_url) != url:
        err().print(f"note: SHOAL_SERVER_URL is set ({env_url}) and wins over this login "
                    "in this shell; unset it to use the login", highlight=False)


def logout(
    url: Annotated[str | None, typer.Argument(
        help="The server to forget (default: the current login).")] = None,
) -> None:
    """Forget a stored login (the token stays valid on the server until revoked)."""
    from shoal._internal.credentials import remove_login

    path = _credentials_path()
    gone = remove_login(path, url)
    if gone is None:
        err().print(f"no login stored for {url or 'the current server'} in {path}; nothing "
                    "to do", highlight=False)
        return
    out().print(f"logged out of {gone.url} (user {gone.user!r}); its token still works until "
                "an admin revokes it ('shoal tokens list', 'shoal tokens revoke ID')",
                highlight=False)


def whoami(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show the server this shell's sessions use and who its token is (or that there is
    none: sessions then use this machine's own stores)."""
    session = state.session()
    settings = session.settings
    source = settings.sources()["server_url"]
    if settings.server_url is None:
        doc: dict[str, str | None] = {"server_url": None, "user": None, "source": None,
                                      "home": str(session.home)}
        if as_json:
            print_json(doc)
            return
        out().print(f"no team server: sessions use this machine's own stores under "
                    f"{session.home} ('shoal login URL' to use one)", highlight=False)
        return
    answer = session.server_connection().call("GET", "/whoami")
    doc = {"server_url": settings.server_url, "user": str(answer["user"]),
           "token": str(answer["token"]), "scope": str(answer["scope"]), "source": source}
    if as_json:
        print_json(doc)
        return
    out().print(f"{doc['user']} at {doc['server_url']} (token {doc['token']!r}, scope "
                f"{doc['scope']}; from {source})", highlight=False)
