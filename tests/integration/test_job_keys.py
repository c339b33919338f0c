"""Job keys derive from the user's secret: no job can forge another user's result, no key is
stored, and jobs recorded before the change are refused with a clear reason (issue #15.1)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa

import shoal
from shoal import remote
from shoal.errors import PayloadIntegrityError
from shoal.remote_function import get_future


def honest():
    return "honest"


def forge(victim: str) -> dict:
    """The attacker's job: everything a job can read (its environment, the metadata store,
    the artifact store), tried as the victim's key, then the victim's result re-signed with
    the best it has. Reports what it found."""
    import hashlib
    import hmac
    import os
    import re
    from pathlib import Path as P

    import cloudpickle

    db = os.environ["SHOAL_METADATA_URL"].removeprefix("sqlite:///")
    root = P(os.environ["SHOAL_ARTIFACT_URL"].removeprefix("file://"))
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT * FROM jobs").fetchall()
        rows += conn.execute("SELECT * FROM job_payloads").fetchall()
        # The victim's result: a row of the metadata store (a small payload, revision 0005).
        data, raw_meta = conn.execute("SELECT data, metadata FROM job_payloads WHERE "
                                      "job_name = ? AND kind = 'results'", (victim,)).fetchone()
    texts = [v.decode(errors="replace") if isinstance(v, bytes) else str(v)
             for row in rows for v in row]
    texts += list(os.environ.values())
    texts += [p.read_text(errors="replace") for p in root.rglob("*.json")]
    candidates = {c for t in texts for c in re.findall(r"[0-9a-f]{32,128}", t)}
    candidates |= {hmac.new(bytes.fromhex(c), b"shoal/payload-key/v1", hashlib.sha256).hexdigest()
                   for c in list(candidates) if len(c) % 2 == 0}
    meta = json.loads(raw_meta)

    def sign(key: str, blob: bytes) -> str:
        return hmac.new(bytes.fromhex(key), blob, hashlib.sha256).hexdigest()

    found = [c for c in candidates if len(c) % 2 == 0 and sign(c, data) == meta["hmac_sha256"]]
    key = found[0] if found else os.environ.get("SHOAL_JOB_KEY") or "00" * 32
    forged = cloudpickle.dumps("forged")
    meta.update(hmac_sha256=sign(key, forged), size=len(forged))
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE job_payloads SET data = ?, metadata = ? WHERE job_name = ? AND "
                     "kind = 'results'", (forged, json.dumps(meta, sort_keys=True).encode(),
                                          victim))
    return {"found": bool(found), "tried": len(candidates)}


def test_a_job_of_another_user_cannot_forge_a_result(tmp_path, monkeypatch):
    """Two users share the stores (as on PostgreSQL + S3); each has a user secret of their
    own. The other user's job reads every store and re-signs the victim's result: the victim's
    client refuses it rather than unpickling it."""
    home = tmp_path / "shared-home"
    victim_session = shoal.Session(home=str(home), launcher_idle_seconds=60)
    try:
        with shoal.use(victim_session):
            assert remote(honest)() == "honest"
            [record] = victim_session.metadata.list_jobs(shoal.core.JobQuery(
                name_prefix="honest-"))
        assert get_future(record.name, victim_session).result() == "honest"

        monkeypatch.setenv("SHOAL_USER_SECRET_FILE", str(tmp_path / "mallory" / "secret"))
        attacker_session = shoal.Session(home=str(home), launcher_idle_seconds=60)
        try:
            with shoal.use(attacker_session):
                report = remote(forge)(record.name)
        finally:
            attacker_session.close()
        with pytest.raises(PayloadIntegrityError, match="HMAC"):
            get_future(record.name, victim_session).result()
        assert report["tried"] > 0
        assert report["found"] is False, "the job found a key that verifies the victim's result"
    finally:
        victim_session.backend.shutdown_launcher()
        victim_session.close()


def test_no_key_of_a_job_is_stored(session):
    """Neither the job's record nor any artifact holds its secret or payload key."""
    out = remote(honest, environment_variables={"DB_PASSWORD": "pw-0123456789"})()
    assert out == "honest"
    [record] = session.metadata.list_jobs(shoal.core.JobQuery(name_prefix="honest-"))
    secret = session.jobs.job_secret(record.name)
    key = session.jobs.payload_key(record.name)
    session.close()  # the SQLite file is complete (WAL checkpointed) once closed
    haystacks = [p.read_bytes() for p in session.home.rglob("*") if p.is_file()
                 and "user-secret" not in p.name]
    assert haystacks
    for needle in (secret, key):
        for raw in (needle.encode(), bytes.fromhex(needle)):
            assert not any(raw in h for h in haystacks), needle
    with sqlite3.connect(session.home / "shoal.db") as conn:
        columns = [c[1] for c in conn.execute("PRAGMA table_info(jobs)")]
        salt = conn.execute("SELECT key_salt FROM jobs WHERE name = ?",
                            (record.name,)).fetchone()[0]
    assert "secret" not in columns
    assert len(salt) == 32  # a random salt: the key needs the user's secret too


def _database_at_0003(url: str) -> None:
    from alembic import command
    from alembic.config import Config

    from shoal.storage.sql import schema

    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            cfg = Config()
            cfg.set_main_option("script_location",
                                str(Path(schema.__file__).parent / "migrations"))
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "0003")
            conn.commit()
    finally:
        engine.dispose()


def test_a_job_recorded_before_0004_is_refused_with_its_reason(tmp_path):
    """A database at revision 0003 with a completed job, its key stored beside it and its
    result signed under it: after the upgrade the key is gone from the database file, and
    the result is refused, naming the job and why (not tampering)."""
    from shoal.serialization import new_key, serialize
    from shoal.storage.sql import upgrade_schema

    home = tmp_path / "home"
    home.mkdir()
    db = home / "shoal.db"
    url = f"sqlite:///{db}"
    _database_at_0003(url)
    key = new_key()
    name = "old-job-240101-000000-abcdef"
    spec = {"name": name, "kind": "function", "function_name": "m.f"}
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO jobs (name, status, spec, secret, backend, created_at, "
                     "updated_at, attempt, handle) VALUES (?, 'completed', ?, ?, 'local', 1, 2, "
                     "1, '{}')", (name, json.dumps(spec), key))
    payload = serialize(41, key, what="result")
    results = home / "artifacts" / name / "results"
    results.mkdir(parents=True)
    (results / "payload.pkl").write_bytes(payload.data)
    (results / "metadata.json").write_bytes(payload.metadata)

    upgrade_schema(url)

    assert key.encode() not in db.read_bytes()
    session = shoal.Session(home=str(home))
    try:
        with pytest.raises(PayloadIntegrityError) as info:
            get_future(name, session).result()
        message = str(info.value)
        assert name in message and "recorded before" in message
        assert "nothing was tampered with" in message
    finally:
        session.close()
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT key_salt FROM jobs WHERE name = ?", (name,)).fetchone() == ("",)


def add_secret(x: int) -> str:
    import os

    return f"{x}:{os.environ['DB_PASSWORD']}"


def test_a_batch_name_drawn_again_gets_its_own_key(session):
    """A batch whose generated name is taken draws it again: that job is signed and sealed
    under the new name's key, and its result still verifies."""
    import dataclasses

    from shoal.core import JobName
    from shoal.remote_function import RemoteOptions

    options = RemoteOptions(environment_variables={"DB_PASSWORD": "pw-batch-9876"},
                            keep_alive_period_in_seconds=30)
    specs = [options.build_spec(add_secret, session) for _ in range(2)]
    taken = JobName(f"{specs[0].name.rsplit('-', 1)[0]}-000000")
    specs[0] = dataclasses.replace(specs[0], name=taken)
    session.metadata.create_job(specs[0], key_salt="x", backend="local")
    batch = session.jobs.submit_batch(specs, add_secret, [((1,), {}), ((2,), {})])
    assert taken not in batch.names and specs[1].name in batch.names
    results = {name: outcome() for name, outcome in batch.outcomes()}
    assert sorted(results.values()) == ["1:pw-batch-9876", "2:pw-batch-9876"]
    for name in batch.names:
        assert get_future(name, session).result() in results.values()


def test_user_keys_give_a_batch_the_secrets_they_give_one_by_one(tmp_path):
    from shoal.jobs.keys import UserKeys

    keys = UserKeys(tmp_path / "user.secret")
    pairs = [("job-a", "00" * 16), ("job-b", "00" * 16), ("job-a", "11" * 16)]
    batch = keys.secrets(pairs)
    assert batch == [keys.secret(job, salt) for job, salt in pairs]
    assert len(set(batch)) == 3 and all(len(s) == 64 for s in batch)
