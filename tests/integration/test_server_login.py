"""``shoal login`` / ``logout`` / ``whoami`` and admin work (``shoal users``, ``shoal
tokens``) from a client machine against a real ``shoal server``: the client is a separate
``shoal`` process with a home and config directory of its own, the server's token made by the
CLI on the server's host."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest


class Client:
    """A user's machine: its own SHOAL_HOME and XDG_CONFIG_HOME, no SHOAL_* but *env*."""

    def __init__(self, root: Path, **env: str) -> None:
        self.root = root
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
        self.env.update(SHOAL_HOME=str(root / "home"), XDG_CONFIG_HOME=str(root / "xdg"),
                        OMP_NUM_THREADS="1", **env)
        self.credentials = root / "xdg" / "shoal" / "credentials"

    def cli(self, *args: str, stdin: str | None = None, **env: str
            ) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "shoal.cli", *args],
                              env={**self.env, **env}, input=stdin if stdin is not None else "",
                              capture_output=True, text=True, timeout=120, check=False)

    def ok(self, *args: str, **kwargs: Any) -> str:
        done = self.cli(*args, **kwargs)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout


def _token(server: Any, user: str, name: str, *extra: str) -> str:
    made = server.cli("tokens", "create", "--user", user, "--name", name, "--create-user",
                      *extra)
    assert made.returncode == 0, made.stderr
    return str(made.stdout.strip())


def test_login_checks_the_token_stores_it_privately_and_sessions_use_it(shoal_server,
                                                                        tmp_path):
    client = Client(tmp_path)
    token = _token(shoal_server, "lena", "laptop", "--scope", "write")
    said = client.ok("login", shoal_server.url + "/", stdin=token + "\n")  # token on stdin
    assert f"logged in to {shoal_server.url} as 'lena'" in said
    mode = stat.S_IMODE(client.credentials.stat().st_mode)
    assert mode == 0o600 and stat.S_IMODE(client.credentials.parent.stat().st_mode) == 0o700
    stored = json.loads(client.credentials.read_text())
    assert stored["current"] == shoal_server.url
    assert stored["servers"][shoal_server.url]["user"] == "lena"
    who = json.loads(client.ok("whoami", "--json"))
    assert (who["user"], who["server_url"], who["token"], who["scope"]) == (
        "lena", shoal_server.url, "laptop", "write")
    assert who["source"] == f"login {client.credentials}"
    # A session with no SHOAL_SERVER_URL uses the login: a run logged from a script...
    script = ("from shoal.experiments import Run\n"
              "with Run('login-exp', 'r1') as run:\n    run.log_metric('loss', 0.5, step=1)\n")
    done = subprocess.run([sys.executable, "-c", script], env=client.env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    # ... is on the server (read with the admin's token), owned by the login's user
    from shoal.client import HttpRunStore

    with HttpRunStore.open(shoal_server.url, shoal_server.admin_token) as admin:
        assert admin.get_run("login-exp", "r1").owner == "lena"
    assert not (tmp_path / "home" / "shoal.db").exists()  # nothing in the client's own store
    # SHOAL_SERVER_URL wins over the stored login
    away = client.cli("whoami", SHOAL_SERVER_URL=f"http://127.0.0.1:{_closed_port()}",
                      SHOAL_STORE_OUTAGE_SECONDS="0")
    assert away.returncode != 0 and "cannot reach the shoal server" in away.stderr
    said = client.ok("logout")
    assert f"logged out of {shoal_server.url} (user 'lena')" in said
    assert not client.credentials.exists()
    assert "no team server" in client.ok("whoami")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Other(BaseHTTPRequestHandler):
    body = b"<html>not shoal</html>"

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def other_server() -> Iterator[tuple[str, type[_Other]]]:
    """A real HTTP server on 127.0.0.1 that is not a shoal server (its body settable)."""
    handler = type("Handler", (_Other,), {})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_login_refuses_bad_urls_and_tokens_saying_why_and_writes_nothing(
        shoal_server, other_server, tmp_path):
    client = Client(tmp_path)
    url, handler = other_server
    revoked = _token(shoal_server, "mia", "revoked")
    listed = shoal_server.cli("tokens", "list", "--user", "mia", "--json").stdout
    [token_id] = [t["id"] for t in json.loads(listed) if t["name"] == "revoked"]
    assert shoal_server.cli("tokens", "revoke", token_id).returncode == 0
    expired = _token(shoal_server, "mia", "expired", "--expires-days", "0")
    cases = [
        ((url, "--token", "t"), f"{url} is not a shoal server"),
        ((shoal_server.url, "--token", "shoal_wrong"), "not known to this server"),
        ((shoal_server.url, "--token", revoked), "'revoked' of user 'mia' was revoked"),
        ((shoal_server.url, "--token", expired), "'expired' of user 'mia' expired at"),
        ((shoal_server.url,), "no API token given"),  # stdin empty, nothing stored
    ]
    nowhere = f"http://127.0.0.1:{_closed_port()}"
    cases.append(((nowhere, "--token", "t"), f"cannot reach a shoal server at {nowhere}"))
    for args, says in cases:
        done = client.cli("login", *args)
        assert done.returncode != 0 and says in done.stderr, (args, done.stderr)
        assert not client.credentials.exists(), args  # nothing written
    handler.body = json.dumps({"service": "shoal", "api_version": 99,
                               "shoal_version": "99.0"}).encode()
    done = client.cli("login", url, "--token", "t")
    assert done.returncode != 0 and "speaks API version 99" in done.stderr, done.stderr
    assert not client.credentials.exists()


def test_several_servers_are_stored_and_login_again_switches_back(shoal_server,
                                                                  own_shoal_server, tmp_path):
    client = Client(tmp_path)
    _, second_url, second_home = own_shoal_server("--no-auth")
    first = _token(shoal_server, "noor", "laptop")
    client.ok("login", shoal_server.url, "--token", first)
    client.ok("login", second_url, "--token", "any")  # a --no-auth server: its local admin
    assert json.loads(client.ok("whoami", "--json"))["server_url"] == second_url
    said = client.ok("login", shoal_server.url)  # no token given: the one stored for it
    assert "as 'noor'" in said
    assert json.loads(client.ok("whoami", "--json"))["server_url"] == shoal_server.url
    assert f"logged out of {second_url}" in client.ok("logout", second_url)
    stored = json.loads(client.credentials.read_text())
    assert list(stored["servers"]) == [shoal_server.url]
    assert stored["current"] == shoal_server.url


def test_a_credentials_file_others_may_read_stops_the_client_naming_it(shoal_server,
                                                                       tmp_path):
    client = Client(tmp_path)
    client.ok("login", shoal_server.url, "--token", _token(shoal_server, "omar", "laptop"))
    client.credentials.chmod(0o640)
    done = client.cli("jobs", "list")
    assert done.returncode == 4, done.stderr  # a configuration error
    assert f"the shoal credentials file {client.credentials} may be read by other users" \
        in done.stderr and f"chmod 600 {client.credentials}" in done.stderr


def test_an_admin_manages_users_and_tokens_through_the_server(shoal_server, tmp_path):
    admin = Client(tmp_path / "admin", SHOAL_SERVER_URL=shoal_server.url,
                   SHOAL_TOKEN=shoal_server.admin_token)
    assert "user 'pia' created" in admin.ok("users", "create", "pia")
    users = {u["name"]: u for u in json.loads(admin.ok("users", "list", "--json"))}
    assert users["pia"]["is_admin"] is False and users["admin"]["is_admin"] is True
    token = admin.ok("tokens", "create", "--user", "pia", "--name", "remote-made",
                     "--scope", "write").strip()
    pia = Client(tmp_path / "pia")
    assert "as 'pia'" in pia.ok("login", shoal_server.url, "--token", token)
    listed = json.loads(admin.ok("tokens", "list", "--user", "pia", "--json"))
    [record] = [t for t in listed if t["name"] == "remote-made"]
    assert record["scope"] == "write" and record["revoked_at"] is None
    assert token not in json.dumps(listed)  # never the token itself
    # the server's store holds its hash only
    database = (shoal_server.home / "shoal.db").read_bytes()
    assert token.encode() not in database
    # a non-admin is refused, naming what it needs
    refused = pia.cli("tokens", "create", "--user", "pia", "--name", "more")
    assert refused.returncode != 0 and "needs an admin token" in refused.stderr
    assert "create_api_token" in refused.stderr
    refused = pia.cli("users", "list")
    assert refused.returncode != 0 and "needs an admin token" in refused.stderr
    admin.ok("tokens", "revoke", record["id"])
    again = pia.cli("whoami")
    assert again.returncode != 0 and "'remote-made' of user 'pia' was revoked" in again.stderr
    # on the server's host, without a server URL, the same commands work on its store
    assert "remote-made" in shoal_server.cli("tokens", "list", "--user", "pia").stdout


def test_the_servers_own_commands_never_use_a_stored_login(shoal_server, tmp_path):
    """A server's host where someone logged in: 'shoal server init' (and 'shoal server')
    still work on this host's own store, never through the login's server."""
    host = Client(tmp_path)
    host.ok("login", shoal_server.url, "--token", _token(shoal_server, "quin", "laptop"))
    made = host.ok("server", "init", "--user", "root-admin").strip()
    assert made.startswith("shoal_")
    assert (tmp_path / "home" / "shoal.db").exists()  # the host's own store
    listed = shoal_server.cli("users", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    users = {u["name"] for u in json.loads(listed.stdout)}
    assert "quin" in users and "root-admin" not in users  # not on the logged-in server


def _read_until(fd: int, wanted: bytes, timeout: float) -> bytes:
    """What the terminal *fd* shows until *wanted* appears or the other side closes it,
    within *timeout*."""
    import select
    import time

    seen = b""
    deadline = time.monotonic() + timeout
    while wanted not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"{wanted!r} not shown within {timeout} s; shown: {seen!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the other side closed
            break
        if not chunk:
            break
        seen += chunk
    return seen


def test_login_on_a_terminal_asks_for_the_token_without_echoing_it(shoal_server, tmp_path):
    import pty

    client = Client(tmp_path)
    token = _token(shoal_server, "rita", "terminal")
    main, side = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "shoal.cli", "login", shoal_server.url],
                            env=client.env, stdin=side, stdout=side, stderr=side)
    os.close(side)
    try:
        shown = _read_until(main, b"(not shown): ", 120)
        assert f"API token for {shoal_server.url}".encode() in shown
        os.write(main, token.encode() + b"\n")
        shown += _read_until(main, b"\0", 120)  # all it shows, until it exits
        assert proc.wait(timeout=120) == 0, shown
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        os.close(main)
    said = b" ".join(shown.split())  # the terminal may wrap lines
    assert b"logged in to" in said and b"as 'rita'" in said
    assert token.encode() not in said and token.encode() not in shown  # never echoed
    assert json.loads(client.credentials.read_text())["servers"][shoal_server.url]["user"] \
        == "rita"
