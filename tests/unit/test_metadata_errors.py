"""A metadata database that cannot be used says why, naming the file, and what to do.

Every case is a real SQLite file in a real condition: damaged bytes, a revision this code
does not know, a read-only open (``mode=ro``: the tests run as root, whom chmod does not
stop), a read-only file system and a full one (tiny tmpfs mounts, skipped where mounting is
not allowed).
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import remount_read_only, small_tmpfs
from shoal.core.jobs import JobName, JobSpec
from shoal.errors import MetadataStoreError, SchemaOutOfDateError
from shoal.storage.sql import SCHEMA_REVISION, SqlMetadataStore, upgrade_schema

CLI = [sys.executable, "-m", "shoal.cli"]


def _new_db(path: Path) -> str:
    url = f"sqlite:///{path}"
    SqlMetadataStore.open(url, create=True).close()
    return url


def _spec(name: str, blob: int = 0) -> JobSpec:
    return JobSpec(name=JobName(name), tags=(("blob", "x" * blob),) if blob else ())


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    return subprocess.run([*CLI, "--home", str(home), *args], capture_output=True, text=True,
                          timeout=60, env=env, stdin=subprocess.DEVNULL)


def test_a_damaged_file_is_named_as_not_a_database_with_what_to_do(tmp_path: Path) -> None:
    db = tmp_path / "shoal.db"
    db.write_bytes(b"this is not sqlite at all, just some bytes " * 50)
    with pytest.raises(MetadataStoreError) as info:
        SqlMetadataStore.open(f"sqlite:///{db}", create=True)
    text = str(info.value)
    assert f"{db} is not a valid SQLite database" in text
    assert "file is not a database" in text and f"mv {db} {db}.broken" in text
    assert info.value.details["sqlite_error"] == "SQLITE_NOTADB"
    # The command line says the same, on one line, and no "internal error: DatabaseError".
    proc = _cli(tmp_path, "jobs", "list")
    assert proc.returncode == 6, proc.stderr
    assert "not a valid SQLite database" in proc.stderr and str(db) in proc.stderr
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr


def test_a_database_from_a_newer_shoal_says_so_and_db_upgrade_does_not_crash(
        tmp_path: Path) -> None:
    db = tmp_path / "shoal.db"
    url = _new_db(db)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0999'")
    for attempt in (lambda: SqlMetadataStore.open(url), lambda: upgrade_schema(url)):
        with pytest.raises(SchemaOutOfDateError) as info:
            attempt()
        text = str(info.value)
        assert "written by a newer shoal" in text and "revision 0999" in text
        assert f"up to {SCHEMA_REVISION}" in text and "Upgrade shoal" in text
        assert "run 'shoal db upgrade" not in text
    for args in (("jobs", "list"), ("db", "upgrade")):
        proc = _cli(tmp_path, *args)
        assert proc.returncode == 4, proc.stderr
        assert "written by a newer shoal" in proc.stderr and "revision 0999" in proc.stderr
        assert "Can't locate revision" not in proc.stderr and "Traceback" not in proc.stderr
    # An older database is still told to upgrade, and the upgrade works.
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0002'")
        conn.execute("DROP TABLE metric_spans")  # undo 0009 (its columns go with 0008's table)
        conn.execute("DROP TABLE metric_blocks")  # undo 0008
        conn.execute("DROP TABLE metric_series")
        for table in ("jobs", "experiments", "runs", "endpoints"):  # undo 0007
            conn.execute(f"ALTER TABLE {table} DROP COLUMN owner")
        conn.execute("DROP TABLE api_tokens")  # undo 0006
        conn.execute("DROP TABLE users")
        conn.execute("DROP TABLE job_payloads")  # undo 0005
        conn.execute("DROP TABLE endpoint_instances")
        conn.execute("DROP TABLE endpoints")
        conn.execute("ALTER TABLE jobs RENAME COLUMN key_salt TO secret")  # undo 0004
    with pytest.raises(SchemaOutOfDateError, match="run 'shoal db upgrade"):
        SqlMetadataStore.open(url)
    assert upgrade_schema(url) == SCHEMA_REVISION


def test_a_read_only_database_names_the_file_and_says_it_is_read_only(tmp_path: Path) -> None:
    db = tmp_path / "shoal.db"
    _new_db(db)
    store = SqlMetadataStore.open(f"sqlite:///file:{db}?mode=ro&uri=true")
    try:
        assert store.find_job("j1") is None  # reading works
        with pytest.raises(MetadataStoreError) as info:
            store.create_job(_spec("j1"), key_salt="s", backend="local")
    finally:
        store.close()
    text = str(info.value)
    assert f"cannot write to the metadata database {db}" in text
    assert "read-only for this process" in text and "attempt to write a readonly" in text
    assert "createdb" not in text and "server runs" not in text


def test_a_read_only_file_system_is_named(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "ro", size="4m") as mount:
        url = _new_db(mount / "shoal.db")
        remount_read_only(mount)
        with pytest.raises(MetadataStoreError) as info:
            SqlMetadataStore.open(url)
    text = str(info.value)
    assert f"{mount / 'shoal.db'}" in text and "read-only file system" in text
    assert "createdb" not in text


def test_a_full_disk_is_named_as_full(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "full", size="1m") as mount:
        url = _new_db(mount / "shoal.db")
        store = SqlMetadataStore.open(url)
        try:
            with pytest.raises(OSError):  # fill what is left
                (mount / "filler").write_bytes(b"x" * 2**21)
            with pytest.raises(MetadataStoreError) as info:
                store.create_job(_spec("big", blob=300_000), key_salt="s", backend="local")
        finally:
            store.close()
    text = str(info.value)
    assert str(mount / "shoal.db") in text and "the disk holding it is full" in text
    assert "MiB free" in text and "createdb" not in text
