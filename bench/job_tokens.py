"""What the job-token checks cost per request (issue #20: a job token reaches its job's run and
writes nothing once its job has ended, decided from the job's record).

In one process, over the server's ASGI app (``httpx.ASGITransport``, no sockets) on SQLite:
the same requests on an app whose ``Authorizer`` reads no job records (the anchor: ``grants``
None, the checks before this change) and on the real one. Requests:

- ``status read (user)``: ``GET /jobs/{name}`` with a user's token (the status-read route;
  its path runs no job-token code at all);
- ``status read (job)``: the same with the job's own token (a supervisor's read);
- ``write (job)``: ``PUT /jobs/{name}/handle`` with the job's token (each write of a job
  token reads whether its job is still live: one indexed query);
- ``run read (job)``: ``GET /experiments/{e}/runs/{r}`` of its job's run (the job's owner and
  run are read once, then cached).

Prints the median microseconds per request of each, and the ratio real/anchor, per round
(the two apps' requests interleaved), then the added work alone: ``JobGrants.why_ended`` on a
live job (the one read a job token's write adds) and ``runs`` once cached, against the
user-token lookup every request of a user's token makes (``token_by_hash``).

    python bench/job_tokens.py [--requests 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from _common import cpu_model, scratch


def _app(home: Path, grants: bool):  # noqa: ANN202 - a FastAPI app
    import shoal
    from shoal.server._launches import ServerJobs
    from shoal.server._signals import Signals
    from shoal.server.app import create_app

    session = shoal.Session(home=str(home))
    store = session.metadata
    server_jobs = ServerJobs(session, "http://127.0.0.1:1", Signals())
    if not grants:
        server_jobs.grants = None  # type: ignore[assignment]
    return session, create_app(store, store, jobs=store, server_jobs=server_jobs)


def _setup(home: Path) -> tuple[str, str, str]:
    """A user, a pending job of theirs linked to a run; their token and the job's."""
    import shoal
    from shoal.core.auth import Scope, hash_token, new_token
    from shoal.core.jobs import JobName, JobSpec, RunRef
    from shoal.server._jobtokens import JobTokens

    session = shoal.Session(home=str(home))
    store = session.metadata
    store.create_user("ann")
    token = new_token()
    store.create_token("ann", "bench", scope=Scope.WRITE, token_hash=hash_token(token))
    store.ensure_experiment("e", owner="ann")
    store.create_run("e", "r", owner="ann")
    store.create_job(JobSpec(name=JobName("job-1"), function_name="bench.trivial",
                             run=RunRef("e", "r")), key_salt="00" * 16, backend="local",
                     owner="ann")
    job_token = JobTokens(home / "server" / "job-token-secret").mint("ann", ["job-1"])
    session.close()
    return "job-1", token, job_token


async def _compare(anchor_app, real_app, token: str, method: str, path: str,  # noqa: ANN001
                   body: dict | None, n: int) -> tuple[float, float]:
    """Median microseconds per request on each app, their requests interleaved in chunks of
    100 (alternating which goes first) so that drift in the machine's load hits both."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"}
    clients = [httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://b",
                                 headers=headers) for app in (anchor_app, real_app)]
    times: list[list[float]] = [[], []]
    try:
        for client in clients:
            for _ in range(50):  # warm-up (and the first read of the job's run)
                (await client.request(method, path, json=body)).raise_for_status()
        for chunk in range(max(1, n // 100)):
            order = (0, 1) if chunk % 2 == 0 else (1, 0)
            for side in order:
                for _ in range(100):
                    t = time.perf_counter()
                    r = await clients[side].request(method, path, json=body)
                    times[side].append(time.perf_counter() - t)
                    assert r.status_code < 300, r.text
    finally:
        for client in clients:
            await client.aclose()
    return statistics.median(times[0]) * 1e6, statistics.median(times[1]) * 1e6


async def _time(app, token: str, method: str, path: str, body: dict | None, n: int) -> float:  # noqa: ANN001
    return (await _compare(app, app, token, method, path, body, n))[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    print(f"# job-token checks per request, in process (ASGI, SQLite); {cpu_model()}")
    with tempfile.TemporaryDirectory(dir=scratch()) as tmp:
        home = Path(tmp) / "home"
        job, user_token, job_token = _setup(home)
        cases = [("status read (user)", user_token, "GET", f"/api/v1/jobs/{job}", None),
                 ("status read (job)", job_token, "GET", f"/api/v1/jobs/{job}", None),
                 ("write (job)", job_token, "PUT", f"/api/v1/jobs/{job}/handle",
                  {"handle": {"backend": "local", "pid": 1}}),
                 ("run read (job)", job_token, "GET", "/api/v1/experiments/e/runs/r", None)]
        apps = {grants: _app(home, grants) for grants in (False, True)}
        try:
            for round_ in range(1, args.rounds + 1):
                for name, token, method, path, body in cases:
                    if name == "run read (job)":  # refused without the grants: real only
                        real = asyncio.run(_time(apps[True][1], token, method, path, body,
                                                 args.requests))
                        print(f"round {round_}  {name:20s} real {real:7.1f} us  (no anchor: "
                              "refused before this change)")
                        continue
                    anchor, real = asyncio.run(_compare(apps[False][1], apps[True][1], token,
                                                        method, path, body, args.requests))
                    print(f"round {round_}  {name:20s} anchor {anchor:7.1f} us  real "
                          f"{real:7.1f} us  ratio {real / anchor:.2f}")
            _alone(home, apps[True][0], user_token, job_token, args.requests)
        finally:
            for session, _ in apps.values():
                session.close()


def _alone(home: Path, session, user_token: str, job_token: str, n: int) -> None:  # noqa: ANN001
    from shoal.core.auth import hash_token
    from shoal.server._jobtokens import JobGrants, JobTokens

    store = session.metadata
    token = JobTokens(home / "server" / "job-token-secret").verify(job_token)
    grants = JobGrants(store)
    digest = hash_token(user_token)
    cases = {"why_ended (live job)": lambda: grants.why_ended(token),
             "runs (cached)": lambda: grants.runs(token),
             "token_by_hash (anchor)": lambda: store.token_by_hash(digest)}
    for name, call in cases.items():
        assert name != "why_ended (live job)" or call() is None
        times = []
        for _ in range(n):
            t = time.perf_counter()
            call()
            times.append(time.perf_counter() - t)
        print(f"alone    {name:24s} {statistics.median(times) * 1e6:7.1f} us")


if __name__ == "__main__":
    main()
