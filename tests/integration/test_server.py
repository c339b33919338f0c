"""The team server (``shoal server``) as a client meets it: a real server process on
127.0.0.1, real HTTP, tokens made by the CLI on the server's host. The RunStore contract runs
through it in tests/contract/test_run_store.py; these are the refusals and the wiring."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from helpers import wait_until
from shoal.client import HttpRunStore, ServerConnection
from shoal.core import MetricPoint
from shoal.errors import ApiError, AuthenticationError, ConfigError, PermissionDeniedError


def _token(server: Any, user: str, name: str, *extra: str) -> str:
    made = server.cli("tokens", "create", "--user", user, "--name", name, "--create-user",
                      *extra)
    assert made.returncode == 0, made.stderr
    return str(made.stdout.strip())


def test_version_is_open_and_the_openapi_document_lists_the_run_routes(shoal_server):
    with httpx.Client(base_url=shoal_server.url) as client:
        version = client.get("/api/v1/version").json()
        spec = client.get("/api/v1/openapi.json").json()
    assert version["service"] == "shoal" and version["api_version"] == 1 and version["auth"]
    assert {"/api/v1/experiments/{experiment}/runs/{run}", "/api/v1/metrics"} <= set(
        spec["paths"])


def test_missing_wrong_revoked_and_expired_tokens_are_401(shoal_server):
    for token, says in ((None, "needs an API token"), ("shoal_not-a-real-token", "not known")):
        store = HttpRunStore.open(shoal_server.url, token)
        with pytest.raises(AuthenticationError, match=says):
            store.list_experiments()
        store.close()
    revoked = _token(shoal_server, "carol", "soon-revoked", "--scope", "write")
    store = HttpRunStore.open(shoal_server.url, revoked)
    store.ensure_experiment("before-revoke")  # it works until it is revoked
    listed = shoal_server.cli("tokens", "list", "--user", "carol").stdout
    [token_id] = [line.split()[0] for line in listed.splitlines() if "soon-revoked" in line]
    assert shoal_server.cli("tokens", "revoke", token_id).returncode == 0
    assert "revoked" in shoal_server.cli("tokens", "list", "--user", "carol").stdout

    def refused() -> bool:
        try:
            store.list_experiments()
        except AuthenticationError as e:
            return "'soon-revoked' of user 'carol' was revoked" in str(e)
        return False

    # The server trusts a token's record it read for TOKEN_CACHE_SECONDS (1 s), no longer.
    wait_until(refused, 30, what="the revoked token to be refused")
    store.close()
    expired = _token(shoal_server, "carol", "expired", "--expires-days", "0")
    with HttpRunStore.open(shoal_server.url, expired) as store:
        with pytest.raises(AuthenticationError, match="'expired' of user 'carol' expired at"):
            store.list_experiments()
    with httpx.Client(base_url=shoal_server.url) as client:
        assert client.get("/api/v1/experiments").status_code == 401


def test_a_read_token_reads_and_its_write_is_403_naming_the_action(shoal_server):
    admin = HttpRunStore.open(shoal_server.url, shoal_server.admin_token)
    admin.ensure_experiment("read-only-exp")
    reader = HttpRunStore.open(shoal_server.url, _token(shoal_server, "dave", "reader"))
    try:
        assert reader.get_experiment("read-only-exp").name == "read-only-exp"
        with pytest.raises(PermissionDeniedError, match="scope read; create_run") as info:
            reader.create_run("read-only-exp", "r")
        assert info.value.details["needs"] == "write"
        assert admin.list_runs("read-only-exp") == []  # nothing was written
    finally:
        reader.close()
        admin.close()


def test_server_init_twice_and_an_admin_token_for_a_non_admin_are_refused(shoal_server):
    again = shoal_server.cli("server", "init")
    assert again.returncode != 0 and "already initialised" in again.stderr
    bad = shoal_server.cli("tokens", "create", "--user", "erin", "--name", "x",
                           "--create-user", "--scope", "admin")
    assert bad.returncode != 0 and "not an admin" in bad.stderr


def test_a_non_loopback_bind_without_auth_is_refused_saying_why(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "shoal.cli", "--home", str(tmp_path),
                           "server", "--host", "0.0.0.0", "--no-auth"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 4, proc.stderr
    assert "refusing to serve on '0.0.0.0' without authentication" in proc.stderr
    assert not (tmp_path / "shoal.db").exists()  # refused before it opened anything


def test_a_wildcard_bind_on_ray_without_a_public_url_is_refused_saying_why(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    proc = subprocess.run([sys.executable, "-m", "shoal.cli", "--home", str(tmp_path),
                           "server", "--host", "0.0.0.0", "--backend", "ray",
                           "--ray-address", "127.0.0.1:1"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 4, proc.stderr
    assert "with the 'ray' backend needs a public URL" in proc.stderr
    assert "--public-url http://<this host's address>:8765" in proc.stderr
    assert not (tmp_path / "shoal.db").exists()  # refused before it opened anything
    bad = subprocess.run([sys.executable, "-m", "shoal.cli", "--home", str(tmp_path),
                          "server", "--ray-address", "127.0.0.1:1"], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "add --backend ray" in bad.stderr, bad.stderr


class _Fake(BaseHTTPRequestHandler):
    body: bytes = b"<html>hello</html>"
    content_type = "text/html"
    #: (method, path) -> statuses to answer in turn (the last one repeats); requests seen.
    script: dict[tuple[str, str], list[int]] = {}
    seen: list[tuple[str, str]] = []

    def _answer(self) -> None:
        key = (self.command, self.path.split("?")[0])
        self.seen.append(key)
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        statuses = self.script.get(key)
        status = (statuses.pop(0) if len(statuses) > 1 else statuses[0]) if statuses else 200
        body = self.body if key[1].endswith("/version") or not statuses else (
            b"[]" if status == 200 else b"busy")
        self.send_response(status)
        self.send_header("Content-Type", self.content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again: nothing listens there


@pytest.fixture
def other_server() -> Iterator[tuple[str, type[_Fake]]]:
    """A real HTTP server on 127.0.0.1 that is not a shoal server (its answer settable)."""
    handler = type("Handler", (_Fake,), {"script": {}, "seen": []})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_url_that_is_not_a_shoal_server_and_another_api_version_are_named(other_server):
    url, handler = other_server
    nothing = f"http://127.0.0.1:{_closed_port()}"
    with HttpRunStore(ServerConnection(nothing, "t", backoff=0.01)) as store:
        with pytest.raises(ApiError, match=f"cannot reach the shoal server at {nothing}"):
            store.list_experiments()
    with HttpRunStore.open(url, "t") as store:
        with pytest.raises(ApiError, match=f"{url} is not a shoal server"):
            store.list_experiments()
    handler.body = json.dumps({"service": "shoal", "api_version": 2,
                               "shoal_version": "9.0"}).encode()
    handler.content_type = "application/json"
    with HttpRunStore.open(url, "t") as store:
        with pytest.raises(ApiError, match="speaks API version 2, this client 1"):
            store.list_experiments()


def test_a_session_with_a_server_url_logs_runs_through_it_and_refuses_the_whole_store(
        shoal_server, monkeypatch):
    from shoal import Session
    from shoal.experiments import Run, load_run

    monkeypatch.setenv("SHOAL_SERVER_URL", shoal_server.url)
    monkeypatch.setenv("SHOAL_TOKEN", _token(shoal_server, "frank", "laptop", "--scope",
                                             "write"))
    session = Session()
    try:
        with Run("team-exp", "run-1", sagemaker_session=session) as run:
            run.log_parameter("lr", 0.1)
            run.log_metric("loss", 0.5, step=1)
            run.log_metric("loss", 0.25, step=2)
        with load_run(experiment_name="team-exp", run_name="run-1",
                      sagemaker_session=session) as again:
            again.log_parameter("epochs", 3)
        # Jobs and artifacts go through the server too (tests/integration/test_server_jobs.py);
        # the whole metadata store (users, tokens, 'shoal db') stays on the server's host.
        with pytest.raises(ConfigError, match="SHOAL_SERVER_URL is set") as info:
            _ = session.metadata
        assert "the whole metadata store" in str(info.value)
        assert "not available yet" in str(info.value)
    finally:
        session.close()
    cli = subprocess.run([sys.executable, "-m", "shoal.cli", "experiments", "runs", "team-exp"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert cli.returncode == 0 and "run-1" in cli.stdout, cli.stderr  # the CLI reads it too
    shown = subprocess.run([sys.executable, "-m", "shoal.cli", "config", "show", "--json"],
                           capture_output=True, text=True, timeout=60, check=False)
    assert shown.returncode == 0 and os.environ["SHOAL_TOKEN"] not in shown.stdout
    assert '"**********"' in shown.stdout  # the token setting is there, masked
    with HttpRunStore.open(shoal_server.url, shoal_server.admin_token) as admin:
        record = admin.get_run("team-exp", "run-1")
        assert dict(record.parameters) == {"lr": 0.1, "epochs": 3}
        assert [p.value for p in admin.get_metrics(record.metrics_owner, "loss")] == [0.5, 0.25]
        assert record.status.value == "Completed"


def test_only_idempotent_requests_are_retried_on_a_busy_server(other_server):
    url, handler = other_server
    handler.body = json.dumps({"service": "shoal", "api_version": 1}).encode()
    handler.content_type = "application/json"
    handler.script = {("GET", "/api/v1/experiments"): [503, 502, 200],
                      ("POST", "/api/v1/metrics"): [503]}
    with HttpRunStore.open(url, "t") as store:
        assert store.list_experiments() == []  # a GET: retried until it succeeded
        with pytest.raises(ApiError, match="answered 503"):
            store.add_metrics("job:j", [MetricPoint("m", 1.0, 1.0)])
    assert handler.seen.count(("GET", "/api/v1/experiments")) == 3
    assert handler.seen.count(("POST", "/api/v1/metrics")) == 1  # a POST: sent once
