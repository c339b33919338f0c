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
from _servers import Server, free_port, pct, shoal_token, start_shoal, wait_answer

__all__ = ["run_jobs_bench"]

#: A status reader: one keep-alive connection, one request in flight, every answer checked.
#: ``httpx``: shoal's own client library. ``raw``: a minimal HTTP/1.1 client on a socket, so
#: that the readers, which share the two cores with the server, take less of them.
_READER = r"""
import json, random, re, socket, sys, time
kind, url, token, names, start, seconds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
if kind == "httpx":
    import httpx
    client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"})
    def get(path):
        r = client.get(path)
        return r.status_code, r.content
else:
    host, port = url.rsplit("/", 1)[1].split(":")
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = b""
    length_re = re.compile(rb"(?i)\r\ncontent-length: *(\d+)")
    def get(path):
        global buf
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n\r\n".encode())
        while (end := buf.find(b"\r\n\r\n")) < 0:
            buf += sock.recv(65536)
        head, rest = buf[:end], buf[end + 4:]
        length = int(length_re.search(head).group(1))
        while len(rest) < length:
            rest += sock.recv(65536)
        buf = rest[length:]
        return int(head.split(b" ", 2)[1]), rest[:length]
status, body = get("/api/v1/jobs/bench-000000")
assert status == 200, body
while time.time() < start:
    time.sleep(0.001)
count, end = 0, start + seconds
while time.time() < end:
    status, body = get(f"/api/v1/jobs/bench-{random.randrange(names):06d}")
    assert status == 200, body
    assert json.loads(body)["status"] == "pending"
    count += 1
print(count)
"""

#: The floor: a bare uvicorn app, configured as ``shoal server``'s (one process, httptools,
#: no websockets, no access log), answering every request with the same JSON bytes.
_FLOOR = """
import sys, uvicorn
body = open(sys.argv[2], "rb").read()
headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning",
            access_log=False, lifespan="off", ws="none", interface="asgi3")
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


def _reads(kind: str, url: str, token: str, n: int, clients: int, seconds: float) -> float:
    start = time.time() + 3.0  # every reader connected and warmed before the clock starts
    procs = [subprocess.Popen([sys.executable, "-c", _READER, kind, url, token, str(n),
                               str(start), str(seconds)], stdout=subprocess.PIPE, text=True)
             for _ in range(clients)]
    counts = []
    for proc in procs:
        out, _ = proc.communicate(timeout=seconds + 120)
        if proc.returncode != 0:
            raise RuntimeError(f"a status reader failed with {proc.returncode}")
        counts.append(int(out.strip()))
    return sum(counts) / seconds


def _start_floor(tmp: Path, url: str, token: str) -> Server:
    """The bare uvicorn app, answering with the bytes shoal answers for one job."""
    import httpx

    body = httpx.get(f"{url}/api/v1/jobs/bench-000000",
                     headers={"Authorization": f"Bearer {token}"}).content
    (tmp / "job.json").write_bytes(body)
    port = free_port()
    log = tmp / "floor.log"
    with open(log, "wb") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", _FLOOR, str(port), str(tmp / "job.json")],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    floor_url = f"http://127.0.0.1:{port}"
    try:
        wait_answer(proc, floor_url + "/api/v1/version", log, t0)
    except BaseException:
        Server("floor", proc, floor_url, 0.0, log).stop()
        raise
    return Server("floor", proc, floor_url, 0.0, log)


def run_jobs_bench(args: argparse.Namespace, header: Callable[[str], None]) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="server-jobs-", dir=scratch()))
    try:
        home = tmp / "shoal"
        token = shoal_token(home)
        _fill(home, args.jobs)
        server = start_shoal(home)
        floor = None
        rates: dict[tuple[str, str], list[float]] = {}
        try:
            times = _lists(home, server.url, token, args.requests)
            floor = _start_floor(tmp, server.url, token)
            for r in range(args.windows):  # interleaved: shoal, floor / floor, shoal
                for kind in ("raw", "httpx"):
                    sides = [("shoal", server), ("floor", floor)]
                    for side, srv in sides if r % 2 == 0 else sides[::-1]:
                        rates.setdefault((side, kind), []).append(_reads(
                            kind, srv.url, token, args.jobs, args.clients, args.seconds))
        finally:
            if floor is not None:
                floor.stop()
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
        print(f"job-status reads, GET /api/v1/jobs/NAME, {args.clients} client processes on "
              f"the same cores, {args.windows} windows of {args.seconds:g} s, interleaved:")
        for kind, what in (("raw", "a minimal socket client"), ("httpx", "httpx clients")):
            shoal_rate = statistics.median(rates["shoal", kind])
            floor_rate = statistics.median(rates["floor", kind])
            print(f"  {what:24}: shoal server {shoal_rate:7,.0f}/s  (all: "
                  f"{', '.join(f'{v:,.0f}' for v in rates['shoal', kind])}) | floor, a bare "
                  f"uvicorn app with the same JSON {floor_rate:7,.0f}/s | shoal/floor "
                  f"{shoal_rate / floor_rate:.2f}   target >= 1,000/s")
        print(json.dumps({"list_raw_p50_ms": statistics.median(times["raw"]) * 1e3,
                          "reads_per_s": statistics.median(rates["shoal", "raw"]),
                          "reads_per_s_httpx": statistics.median(rates["shoal", "httpx"]),
                          "floor_per_s": statistics.median(rates["floor", "raw"])}))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
