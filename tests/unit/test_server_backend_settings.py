"""Where a team server runs its jobs and the URL their supervisors reach it at: ``shoal
server --backend/--ray-address/--public-url`` over the ``SHOAL_*`` settings, the wildcard-bind
rule, the Ray backend's refusal of a loopback server URL for nodes on other hosts, and what of
the server's own environment a supervisor never gets."""

from __future__ import annotations

import pytest

import shoal
from shoal.backends.ray import check_server_reachable, check_shared_stores
from shoal.errors import ConfigError, InvalidArgumentError
from shoal.server.admin import check_public_url, serve_settings, supervisor_url


def test_flags_beat_the_environment_and_are_checked(monkeypatch):
    monkeypatch.setenv("SHOAL_BACKEND", "local")
    monkeypatch.setenv("SHOAL_RAY_ADDRESS", "10.0.0.1:6379")
    assert serve_settings(backend=None, ray_address=None, public_url=None) == {}
    given = serve_settings(backend="ray", ray_address="10.0.0.2:6379",
                           public_url="http://10.0.0.9:8765/")
    assert given == {"backend": "ray", "ray_address": "10.0.0.2:6379",
                     "server_public_url": "http://10.0.0.9:8765"}
    s = shoal.Session(**given)
    assert (s.settings.backend, s.settings.ray_address) == ("ray", "10.0.0.2:6379")
    with pytest.raises(InvalidArgumentError, match="--backend 'slurm' is not one of local, ray"):
        serve_settings(backend="slurm", ray_address=None, public_url=None)
    # --ray-address means nothing to the local backend (here: SHOAL_BACKEND's)
    with pytest.raises(InvalidArgumentError, match="add --backend ray"):
        serve_settings(backend=None, ray_address="10.0.0.2:6379", public_url=None)
    monkeypatch.setenv("SHOAL_BACKEND", "ray")
    assert serve_settings(backend=None, ray_address="h:1", public_url=None) == {
        "ray_address": "h:1"}
    monkeypatch.setenv("SHOAL_BACKEND", "ray://head:10001")
    with pytest.raises(InvalidArgumentError, match="both name a cluster"):
        serve_settings(backend=None, ray_address="h:1", public_url=None)


@pytest.mark.parametrize(("url", "why"), [
    ("10.0.0.5:8765", "does not start with http:// or https://"),
    ("http://", "names no host"),
    ("http://0.0.0.0:8765", "wildcard bind address"),
    ("http://10.0.0.5:8765/api/v1", "ends with /api/v1"),
    ("http://10.0.0.5:8765/?x=1", "query or fragment"),
    ("http://10.0.0.5:99999", "out of range"),
])
def test_a_public_url_that_cannot_work_is_refused_saying_why(url, why):
    with pytest.raises(ConfigError, match="SHOAL_SERVER_PUBLIC_URL") as info:
        check_public_url(url)
    assert why in str(info.value) and repr(url) in str(info.value)


def test_the_supervisors_url_is_the_public_one_else_the_bound_address():
    public = "https://shoal.example.com/team/"
    for backend in ("local", "ray"):
        assert supervisor_url("0.0.0.0", 8765, public_url=public, backend=backend) \
            == "https://shoal.example.com/team"
        assert supervisor_url("10.1.2.3", 9000, public_url=None, backend=backend) \
            == "http://10.1.2.3:9000"
    assert supervisor_url("::1", 8765, public_url=None, backend="ray") == "http://[::1]:8765"
    # a wildcard bind: the local backend's supervisors run on this host...
    assert supervisor_url("0.0.0.0", 8765, public_url=None, backend="local") \
        == "http://127.0.0.1:8765"
    # ...a cluster's nodes need an address of this host that is not guessed
    for backend in ("ray", "ray://head:10001"):
        with pytest.raises(ConfigError, match="needs a public URL") as info:
            supervisor_url("0.0.0.0", 8765, public_url=None, backend=backend)
        assert "--public-url http://<this host's address>:8765" in str(info.value)


def test_a_loopback_server_url_is_refused_for_nodes_on_other_hosts():
    server = {"SHOAL_SERVER_URL": "http://127.0.0.1:8765"}  # no store settings: all-HTTP
    check_shared_stores(server, 2, ["127.0.0.1", "127.0.0.1"])  # every node on this host
    check_server_reachable("http://localhost:8765", ["127.0.0.1", ""])
    # this host's own address (a node started here): its supervisors reach 127.0.0.1
    here = {"192.0.2.2"}.__contains__
    check_server_reachable("http://127.0.0.1:8765", ["192.0.2.2", "127.0.0.1"],
                           on_this_host=here)
    with pytest.raises(ConfigError, match="nodes at 10.0.0.7, whose") as info:
        check_server_reachable("http://127.0.0.1:8765", ["192.0.2.2", "10.0.0.7"],
                               on_this_host=here)
    assert "--public-url" in str(info.value) and "http://127.0.0.1:8765" in str(info.value)
    check_shared_stores({"SHOAL_SERVER_URL": "http://10.0.0.1:8765"}, 3,
                        ["10.0.0.1", "10.0.0.7", "10.0.0.8"])
    with pytest.raises(ConfigError, match="SHOAL_METADATA_URL"):  # no server: stores checked
        check_shared_stores({}, 2, ["127.0.0.1", "127.0.0.1"])


def test_a_supervisor_gets_none_of_the_servers_credentials(tmp_path, monkeypatch):
    from shoal.server._launches import ServerJobs
    from shoal.server._signals import Signals

    for name, value in (("RAY_AUTH_MODE", "token"), ("RAY_AUTH_TOKEN_PATH", "/srv/ray/token"),
                        ("AWS_SECRET_ACCESS_KEY", "s3cret"), ("AWS_ACCESS_KEY_ID", "AKIA"),
                        ("DB_PASSWORD", "hunter22"), ("TEAM_LABEL", "blue")):
        monkeypatch.setenv(name, value)
    # ServerJobs opens the server's metadata store (its job grants read records): the home's
    # SQLite database here, whose URL the supervisor must not get either
    session = shoal.Session(home=str(tmp_path), artifact_url="s3://bucket/root", backend="ray")
    jobs = ServerJobs(session, "http://10.0.0.1:8765", Signals())
    env = jobs.job_env({"SHOAL_JOB_SECRETS": "{}", "SHOAL_METADATA_URL": "sqlite:///x",
                        "AWS_SESSION_TOKEN": "t"}, "shoalj_x.y")
    assert not {k for k in env if k.startswith(("RAY_AUTH", "AWS_"))}
    assert "DB_PASSWORD" not in env and "SHOAL_METADATA_URL" not in env
    assert "SHOAL_ARTIFACT_URL" not in env and "SHOAL_BACKEND" not in env
    assert env["TEAM_LABEL"] == "blue"  # the rest of the server's environment stays
    assert env["SHOAL_SERVER_URL"] == "http://10.0.0.1:8765" and env["SHOAL_TOKEN"] == "shoalj_x.y"
    assert env["SHOAL_JOB_SECRETS"] == "{}" and env["SHOAL_HOME"] == str(tmp_path)
