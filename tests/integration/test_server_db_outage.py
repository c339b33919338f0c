"""A team server whose PostgreSQL stops: every request is a 503 naming the database (its
password hidden) and why, in the standard error shape; the server stays up, a client's
retries keep the message, a client waiting out the outage gets its answer, and the server
answers again once PostgreSQL is back. The database is a PostgreSQL server of this test's own
(scripts/postgres.sh), which it stops and starts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from helpers import wait_until

_ROOT = Path(__file__).resolve().parents[2]


def _cli(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "shoal.cli", *args], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.timeout(300)
def test_a_stopped_database_is_a_503_naming_it_until_it_is_back(own_postgres,
                                                                 own_shoal_server, tmp_path):
    from shoal import Session
    from shoal.client import HttpRunStore, ServerConnection
    from shoal.errors import MetadataStoreError

    # trust authentication ignores the password: it is there to be hidden
    db_url = own_postgres.url.replace("shoal@", "shoal:hunter2@")
    home = tmp_path / "server-home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    env.update(SHOAL_HOME=str(home), XDG_CONFIG_HOME=str(home / "xdg"),
               SHOAL_METADATA_URL=db_url, OMP_NUM_THREADS="1")
    _cli(env, "db", "upgrade")
    token = _cli(env, "server", "init")
    proc, url, _ = own_shoal_server(env={"SHOAL_METADATA_URL": db_url}, home=home)
    port = url.rpartition(":")[2]
    log = home / f"server-{port}.log"
    auth = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, headers=auth, timeout=60) as http:
        assert http.get("/api/v1/experiments").status_code == 200
        own_postgres.stop()
        answer = http.get("/api/v1/experiments")
        assert answer.status_code == 503, answer.text
        assert answer.headers["retry-after"] == "1"
        error = answer.json()["error"]
        assert error["code"] == "METADATA_STORE_ERROR" and error["details"]["transient"]
        shown = f"postgresql+psycopg://shoal:***@127.0.0.1:{own_postgres.port}/shoal_test"
        assert f"the metadata store at {shown} (password hidden) of this shoal server does " \
            "not answer: " in error["message"]
        assert "hunter2" not in answer.text
        assert proc.poll() is None  # the server stays up
        # a client's retries (idempotent GETs) end in the same message, not a generic one
        with HttpRunStore(ServerConnection(url, token, backoff=0.01)) as store:
            with pytest.raises(MetadataStoreError, match="does not answer") as info:
                store.list_experiments()
            assert shown in str(info.value)
        at_once = Session(server_url=url, token=token, store_outage_seconds=0,
                          home=str(tmp_path / "client"))
        try:
            with pytest.raises(MetadataStoreError, match=re.escape(shown) + ".* does not answer"):
                at_once.runs.list_experiments()
        finally:
            at_once.close()
        # a client that waits out outages gets its answer once the database is back
        waiting = Session(server_url=url, token=token, store_outage_seconds=240,
                          home=str(tmp_path / "client"))
        got: list[object] = []
        refusals = log.read_text().count("does not answer")
        thread = threading.Thread(target=lambda: got.append(waiting.runs.list_experiments()))
        thread.start()
        try:
            wait_until(lambda: log.read_text().count("does not answer") > refusals + 1, 120,
                       what="the waiting client's requests answered 503")
        finally:
            own_postgres.start()  # also when the wait failed: the thread then ends too
        thread.join(timeout=240)
        assert not thread.is_alive() and got == [[]], got
        waiting.close()
        assert http.get("/api/v1/experiments").status_code == 200  # answering again
        assert proc.poll() is None
