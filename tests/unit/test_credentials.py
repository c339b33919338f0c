"""The credentials file of ``shoal login`` (``shoal._internal.credentials``) and how settings
pick its current login: private, atomic, several servers, one current, env first."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from shoal._internal.credentials import (
    Login,
    normalise_url,
    read_credentials,
    remove_login,
    save_login,
)
from shoal.config import Settings
from shoal.errors import ConfigError


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "xdg-config" / "shoal" / "credentials"


def test_a_saved_login_is_0600_in_a_0700_directory_and_read_back(path):
    save_login(path, Login("http://a:8765", "shoal_aaa", "ann"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    found = read_credentials(path)
    login = found.current_login()
    assert login is not None and (login.url, login.token, login.user) == (
        "http://a:8765", "shoal_aaa", "ann")
    assert login.saved_at  # stamped when saved
    assert "shoal_aaa" not in repr(login)  # the token is never in a repr
    assert [p.name for p in path.parent.iterdir()] == ["credentials"]  # no temporary left


def test_a_umask_that_opens_files_still_writes_0600(path):
    old = os.umask(0)
    try:
        save_login(path, Login("http://a", "t", "u"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_several_servers_are_kept_and_the_last_login_is_current(path):
    save_login(path, Login("http://a", "ta", "ann"))
    save_login(path, Login("http://b", "tb", "bob"))
    save_login(path, Login("http://a", "ta2", "ann"))  # again: replaces a's, current again
    found = read_credentials(path)
    assert sorted(found.servers) == ["http://a", "http://b"]
    assert found.current == "http://a" and found.servers["http://a"].token == "ta2"


def test_logging_out_of_the_current_server_leaves_none_current_and_the_others_stored(path):
    save_login(path, Login("http://a", "ta", "ann"))
    save_login(path, Login("http://b", "tb", "bob"))
    gone = remove_login(path)
    assert gone is not None and gone.url == "http://b"
    found = read_credentials(path)
    assert found.current is None and found.current_login() is None
    assert list(found.servers) == ["http://a"]
    assert remove_login(path, "http://nowhere") is None
    assert remove_login(path, "http://a/api/v1/") is not None  # the same server
    assert not path.exists()  # nothing left: no file


def test_urls_are_keyed_without_slash_or_the_api_prefix():
    assert normalise_url(" http://h:1/ ") == "http://h:1"
    assert normalise_url("https://h/api/v1") == "https://h"
    assert normalise_url("https://h/team/api/v1/") == "https://h/team"


def test_a_file_others_may_read_is_refused_naming_it_and_the_fix(path):
    save_login(path, Login("http://a", "t", "u"))
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="may be read by other users") as info:
        read_credentials(path)
    assert str(path) in str(info.value) and f"chmod 600 {path}" in str(info.value)
    assert info.value.details["mode"] == "0644"


@pytest.mark.skipif(os.getuid() != 0, reason="giving a file to another user needs root")
def test_a_file_of_another_user_is_refused(path):
    save_login(path, Login("http://a", "t", "u"))
    os.chown(path, 54321, -1)
    with pytest.raises(ConfigError, match="belongs to another user"):
        read_credentials(path)


@pytest.mark.parametrize(("content", "says"), [
    (b"not json", "not JSON"),
    (b'{"version": 2, "servers": {}}', "not a version-1"),
    (b'{"version": 1, "servers": [], "current": null}', "'servers' must be an object"),
    (b'{"version": 1, "servers": {"http://a": {"user": "u"}}, "current": null}',
     "needs a 'token' and a 'user'"),
    (b'{"version": 1, "servers": {}, "current": "http://a"}', "has no entry"),
    (b"\xff\xfe", "not JSON"),
])
def test_content_that_is_not_a_credentials_document_is_refused_naming_the_file(
        path, content, says):
    path.parent.mkdir(parents=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, content)
    os.close(fd)
    with pytest.raises(ConfigError, match=says) as info:
        read_credentials(path)
    assert str(path) in str(info.value) and "shoal login URL" in str(info.value)


def test_a_missing_file_is_no_login(path):
    assert read_credentials(path).current_login() is None


def _login_at_default(url: str = "http://team:8765") -> Path:
    path = Settings(server_url=None).credentials_path()
    save_login(path, Login(url, "shoal_secret", "ann"))
    return path


def test_settings_use_the_current_login_when_nothing_names_the_stores(monkeypatch):
    path = _login_at_default()
    settings = Settings()
    assert settings.server_url == "http://team:8765"
    assert settings.token is not None and settings.token.get_secret_value() == "shoal_secret"
    assert settings.sources()["server_url"] == f"login {path}"
    assert settings.sources()["token"] == f"login {path}"


def test_the_environment_and_own_stores_win_over_the_login(monkeypatch, tmp_path):
    _login_at_default()
    monkeypatch.setenv("SHOAL_SERVER_URL", "http://other:1")
    monkeypatch.setenv("SHOAL_TOKEN", "shoal_env")
    settings = Settings()
    assert settings.server_url == "http://other:1"
    assert settings.token is not None and settings.token.get_secret_value() == "shoal_env"
    assert settings.sources()["server_url"] == "env SHOAL_SERVER_URL"
    monkeypatch.delenv("SHOAL_SERVER_URL")
    settings = Settings()  # the login's URL, the environment's token
    assert settings.server_url == "http://team:8765"
    assert settings.token is not None and settings.token.get_secret_value() == "shoal_env"
    monkeypatch.delenv("SHOAL_TOKEN")
    # a session of its own stores (every embedded supervisor's) or the server's own: no login
    monkeypatch.setenv("SHOAL_METADATA_URL", f"sqlite:///{tmp_path / 'x.db'}")
    assert Settings().server_url is None
    monkeypatch.delenv("SHOAL_METADATA_URL")
    assert Settings(artifact_url=f"file://{tmp_path}").server_url is None
    assert Settings(server_url=None).server_url is None


def test_a_session_with_a_bad_credentials_file_is_a_config_error_naming_it():
    import shoal

    path = _login_at_default()
    path.write_text(json.dumps({"version": 1}))  # no servers
    with pytest.raises(ConfigError, match="credentials file") as info:
        shoal.Session()
    assert str(path) in str(info.value)
