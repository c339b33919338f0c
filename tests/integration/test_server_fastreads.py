"""Job-status reads answered in front of FastAPI (``server/_fastreads.py``) answer exactly
as FastAPI's own ``get_job`` route does: the same status and the same body for a job, a
missing job, no token, an unknown token, a read token, a job token of that job and one of
another job; and so do the warm path's requests answered there (``server/_fastwrites.py``:
``POST /job-transitions``, ``POST /launches/batch``, ``GET /launches/{launch}/messages``),
refusals and bad bodies included. Two real uvicorn servers on 127.0.0.1 in this process, over
one store: the app ``shoal server`` runs (``server_config``), and the FastAPI app behind its
fast paths alone."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from helpers import wait_until
from shoal.core.auth import Scope, hash_token, new_token
from shoal.core.jobs import JobName, JobSpec
from shoal.session import Session

uvicorn = pytest.importorskip("uvicorn")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(config: object) -> tuple[object, threading.Thread]:
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="shoal-server", daemon=True)
    thread.start()
    wait_until(lambda: server.started, 60, what="an in-process server")
    return server, thread


@pytest.fixture
def both(tmp_path: Path) -> Iterator[tuple[Session, str, str]]:
    """(session, URL of the full app, URL of its FastAPI app alone)."""
    from fastapi import FastAPI

    from shoal.server._fastreads import FastJobReads
    from shoal.server._fastwrites import FastWrites
    from shoal.server.admin import server_config

    session = Session(home=str(tmp_path / "home"))
    port, plain_port = _free_port(), _free_port()
    config = server_config(session, host="127.0.0.1", port=port, auth=True)
    assert isinstance(config.app, FastJobReads)
    assert isinstance(config.app.app, FastWrites)
    assert isinstance(config.app.app.app, FastAPI)
    plain = uvicorn.Config(config.app.app.app, host="127.0.0.1", port=plain_port,
                           log_level="warning", lifespan="off", ws="none")
    servers = []
    try:
        for c in (config, plain):
            servers.append(_serve(c))
        yield session, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{plain_port}"
    finally:
        for server, thread in servers:
            server.should_exit = True  # type: ignore[attr-defined]
            thread.join(timeout=30)
        session.close()


def test_job_status_reads_answer_as_fastapis_route(both):
    from shoal.server._jobtokens import JobTokens

    session, fast, plain = both
    store = session.metadata
    store.create_user("ada", is_admin=True)
    admin, reader = new_token(), new_token()
    store.create_token("ada", "t", scope=Scope.ADMIN, token_hash=hash_token(admin))
    store.create_token("ada", "r", scope=Scope.READ, token_hash=hash_token(reader))
    store.create_jobs([JobSpec(name=JobName(n), function_name="m.f") for n in ("job-a", "job-b")],
                      key_salts=["s", "s"], backend="local")
    tokens = JobTokens(session.home / "server" / "job-token-secret")
    own, other = tokens.mint("ada", ["job-a"]), tokens.mint("ada", ["job-b"])
    cases = [("job-a", admin), ("job-a", reader), ("job-a", own), ("job-a", other),
             ("no-such-job", admin), ("job-a", None), ("job-a", "shoal_not-a-real-token"),
             ("job-a", f"{own}x")]
    seen = set()
    with httpx.Client(base_url=fast) as f, httpx.Client(base_url=plain) as p:
        for name, token in cases:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            a = f.get(f"/api/v1/jobs/{name}", headers=headers)
            b = p.get(f"/api/v1/jobs/{name}", headers=headers)
            assert (a.status_code, a.json()) == (b.status_code, b.json()), (name, token)
            assert a.headers["content-type"] == b.headers["content-type"] == "application/json"
            seen.add(a.status_code)
        ok = f.get("/api/v1/jobs/job-a", headers={"Authorization": f"Bearer {admin}"}).json()
        assert ok["name"] == "job-a" and ok["status"] == "pending" and ok["owner"] == "local"
        # What the fast path leaves to FastAPI still reaches it.
        listed = f.get("/api/v1/jobs", params={"name": "job-b"},
                       headers={"Authorization": f"Bearer {admin}"})
        assert [j["name"] for j in listed.json()] == ["job-b"]
        assert f.get("/api/v1/jobs/job-a/key-salt",
                     headers={"Authorization": f"Bearer {admin}"}).json() == {"key_salt": "s"}
        other_method = f.delete("/api/v1/jobs/job-a")
        assert other_method.status_code == p.delete("/api/v1/jobs/job-a").status_code == 405
    assert seen == {200, 401, 403, 404}


def test_the_warm_paths_requests_answer_as_fastapis_routes(both):
    """``POST /job-transitions``, ``POST /launches/batch`` and the messages poll, answered in
    front of FastAPI, give FastAPI's own status and body: a change applied, bad bodies (FastAPI
    answers them), no or a read token, a job token naming another job or storing a file
    outside its own, a launch that names other jobs, an unknown launch, a bad poll."""
    import base64

    from shoal.core.ports import JobQuery
    from shoal.server._jobtokens import JobTokens

    session, fast, plain = both
    store = session.metadata
    store.create_user("ada", is_admin=True)
    admin, reader = new_token(), new_token()
    store.create_token("ada", "t", scope=Scope.ADMIN, token_hash=hash_token(admin))
    store.create_token("ada", "r", scope=Scope.READ, token_hash=hash_token(reader))
    names = ("job-a", "job-b", "job-c", "job-d")
    store.create_jobs([JobSpec(name=JobName(n), function_name="m.f") for n in names],
                      key_salts=["s"] * len(names), backend="local", owner="ada")
    tokens = JobTokens(session.home / "server" / "job-token-secret")
    token_c, token_d = tokens.mint("ada", ["job-c"]), tokens.mint("ada", ["job-d"])

    def change(name, status="starting"):
        return {"changes": [{"name": name, "status": status, "expected": "pending"}]}

    outside = base64.b64encode(b"x").decode()
    # (method, path, JSON body or raw bytes, token, body for the plain app when it differs)
    cases = [
        ("POST", "/job-transitions", change("job-a"), admin, change("job-b")),
        ("POST", "/job-transitions", change("job-c"), token_c,
         {"changes": [{"name": "job-c", "status": "running", "expected": "starting"}]}),
        ("POST", "/job-transitions", change("job-c"), token_d, None),
        ("POST", "/job-transitions", {**change("job-d"), "files": {"job-c/x": outside}},
         token_d, None),
        ("POST", "/job-transitions", change("job-a"), reader, None),
        ("POST", "/job-transitions", change("job-a"), None, None),
        ("POST", "/job-transitions", b"{not json", admin, None),
        ("POST", "/job-transitions", {"changes": [{"name": "job-a"}]}, admin, None),
        ("POST", "/launches/batch", {"specs": [], "key_salts": [], "files": {}, "launch": {
            "job": "b1", "entrypoint": "os:system", "args": ["b1"]}}, admin, None),
        ("POST", "/launches/batch", {"specs": [], "key_salts": []}, admin, None),
        ("POST", "/launches/batch", {"specs": [], "key_salts": [], "files": {}, "launch": {
            "job": "b1", "entrypoint": "x:y"}}, reader, None),
        ("GET", "/launches/no-such-launch/messages?after=0&timeout=0", None, admin, None),
        ("GET", "/launches/no-such-launch/messages?after=-1", None, admin, None),
        ("GET", "/launches/no-such-launch/messages?timeout=soon", None, admin, None),
        ("GET", "/launches/no-such-launch/messages", None, None, None),
        ("GET", "/launches/no-such-launch/messages", None, token_c, None),
    ]
    seen = set()
    with httpx.Client(base_url=fast) as f, httpx.Client(base_url=plain) as p:
        for method, path, body, token, plain_body in cases:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            answers = []
            for client, sent in ((f, body), (p, body if plain_body is None else plain_body)):
                kwargs = {"content": sent} if isinstance(sent, bytes) else \
                    {} if sent is None else {"json": sent}
                answers.append(client.request(method, f"/api/v1{path}", headers=headers,
                                              **kwargs))
            a, b = answers
            assert (a.status_code, a.json()) == (b.status_code, b.json()), (path, body, token)
            seen.add(a.status_code)
    assert seen == {200, 400, 401, 403}
    # Each side recorded what it was given: job-a (fast) and job-b (plain) started, job-c
    # started (fast) and then ran (plain), job-d was refused.
    statuses = {r.name: r.status for r in store.list_jobs(JobQuery(names=list(names)))}
    assert statuses == {"job-a": "starting", "job-b": "starting", "job-c": "running",
                        "job-d": "pending"}
