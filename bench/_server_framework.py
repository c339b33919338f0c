"""FastAPI vs Starlette (issue #20: "Starlette or FastAPI chosen by measurement"), for
bench/server.py: the same route, a job-status read shaped like shoal's (a bearer-token check
in front, a path parameter, a pydantic model of ~10 fields as the answer), served by uvicorn
as ``shoal server`` serves (one process, httptools, no websockets, no lifespan), in
interleaved rounds; plus each app's import time (the start-up it costs).

FastAPI is measured with a sync route and dependency (run in its thread pool, as shoal's
routes are) and with async ones (on the event loop).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _common import scratch
from _servers import Server, _spawn, free_port, pct

__all__ = ["run_framework_bench"]

_MODEL = '''
from pydantic import BaseModel
class JobOut(BaseModel):
    name: str
    status: str
    function_name: str
    created_at: float
    updated_at: float
    attempt: int
    backend: str
    exit_code: int | None = None
    failure_reason: str | None = None
    tags: dict[str, str] = {}
def record(name):
    return JobOut(name=name, status="pending", function_name="bench.trivial", created_at=1.0,
                  updated_at=2.0, attempt=0, backend="local", tags={"team": "a"})
'''

APPS = {
    "fastapi_sync": _MODEL + '''
from fastapi import Depends, FastAPI, HTTPException, Request
def authorize(request: Request) -> str:
    if request.headers.get("authorization") != "Bearer t":
        raise HTTPException(401)
    return "t"
app = FastAPI()
@app.get("/api/v1/jobs/{name}", dependencies=[Depends(authorize)])
def get_job(name: str) -> JobOut:
    return record(name)
''',
    "fastapi_async": _MODEL + '''
from fastapi import Depends, FastAPI, HTTPException, Request
async def authorize(request: Request) -> str:
    if request.headers.get("authorization") != "Bearer t":
        raise HTTPException(401)
    return "t"
app = FastAPI()
@app.get("/api/v1/jobs/{name}", dependencies=[Depends(authorize)])
async def get_job(name: str) -> JobOut:
    return record(name)
''',
    "starlette_app": _MODEL + '''
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route
async def get_job(request):
    if request.headers.get("authorization") != "Bearer t":
        return Response(status_code=401)
    body = record(request.path_params["name"]).model_dump_json()
    return Response(body, media_type="application/json")
async def ready(request):
    return Response("ok")
app = Starlette(routes=[Route("/api/v1/jobs/{name}", get_job), Route("/docs", ready)])
''',
}


def _start(name: str, tmp: Path) -> Server:
    port = free_port()
    argv = [sys.executable, "-m", "uvicorn", f"{name}:app", "--port", str(port), "--log-level",
            "warning", "--no-access-log", "--ws", "none", "--lifespan", "off",
            "--http", "httptools"]
    env = {"PYTHONPATH": str(tmp), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    return _spawn(name, argv, env=env, cwd=tmp, log=tmp / f"{name}.log",
                  probe="/docs", port=port)


def _latencies(url: str, requests: int) -> list[float]:
    import httpx

    with httpx.Client(base_url=url, headers={"Authorization": "Bearer t"}) as client:
        for _ in range(20):
            client.get("/api/v1/jobs/warm-up").raise_for_status()
        times = []
        for i in range(requests):
            t = time.perf_counter()
            r = client.get(f"/api/v1/jobs/job-{i}")
            times.append(time.perf_counter() - t)
            assert r.status_code == 200 and r.json()["name"] == f"job-{i}"
    return times


def _import_s(name: str, tmp: Path) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"import {name}"], cwd=tmp, check=True,
                   env={"PYTHONPATH": str(tmp), "PATH": "/usr/bin:/bin"})
    return time.perf_counter() - t


def run_framework_bench(args: argparse.Namespace, header: Callable[[str], None]) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="server-framework-", dir=scratch()))
    servers: dict[str, Server] = {}
    try:
        for name, code in APPS.items():
            (tmp / f"{name}.py").write_text(code)
        for name in APPS:
            servers[name] = _start(name, tmp)
        lat: dict[str, list[float]] = {n: [] for n in APPS}
        imports: dict[str, list[float]] = {n: [] for n in APPS}
        per_round = max(1, args.requests // args.rounds)
        for r in range(args.rounds):  # interleaved, the order rotating each round
            names = list(APPS)[r % len(APPS):] + list(APPS)[:r % len(APPS)]
            for name in names:
                lat[name] += _latencies(servers[name].url, per_round)
                imports[name].append(_import_s(name, tmp))
        header("the same job-status route, uvicorn, one process, sequential keep-alive client")
        base = statistics.median(lat["starlette_app"])
        for name in APPS:
            v = lat[name]
            print(f"{name:14} per request p50 {statistics.median(v) * 1e3:6.3f} ms  p90 "
                  f"{pct(v, 0.9) * 1e3:6.3f} ms  ({statistics.median(v) / base:.2f}x "
                  f"Starlette)   import of the app: p50 "
                  f"{statistics.median(imports[name]) * 1e3:6.0f} ms  (n={len(v)})")
        print("per request: the client's round trip over loopback (an httpx client in this "
              "process on the same cores)")
    finally:
        for server in servers.values():
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
