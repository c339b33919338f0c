"""Disk per job: a trivial job's payloads are rows of the metadata store, not files, and it
leaves no work directory or empty log behind (issue #17, item 7). Results and exceptions
round-trip from there, tampering is still refused, large payloads and jobs stored in the old
layout are still read from their files."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from helpers import flip_stored_byte, wait_until
from shoal import remote
from shoal.core import JobQuery
from shoal.errors import PayloadIntegrityError
from shoal.jobs._payloads import INLINE_MAX_BYTES, payload_files
from shoal.remote_function import get_future

#: The issue's target: at most 4 KiB on disk per trivial job, everything counted.
TARGET_BYTES = 4096


def add(a, b):
    return a + b


class Unlucky(ValueError):
    pass


def unlucky(n):
    raise Unlucky(f"unlucky {n}")


def home_usage(home: Path) -> dict[str, int]:
    """Disk blocks (``du -s``), apparent bytes (``du --apparent-size``), files and
    directories under *home*, the database's write-ahead log folded into its file first."""
    with sqlite3.connect(home / "shoal.db") as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    usage = {"blocks": 0, "apparent": 0, "files": 0, "dirs": 0}
    for root, dirs, files in os.walk(home):
        for name in dirs + files:
            st = os.lstat(os.path.join(root, name))
            usage["blocks"] += st.st_blocks * 512
            usage["apparent"] += st.st_size
            usage["files" if name in files else "dirs"] += 1
    return usage


def supervisors_gone(session, names: list[str]) -> bool:
    pids = [session.jobs.get(n).handle.get("pid") for n in names]
    return not any(pid and os.path.exists(f"/proc/{pid}") for pid in pids)


def jobs_named(session, prefix: str) -> list[str]:
    return [r.name for r in session.metadata.list_jobs(JobQuery(name_prefix=prefix,
                                                                limit=1000))]


def test_a_trivial_job_leaves_no_file_and_under_4_kib_on_disk(session):
    """20 cold trivial jobs after a warm-up one: no file or directory more in the home (no
    payload files, no work directory, no empty supervisor log) and, the database's growth
    included, at most 4 KiB of disk blocks per job (before: 7 files, 5 directories, ~46 KiB)."""
    home = session.home
    warm = remote(add, job_name_prefix="warm-up")
    assert warm(1, 1) == 2
    wait_until(lambda: supervisors_gone(session, jobs_named(session, "warm-up")), 60,
               what="the warm-up job's supervisor exited")
    before = home_usage(home)
    n = 20
    f = remote(add, job_name_prefix="trivial")
    assert [f(i, 1) for i in range(n)] == [i + 1 for i in range(n)]
    names = jobs_named(session, "trivial")
    assert len(names) == n
    wait_until(lambda: supervisors_gone(session, names), 60, what="the supervisors exited")
    after = home_usage(home)
    assert after["files"] == before["files"] and after["dirs"] == before["dirs"], (before, after)
    for name in names:
        assert not (home / "artifacts" / name).exists()
        assert not (home / "work" / f"{name}.1").exists()
        assert not (home / "run" / "supervisors" / f"{name}.log").exists()
        assert 0 < session.metadata.job_payload_bytes(name) < TARGET_BYTES
    grown = after["blocks"] - before["blocks"]
    print(f"per job: {grown / n:.0f} bytes of blocks, "
          f"{(after['apparent'] - before['apparent']) / n:.0f} apparent")
    assert 0 < grown <= n * TARGET_BYTES, f"{grown / n:.0f} bytes per job"
    assert after["apparent"] - before["apparent"] <= n * TARGET_BYTES


def test_a_result_round_trips_from_the_database(session):
    value = {"sum": 3, "text": "é" * 100, "items": list(range(50))}
    assert remote(lambda: value, job_name_prefix="dict-result")() == value
    [name] = jobs_named(session, "dict-result")
    for kind in ("function", "arguments", "results"):
        assert session.metadata.get_job_payload(name, kind) is not None, kind
    assert session.artifacts.list_keys(name) == []
    assert get_future(name, session).result() == value  # read back later, by name


def test_an_exception_round_trips_from_the_database_and_tampering_is_refused(session):
    with pytest.raises(Unlucky, match="unlucky 13") as info:
        remote(unlucky, job_name_prefix="unlucky")(13)
    assert any("Remote traceback" in note for note in info.value.__notes__)
    [name] = jobs_named(session, "unlucky")
    assert session.metadata.get_job_payload(name, "exception") is not None
    assert session.metadata.get_job_payload(name, "results") is None
    assert session.artifacts.list_keys(name) == [f"{name}/logs/output.log"]  # the traceback
    with pytest.raises(Unlucky, match="unlucky 13"):
        get_future(name, session).result()
    assert flip_stored_byte(session, name, "exception") == "database"
    with pytest.raises(PayloadIntegrityError, match="HMAC"):
        get_future(name, session).result()


def test_a_large_result_is_stored_in_the_artifact_layout_and_checked(session):
    size = 4 * INLINE_MAX_BYTES
    assert remote(lambda n: b"x" * n, job_name_prefix="large")(size) == b"x" * size
    [name] = jobs_named(session, "large")
    assert session.metadata.get_job_payload(name, "results") is None
    assert all(session.artifacts.exists(k) for k in payload_files(name, "results"))
    assert session.metadata.get_job_payload(name, "arguments") is not None  # small: inline
    assert get_future(name, session).result() == b"x" * size
    assert flip_stored_byte(session, name, "results") == "file"
    with pytest.raises(PayloadIntegrityError, match="HMAC"):
        get_future(name, session).result()


def test_a_job_stored_in_the_old_layout_runs_and_its_result_is_read(session):
    """Payloads written as files only (as before revision 0005): the supervisor reads them,
    and a result kept as files is read by the client."""
    from shoal.remote_function import RemoteOptions
    from shoal.serialization import serialize
    from shoal.serialization.keys import new_salt, payload_key

    spec = RemoteOptions().build_spec(add, session)
    svc = session.jobs
    salt = new_salt()
    key = payload_key(svc.keys.secret(spec.name, salt))
    record = session.metadata.create_job(spec, key_salt=salt, backend="local")
    for kind, obj in (("function", add), ("arguments", ((20, 22), {}))):
        payload = serialize(obj, key, what=kind)
        data_key, meta_key = payload_files(spec.name, kind)
        session.artifacts.put_bytes(data_key, payload.data)
        session.artifacts.put_bytes(meta_key, payload.metadata)
    svc.launch(record)
    final = svc.wait(record.name, timeout=120)
    assert svc.outcome(final) == 42
    # The result as an existing job has it: files, no row.
    data, meta = session.metadata.get_job_payload(record.name, "results")
    data_key, meta_key = payload_files(record.name, "results")
    session.artifacts.put_bytes(data_key, data)
    session.artifacts.put_bytes(meta_key, meta)
    with sqlite3.connect(session.home / "shoal.db") as conn:
        conn.execute("DELETE FROM job_payloads WHERE job_name = ?", (record.name,))
    assert session.metadata.get_job_payload(record.name, "results") is None
    assert get_future(record.name, session).result() == 42


def test_a_warm_worker_takes_its_payloads_from_the_database(session):
    f = remote(add, keep_alive_period_in_seconds=30, job_name_prefix="warm")
    assert [f(i, 10) for i in range(3)] == [10, 11, 12]
    names = jobs_named(session, "warm")
    assert len(names) == 3
    for name in names:
        assert session.metadata.get_job_payload(name, "results") is not None
        assert session.artifacts.list_keys(name) == []
    assert sorted(get_future(n, session).result() for n in names) == [10, 11, 12]
