"""SHOAL_HOME is its user's alone: 0700, its files 0600, under umask 022 too; an existing home
open to others is reported once (issue #15, item 3)."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

import shoal
from shoal import RemoteExecutor, remote


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def open_to_others(home: Path) -> list[str]:
    """Everything under *home* that a group or other user could read, write or enter; the
    environment caches (installed packages, shoal's in-job modules: nothing secret) aside."""
    found = []
    for root, dirs, files in os.walk(home):
        rel = Path(root).relative_to(home)
        if rel.parts and rel.parts[0] in ("envs", "runtime"):
            continue
        for name in dirs + files:
            path = Path(root) / name
            if not path.is_symlink() and mode(path) & 0o077:
                found.append(f"{path.relative_to(home)} {mode(path):03o}")
    return found


def test_a_new_home_and_everything_shoal_writes_in_it_are_private(tmp_path, umask_022):
    s = shoal.Session(home=str(tmp_path / "home"), launcher_idle_seconds=60)
    shared = tmp_path / "shared"
    shared.mkdir()
    try:
        @remote(sagemaker_session=s)
        def write_elsewhere(data):
            import os

            print("a line for the log")
            path = os.path.join(str(shared), "made-by-the-job.txt")
            with open(path, "w") as f:
                f.write(data)
            return oct(os.stat(path).st_mode & 0o777)

        # A job's own files keep the client's umask: only shoal's files are made private.
        assert write_elsewhere("x" * 1000) == "0o644"
        with RemoteExecutor(sagemaker_session=s, keep_alive_period_in_seconds=30) as e:
            assert e.submit(pow, 2, 10).result(timeout=120) == 1024
        home = s.home
        assert mode(home) == 0o700
        for db in ("shoal.db", "shoal.db-wal", "shoal.db-shm"):
            assert mode(home / db) == 0o600, db
        assert any((home / "artifacts").rglob("payload.pkl"))
        assert (home / "run" / "launcher.log").exists()
        left = open_to_others(home)
        assert left == [], "\n".join(left)
    finally:
        s.backend.shutdown_launcher()
        s.close()


def test_an_existing_home_open_to_others_is_reported_once_naming_it(tmp_path, caplog):
    home = tmp_path / "wide-home"
    home.mkdir()
    os.chmod(home, 0o755)
    with caplog.at_level(logging.WARNING, logger="shoal"):
        for _ in range(2):  # two sessions of one process: one warning
            s = shoal.Session(home=str(home))
            s.metadata  # noqa: B018 - opening the store is what looks at the home
            s.close()
    warnings = [r.getMessage() for r in caplog.records if "SHOAL_HOME" in r.getMessage()]
    assert len(warnings) == 1
    assert str(home) in warnings[0] and "755" in warnings[0] and "chmod 700" in warnings[0]
    assert mode(home) == 0o755  # the user's choice is reported, not overridden
    assert mode(home / "shoal.db") == 0o600


def test_a_first_upload_data_on_a_new_home_creates_it_private(tmp_path, umask_022, caplog):
    """A notebook whose first call is ``Session().upload_data`` (SageMaker's usual preamble)
    must not let the upload create the home 0755 on its way to home/artifacts/..."""
    home = tmp_path / "fresh-home"
    data = tmp_path / "train.csv"
    data.write_text("1,2\n")
    with caplog.at_level(logging.WARNING):
        uri = shoal.Session(home=str(home)).upload_data(str(data), key_prefix="demo/train")
    assert uri.endswith("demo/train/train.csv")
    assert mode(home) == 0o700
    assert open_to_others(home) == []
    assert not [r for r in caplog.records if "is mode" in r.getMessage()]
