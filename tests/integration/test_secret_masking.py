"""Secret values stay masked: in logs written in pieces, in failure reasons and exceptions,
for variables inherited from the client, and encrypted in the stored spec (issue #15.2)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import pytest

import shoal
from shoal import remote
from shoal.core import JobQuery

PASSWORD = "pw-Zq8v1Xc3Lk9T"
TOKEN = "tok-Hh2mN7bR4sWd0Yq"
SECRETS = {"DB_PASSWORD": PASSWORD, "MY_API_TOKEN": TOKEN}


def _cli(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "shoal.cli", *args], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ), stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout + proc.stderr


def _only(session, prefix: str):
    [record] = session.metadata.list_jobs(JobQuery(name_prefix=prefix))
    return record


def _raw_row(session, name: str) -> str:
    with sqlite3.connect(session.home / "shoal.db") as conn:
        row = conn.execute("SELECT * FROM jobs WHERE name = ?", (name,)).fetchone()
        events = conn.execute("SELECT reason FROM job_events WHERE job_name = ?",
                              (name,)).fetchall()
    return json.dumps([list(row), events], default=str)


def print_in_pieces(*names: str) -> str:
    """Each value written in two pieces: a write and a flush, a pause, then the rest."""
    import os
    import sys
    import time

    for name in names:
        value = os.environ[name]
        sys.stdout.write(f"{name}={value[:5]}")
        sys.stdout.flush()
        time.sleep(0.3)  # the supervisor reads the first piece on its own
        print(f"{value[5:]} (end)", flush=True)
    return "printed"


def test_a_value_written_in_pieces_is_masked_in_the_log(session):
    assert remote(print_in_pieces, environment_variables=SECRETS)(*SECRETS) == "printed"
    name = _only(session, "print-in-pieces-").name
    stored = session.jobs.read_log(name).decode()
    shown = _cli("jobs", "logs", name)
    for text in (stored, shown):
        assert PASSWORD not in text and TOKEN not in text
        assert "DB_PASSWORD=**** (end)" in text and "MY_API_TOKEN=**** (end)" in text


def test_a_secret_of_the_clients_environment_is_masked_in_the_log(monkeypatch, tmp_path):
    inherited = "ghp-Client0Token9Value"
    monkeypatch.setenv("GITHUB_TOKEN", inherited)
    s = shoal.Session(home=str(tmp_path / "home"), launcher_idle_seconds=60)
    try:
        with shoal.use(s):
            assert remote(print_in_pieces)("GITHUB_TOKEN") == "printed"
        name = _only(s, "print-in-pieces-").name
        log = s.jobs.read_log(name).decode()
        assert inherited not in log and "GITHUB_TOKEN=**** (end)" in log
    finally:
        s.backend.shutdown_launcher()
        s.close()


def fail_with_secret() -> None:
    import os

    raise RuntimeError(f"cannot connect as admin:{os.environ['DB_PASSWORD']}@db")


def test_a_failure_reason_quoting_a_secret_is_masked_everywhere(session):
    with pytest.raises(RuntimeError) as info:
        remote(fail_with_secret, environment_variables=SECRETS)()
    client_text = str(info.value) + "".join(getattr(info.value, "__notes__", []))
    assert "cannot connect as admin:****@db" in client_text
    assert PASSWORD not in client_text
    record = _only(session, "fail-with-secret-")
    assert record.failure_reason == "RuntimeError: cannot connect as admin:****@db"
    assert PASSWORD not in _raw_row(session, record.name)
    text = _cli("jobs", "describe", record.name)
    as_json = _cli("jobs", "describe", record.name, "--json")
    for shown in (text, as_json):
        assert PASSWORD not in shown and TOKEN not in shown
        assert "admin:****@db" in shown
    assert PASSWORD not in session.jobs.read_log(record.name).decode()


def read_env(*names: str) -> dict:
    import os

    return {n: os.environ[n] for n in names}


def test_secret_values_are_stored_encrypted_and_shown_masked(session):
    env = {**SECRETS, "PLAIN_SETTING": "visible-setting"}
    assert remote(read_env, environment_variables=env)(*env) == env  # the job sees them
    record = _only(session, "read-env-")
    raw = _raw_row(session, record.name)
    assert PASSWORD not in raw and TOKEN not in raw
    assert "visible-setting" in raw  # only secret-looking names are sealed
    stored = json.loads(json.loads(raw)[0][2])["environment_variables"]
    assert stored["DB_PASSWORD"].startswith("shoal-sealed:v1:")
    assert session.jobs.unseal(record).spec.environment_variables == env  # the client reads them
    as_json = json.loads(_cli("jobs", "describe", record.name, "--json"))
    assert as_json["spec"]["environment_variables"] == {
        "DB_PASSWORD": "****", "MY_API_TOKEN": "****", "PLAIN_SETTING": "visible-setting"}
    text = _cli("jobs", "describe", record.name)
    assert PASSWORD not in text and "shoal-sealed" not in text
