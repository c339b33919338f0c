"""The team server (issue #20, "Performance"): start-up and memory, metrics through the
server, ``jobs list`` and status reads, FastAPI vs Starlette, each against its anchor in the
same run, in interleaved rounds (noise on these shared machines hits both sides alike).

    .venv/bin/python bench/server.py startup   [--rounds 5] [--settle 3] [--without-mlflow]
    .venv/bin/python bench/server.py metrics   [--points 10000] [--rounds 5] [--single 200]
    .venv/bin/python bench/server.py jobs      [--jobs 100000] [--requests 50] [--seconds 5]
                                               [--clients 2] [--windows 3]
    .venv/bin/python bench/server.py framework [--requests 2000] [--rounds 5]
    .venv/bin/python bench/server.py remote    [--calls 50] [--map 2000] [--rounds 3]
    .venv/bin/python bench/server.py invoke    [--calls 200] [--rounds 3]

Anchor: MLflow 3.x's ``mlflow server`` (its defaults, SQLite backend store) from a virtual
environment of its own under the bench's scratch directory (made with uv on first use; never
shoal's venv). ``shoal server`` runs with tokens on, as a team runs it.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import cpu_model, scratch
from _servers import (
    Server,
    free_port,
    mlflow_log,
    mlflow_python,
    mlflow_version,
    shoal_token,
    start_mlflow,
    start_shoal,
    tree_memory,
    wait_answer,
)

MiB = 1024 * 1024


def _header(what: str) -> None:
    print(f"CPU: {cpu_model()}")
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"load average: {' '.join(load)}   python {sys.version.split()[0]}   {what}")


# --- start-up and memory at rest -------------------------------------------------------------

def _at_rest(server: Server, settle: float) -> tuple[int, int, int]:
    time.sleep(settle)  # "at rest": after start-up work the server does once it answers
    return tree_memory(server.proc.pid)


#: Floors timed in the same rounds: a bare interpreter, and one that imports the libraries
#: any server of this shape loads (the web framework, the ASGI server, the SQL toolkit).
#: And a bare uvicorn app, started with ``shoal server``'s uvicorn settings, until it answers.
BARE = "bare uvicorn app until it answers"
FLOORS = {"python -c pass": "pass",
          "python -c 'import fastapi, uvicorn, sqlalchemy'": "import fastapi, uvicorn, sqlalchemy"}


def _floor(code: str) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - t


def _bare_uvicorn(tmp: Path) -> float:
    """Seconds until a bare uvicorn app (``shoal server``'s uvicorn settings) answers."""
    from _server_jobs import _FLOOR

    body = tmp / "bare.json"
    body.write_bytes(b'{"api_version": "v1"}')
    port = free_port()
    log = tmp / "bare.log"
    with open(log, "wb") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", _FLOOR, str(port), str(body)],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = Server("bare uvicorn", proc, f"http://127.0.0.1:{port}", 0.0, log)
    try:
        return wait_answer(proc, f"{server.url}/api/v1/version", log, t0)
    finally:
        server.stop()


def cmd_startup(args: argparse.Namespace) -> None:
    anchor = not args.without_mlflow
    python = mlflow_python() if anchor else None
    version = mlflow_version(python) if python is not None else "(not run: --without-mlflow)"
    sides = ("shoal", "mlflow") if anchor else ("shoal",)
    tmp = Path(tempfile.mkdtemp(prefix="server-startup-", dir=scratch()))

    def start(name: str) -> Server:
        if name == "shoal":
            return start_shoal(shoal_home)
        assert python is not None
        return start_mlflow(python, mlflow_dir)

    try:
        shoal_home, mlflow_dir = tmp / "shoal", tmp / "mlflow"
        shoal_token(shoal_home)  # the database and the first admin exist: a restart
        first = {}
        for name in sides:
            server = start(name)  # the first start on an empty database (MLflow's migrations)
            first[name] = server.startup_s
            server.stop()
        samples: dict[str, list[float]] = {**{n: [] for n in sides}, BARE: [],
                                           **{f: [] for f in FLOORS}}
        memory: dict[str, list[tuple[int, int, int]]] = {n: [] for n in sides}
        for r in range(args.rounds):
            for name in sides if r % 2 == 0 else sides[::-1]:
                server = start(name)
                try:
                    samples[name].append(server.startup_s)
                    memory[name].append(_at_rest(server, args.settle))
                finally:
                    server.stop()
            samples[BARE].append(_bare_uvicorn(tmp))
            for label, code in FLOORS.items():
                samples[label].append(_floor(code))
        _header(f"MLflow {version}")
        print(f"first start: shoal (after 'server init') {first['shoal']:.2f} s"
              + (f", mlflow (empty database: its migrations) {first['mlflow']:.2f} s"
                 if anchor else ""))
        for name, probe in (("shoal", "GET /api/v1/version"), ("mlflow", "GET /health")):
            if name not in sides:
                continue
            s = samples[name]
            rss = statistics.median(m[0] for m in memory[name]) / MiB
            pss = statistics.median(m[1] for m in memory[name]) / MiB
            procs = statistics.median(m[2] for m in memory[name])
            print(f"{name:6} start-up until {probe:20} answers: p50 {statistics.median(s):6.2f} s"
                  f"  min {min(s):6.2f} s  max {max(s):6.2f} s   at rest: RSS {rss:7.0f} MiB, "
                  f"PSS {pss:7.0f} MiB in {procs:.0f} processes")
        for label in (BARE, *FLOORS):
            print(f"floor  {label:55}: p50 {statistics.median(samples[label]):6.2f} s")
        shoal_p50 = statistics.median(samples["shoal"])
        print(f"shoal / bare uvicorn app start-up p50: "
              f"{shoal_p50 / statistics.median(samples[BARE]):.1f}x")
        if anchor:
            print(f"ratio mlflow/shoal start-up p50: "
                  f"{statistics.median(samples['mlflow']) / shoal_p50:.1f}x")
        print(f"targets: shoal <= 1 s, <= 300 MB resident  (rounds={args.rounds}, "
              f"settle={args.settle:g} s)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --- metrics through the server --------------------------------------------------------------

def _shoal_log(url: str, token: str, home: Path, points: int, single: int,
               index: int) -> dict[str, float]:
    """Run.log_metric x *points* + flush through the server; one add_metrics of all points;
    *single* one-point add_metrics calls (one request each)."""
    import shoal
    from shoal.core.experiments import MetricPoint
    from shoal.experiments import Run

    session = shoal.Session(home=str(home), server_url=url, token=token)
    try:
        store = session.runs
        with Run(experiment_name="bench", run_name=f"log-{index}",
                 sagemaker_session=session) as run:
            run.log_metric("warm-up", 0.0)
            run.flush()
            t = time.perf_counter()
            for step in range(points):
                run.log_metric("loss", 1.0 / (step + 1), step=step)
            run.flush()
            buffered = time.perf_counter() - t
        stored = store.get_metrics(f"run:bench/log-{index}", "loss")
        assert len(stored) == points, (len(stored), points)
        now = time.time()
        batch = [MetricPoint("loss", 1.0 / (i + 1), now + i * 1e-6, i) for i in range(points)]
        owner = f"run:bench/batch-{index}"
        t = time.perf_counter()
        store.add_metrics(owner, batch)
        one_call = time.perf_counter() - t
        t = time.perf_counter()
        for i in range(single):
            store.add_metrics(f"run:bench/single-{index}", [MetricPoint("loss", 1.0, now, i)])
        single_s = time.perf_counter() - t
        assert len(store.get_metrics(owner)) == points
        return {"buffered_s": buffered, "one_call_s": one_call, "single_s": single_s}
    finally:
        session.close()


def cmd_metrics(args: argparse.Namespace) -> None:
    python = mlflow_python()
    version = mlflow_version(python)
    tmp = Path(tempfile.mkdtemp(prefix="server-metrics-", dir=scratch()))
    servers: list[Server] = []
    try:
        token = shoal_token(tmp / "shoal")
        shoal_srv = start_shoal(tmp / "shoal")
        servers.append(shoal_srv)
        mlflow_srv = start_mlflow(python, tmp / "mlflow")
        servers.append(mlflow_srv)
        client_home = tmp / "client"
        shoal_runs: list[dict[str, float]] = []
        mlflow_runs: list[dict[str, float]] = []
        for r in range(args.rounds):
            pair = [lambda r=r: shoal_runs.append(_shoal_log(
                        shoal_srv.url, token, client_home, args.points, args.single, r)),
                    lambda: mlflow_runs.append(mlflow_log(
                        python, mlflow_srv.url, args.points, 1000, args.single))]
            for step in (pair if r % 2 == 0 else pair[::-1]):
                step()
        n = args.points
        sb = statistics.median(x["buffered_s"] for x in shoal_runs)
        so = statistics.median(x["one_call_s"] for x in shoal_runs)
        ss = statistics.median(x["single_s"] for x in shoal_runs) / max(args.single, 1)
        mb = statistics.median(x["batch_s"] for x in mlflow_runs)
        ms = statistics.median(x["single_s"] for x in mlflow_runs) / max(args.single, 1)
        _header(f"MLflow {version} (mlflow server, SQLite, defaults)")
        print(f"shoal  Run.log_metric x {n:,} + flush (1,000-point POSTs): p50 {sb * 1e3:8.1f} ms"
              f"  = {n / sb:9,.0f} points/s")
        print(f"shoal  HttpRunStore.add_metrics, {n:,} points in one call: p50 {so * 1e3:8.1f} ms"
              f"  = {n / so:9,.0f} points/s")
        print(f"mlflow MlflowClient.log_batch x {n // 1000} of 1,000:          p50 "
              f"{mb * 1e3:8.1f} ms  = {n / mb:9,.0f} points/s")
        print(f"single point per request: shoal add_metrics p50 {ss * 1e3:6.2f} ms/point "
              f"({1 / ss:,.0f}/s); mlflow log_metric {ms * 1e3:6.2f} ms/point ({1 / ms:,.0f}/s)"
              f"  (n={args.single} each)")
        print(f"ratio mlflow log_batch / shoal Run.log_metric: {mb / sb:.1f}x  "
              f"(target >= 5x)   single requests mlflow/shoal: {ms / ss:.1f}x  "
              f"(rounds={args.rounds})")
    finally:
        for server in servers:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


# --- jobs list and status reads -------------------------------------------------------------

def cmd_jobs(args: argparse.Namespace) -> None:
    from _server_jobs import run_jobs_bench

    run_jobs_bench(args, _header)


def cmd_framework(args: argparse.Namespace) -> None:
    from _server_framework import run_framework_bench

    run_framework_bench(args, _header)


def cmd_remote(args: argparse.Namespace) -> None:
    from _server_remote import run_remote_bench

    run_remote_bench(args, _header)


def cmd_invoke(args: argparse.Namespace) -> None:
    from _server_invoke import run_invoke_bench

    run_invoke_bench(args, _header)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("startup", help="start-up until it answers, memory at rest")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--settle", type=float, default=3.0, help="seconds after answering")
    p.add_argument("--without-mlflow", action="store_true",
                   help="skip the MLflow anchor (quick reruns; the floors stay)")
    p.set_defaults(fn=cmd_startup)
    p = sub.add_parser("metrics", help="10,000 metric points through the server")
    p.add_argument("--points", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--single", type=int, default=200, help="single-point requests per round")
    p.set_defaults(fn=cmd_metrics)
    p = sub.add_parser("jobs", help="jobs list of 100 out of N jobs; status reads per second")
    p.add_argument("--jobs", type=int, default=100_000)
    p.add_argument("--requests", type=int, default=50)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--clients", type=int, default=2, help="client processes for status reads")
    p.add_argument("--windows", type=int, default=3, help="status-read windows per side")
    p.set_defaults(fn=cmd_jobs)
    p = sub.add_parser("framework", help="the same routes on FastAPI and on Starlette")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=5)
    p.set_defaults(fn=cmd_framework)
    p = sub.add_parser("remote", help="warm @remote and map through the server vs embedded")
    p.add_argument("--calls", type=int, default=50, help="warm round trips per side per round")
    p.add_argument("--map", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.set_defaults(fn=cmd_remote)
    p = sub.add_parser("invoke", help="Predictor direct vs through the server's invocations")
    p.add_argument("--calls", type=int, default=200, help="calls per side per round")
    p.add_argument("--rounds", type=int, default=3)
    p.set_defaults(fn=cmd_invoke)
    args = parser.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
