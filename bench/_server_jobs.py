"""``jobs list`` of 100 rows out of 100,000 jobs through the server, and job-status reads per
second, for bench/server.py. The jobs are written straight into the server's database
(``SqlMetadataStore.create_jobs``) before the server starts.

Anchor in the same run: the same ``list_jobs`` on the store in this process (no HTTP).
"Server time" is the client-measured wall time of the raw HTTP request (bytes, no decoding):
the server's time plus one loopback round trip, so an upper bound of it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _common import scratch
from _servers import pct, shoal_token, start_shoal

__all__ = ["run_jobs_bench"]

_READER = """
import random, sys, time, httpx
url, token, names, start, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"})
client.get(f"/api/v1/jobs/bench-{0:06d}").raise_for_status()
while time.time() < start:
    time.sleep(0.001)
count, end = 0, start + seconds
while time.time() < end:
    r = client.get(f"/api/v1/jobs/bench-{random.randrange(names):06d}")
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "pending"
    count += 1
print(count)
"""


def _fill(home: Path, n: int) -> None:
    import shoal
    from shoal.core.jobs import JobName, JobSpec

    session = shoal.Session(home=str(home))
    try:
        store = session.metadata
        t = time.perf_counter()
        for start in range(0, n, 10_000):
            specs = [JobSpec(name=JobName(f"bench-{i:06d}"), function_name="bench.trivial")
                     for i in range(start, min(n, start + 10_000))]
            store.create_jobs(specs, key_salts=["s"] * len(specs), backend="local")
        print(f"filled {n:,} jobs in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    finally:
        session.close()


def _lists(home: Path, url: str, token: str, requests: int) -> dict[str, list[float]]:
    """Interleaved: the store in process, the raw HTTP request, HttpJobStore.list_jobs."""
    import httpx

    import shoal
    from shoal.client.jobs import HttpJobStore
    from shoal.core.ports import JobQuery

    session = shoal.Session(home=str(home))
    raw = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"})
    http_store = HttpJobStore.open(url, token)
    query = JobQuery(limit=100)
    times: dict[str, list[float]] = {"store": [], "raw": [], "client": []}
    try:
        for i in range(requests + 3):  # the first three warm the caches and connections
            t = time.perf_counter()
            assert len(session.metadata.list_jobs(query)) == 100
            t1 = time.perf_counter()
            r = raw.get("/api/v1/jobs", params={"limit": "100"})
            assert r.status_code == 200 and len(r.content) > 1000
            t2 = time.perf_counter()
            assert len(http_store.list_jobs(query)) == 100
            t3 = time.perf_counter()
            if i >= 3:
                times["store"].append(t1 - t)
                times["raw"].append(t2 - t1)
                times["client"].append(t3 - t2)
        times["bytes"] = [float(len(r.content))]
    finally:
        http_store.close()
        raw.close()
        session.close()
    return times


def _reads(url: str, token: str, n: int, clients: int, seconds: float) -> float:
    start = time.time() + 3.0  # every reader connected and warmed before the clock starts
    procs = [subprocess.Popen([sys.executable, "-c", _READER, url, token, str(n), str(start),
                               str(seconds)], stdout=subprocess.PIPE, text=True)
             for _ in range(clients)]
    counts = []
    for proc in procs:
        out, _ = proc.communicate(timeout=seconds + 120)
        if proc.returncode != 0:
            raise RuntimeError(f"a status reader failed with {proc.returncode}")
        counts.append(int(out.strip()))
    return sum(counts) / seconds


def run_jobs_bench(args: argparse.Namespace, header: Callable[[str], None]) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="server-jobs-", dir=scratch()))
    try:
        home = tmp / "shoal"
        token = shoal_token(home)
        _fill(home, args.jobs)
        server = start_shoal(home)
        try:
            times = _lists(home, server.url, token, args.requests)
            rates = [_reads(server.url, token, args.jobs, args.clients, args.seconds)
                     for _ in range(3)]
        finally:
            server.stop()
        header(f"{args.jobs:,} jobs in the server's SQLite database")
        size = times.pop("bytes")[0]
        for key, label in (("store", "store.list_jobs(limit=100) in process (anchor)"),
                           ("raw", "GET /api/v1/jobs?limit=100, raw bytes (server time)"),
                           ("client", "HttpJobStore.list_jobs(limit=100), decoded")):
            v = times[key]
            print(f"{label:55}: p50 {statistics.median(v) * 1e3:7.2f} ms  p90 "
                  f"{pct(v, 0.9) * 1e3:7.2f} ms  (n={len(v)})")
        ratio = statistics.median(times["raw"]) / statistics.median(times["store"])
        print(f"response {size / 1024:.0f} KiB; raw HTTP / store in process: {ratio:.1f}x   "
              f"target: server time <= 50 ms")
        print(f"job-status reads (GET /api/v1/jobs/NAME, {args.clients} client processes on "
              f"the same cores, {args.seconds:g} s x 3): median {statistics.median(rates):,.0f}/s"
              f"  (all: {', '.join(f'{r:,.0f}' for r in rates)})   target >= 1,000/s")
        print(json.dumps({"list_raw_p50_ms": statistics.median(times["raw"]) * 1e3,
                          "reads_per_s": statistics.median(rates)}))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
