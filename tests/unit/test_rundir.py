"""The fallback socket directory must be this user's own, closed to others."""

from __future__ import annotations

import os

import pytest

from shoal.backends.rundir import private_socket_dir
from shoal.errors import BackendError


def test_private_socket_dir_is_created_closed(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    path = private_socket_dir()
    assert path == tmp_path / "shoal" and (os.stat(path).st_mode & 0o777) == 0o700


def test_a_directory_others_can_write_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    (tmp_path / "shoal").mkdir(mode=0o777)
    os.chmod(tmp_path / "shoal", 0o777)
    with pytest.raises(BackendError, match="not a private directory"):
        private_socket_dir()


def test_a_symlink_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "shoal").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(BackendError):
        private_socket_dir()
