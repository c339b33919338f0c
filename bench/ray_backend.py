"""The ray backend against raw Ray: dispatch latency of one trivial call, and map throughput.

Raw Ray: ``ray.get(f.remote())`` of the same function on the same cluster (warm workers), and
``ray.get([f.remote(i) for i in range(n)])``. shoal: ``@remote`` / ``RemoteExecutor.map``
with ``SHOAL_BACKEND=ray`` on that cluster, with the stores on this machine (SQLite + file://,
allowed on a one-node cluster). Every shoal call is still a job: its record and transitions,
signed payloads and result, and its log.

Raw Ray runs first (its idle workers hold no resources); shoal's warm supervisor actors then
hold the cluster's CPUs until they idle out, so they run second. Both warm up before timing.
Starts a one-node cluster with 'shoal ray up' under a scratch home and stops it afterwards.

Then (``--lost-node``, on by default) the time from a killed node to the retried attempt of
the job that ran there running on another node: two more nodes join, a job with
``max_retry_attempts=2`` runs on one, that node is killed (SIGKILL, as a crash), and the clock
stops when the job's record shows attempt 2 running. A cluster of several nodes needs shared
stores: a throwaway PostgreSQL (scripts/postgres.sh) and a moto S3 server.

    .venv/bin/python bench/ray_backend.py [--calls 50] [--map 2000] [--num-cpus 2]
                                          [--no-lost-node]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import cpu_model, scratch

_scratch = scratch  # lost_node's own 'scratch' (its directory) hides the function


def trivial(x):
    return x + 1


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _shoal_ray(home: Path, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "shoal.cli", "--home", str(home), "ray", *args],
                   check=True, capture_output=True, timeout=300)


def raw_ray(calls: int, n_map: int) -> tuple[list[float], float]:
    import ray

    f = ray.remote(num_cpus=1)(trivial)
    ray.get([f.remote(i) for i in range(50)])  # start and warm the workers
    times = []
    for i in range(calls):
        t = time.perf_counter()
        ray.get(f.remote(i))
        times.append(time.perf_counter() - t)
    t = time.perf_counter()
    assert ray.get([f.remote(i) for i in range(n_map)]) == [i + 1 for i in range(n_map)]
    return times, n_map / (time.perf_counter() - t)


def shoal_ray(session, calls: int, n_map: int, parallel: int) -> tuple[list[float], float]:
    import shoal

    with shoal.use(session):
        fn = shoal.remote(trivial)
        fn(0)  # connect, and start a warm supervisor actor
        fn(0)
        times = []
        for i in range(calls):
            t = time.perf_counter()
            assert fn(i) == i + 1
            times.append(time.perf_counter() - t)
        with shoal.RemoteExecutor(max_parallel_jobs=parallel) as ex:
            # Start the other warm actors (as raw Ray's warm-up starts its workers).
            assert list(ex.map(trivial, range(200))) == [i + 1 for i in range(200)]
            t = time.perf_counter()
            assert list(ex.map(trivial, range(n_map))) == [i + 1 for i in range(n_map)]
            rate = n_map / (time.perf_counter() - t)
        return times, rate


def _first_attempt_blocks(marker: str) -> str:
    import os
    import time

    if not os.path.exists(marker):
        with open(marker, "w") as f:
            f.write(os.environ["SHOAL_RAY_NODE_ID"])
        time.sleep(600)
    return os.environ["SHOAL_RAY_NODE_ID"]


def _moto(scratch: Path) -> tuple[subprocess.Popen, str]:
    import urllib.request

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{url}/moto-api/", timeout=1):
                return proc, url
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)  # bounded: moto starting


def lost_node(home: Path, address: str) -> float:
    """Seconds from killing the node a job runs on to its attempt 2 running elsewhere."""
    import json
    import os

    import boto3

    import shoal
    from shoal.storage.sql import upgrade_schema

    scratch = Path(tempfile.mkdtemp(prefix="shoal-bench-lost-", dir=_scratch()))
    scripts = Path(__file__).resolve().parents[1] / "scripts" / "postgres.sh"
    pg_url = subprocess.run(["bash", str(scripts), "start", str(scratch)], check=True,
                            capture_output=True, text=True, timeout=180).stdout.strip()
    moto, s3 = _moto(scratch)
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                      AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL_S3=s3)
    boto3.client("s3", endpoint_url=s3).create_bucket(Bucket="bench")
    try:
        upgrade_schema(pg_url)
        for _ in range(2):
            _shoal_ray(home, "up", "--address", address, "--num-cpus", "1",
                       "--resources", json.dumps({"spare": 1}))
        session = shoal.Session(home=str(home), backend="ray", ray_address=address,
                                metadata_url=pg_url, artifact_url="s3://bench/root",
                                ray_resources={"spare": 1}, ray_keep_alive_seconds=0)
        marker = scratch / "first-node"
        with shoal.use(session), shoal.RemoteExecutor(max_retry_attempts=2) as ex:
            future = ex.submit(_first_attempt_blocks, str(marker))
            while not (future.job_name and marker.exists()
                       and session.jobs.get(future.job_name).status == "running"):
                time.sleep(0.1)  # bounded by the job's start
            node = marker.read_text()
            import ray

            [entry] = [n for n in ray.nodes() if n["NodeID"] == node]
            nodes = json.loads((home / "ray" / "nodes.json").read_text())
            [tag] = [n["tag"] for n in nodes
                     if entry["ObjectStoreSocketName"].startswith(n["temp_dir"])]
            started = time.monotonic()
            _shoal_ray(home, "down", "--node", tag, "--force")
            while True:
                record = session.jobs.get(future.job_name)
                if record.attempt >= 2 and record.status in ("running", "completed"):
                    took = time.monotonic() - started
                    break
                session.jobs.reap()  # what a waiting client does every half second
                time.sleep(0.2)
            assert future.result(timeout=300) != node
        session.close()
        return took
    finally:
        moto.kill()
        subprocess.run(["bash", str(scripts), "stop", str(scratch)], check=False,
                       capture_output=True, timeout=120)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--map", type=int, default=2000)
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--no-lost-node", dest="lost_node", action="store_false")
    args = ap.parse_args()
    import shoal

    home = Path(tempfile.mkdtemp(prefix="shoal-bench-ray-", dir=scratch())) / "home"
    port = _free_port()
    _shoal_ray(home, "up", "--port", str(port), "--num-cpus", str(args.num_cpus),
               "--client-port", str(_free_port()))
    try:
        session = shoal.Session(home=str(home), backend="ray", ray_address=f"127.0.0.1:{port}")
        session.backend.alive_nodes()  # connect (ray.init) before anything is timed
        r_times, r_rate = raw_ray(args.calls, args.map)
        s_times, s_rate = shoal_ray(session, args.calls, args.map, args.num_cpus)
        session.backend.retire_warm()
        session.close()
        lost = lost_node(home, f"127.0.0.1:{port}") if args.lost_node else None
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        _shoal_ray(home, "down")
    rp50, sp50 = statistics.median(r_times), statistics.median(s_times)
    print(cpu_model())
    print(f"dispatch p50: raw ray {rp50 * 1e3:.2f} ms, shoal {sp50 * 1e3:.2f} ms "
          f"({sp50 / rp50:.2f}x; target <= 3x); p90 raw {pct(r_times, 0.9) * 1e3:.2f} ms, "
          f"shoal {pct(s_times, 0.9) * 1e3:.2f} ms; {args.calls} calls")
    print(f"map throughput: raw ray {r_rate:.0f} tasks/s, shoal {s_rate:.0f} jobs/s "
          f"({s_rate / r_rate:.2f}x; target >= 0.5x) over {args.map} calls, "
          f"{args.num_cpus} CPUs")
    if lost is not None:
        print(f"lost node: {lost:.1f} s from a killed node to the retried attempt running on "
              "another node (Ray's health checks declare a node dead after ~15-30 s)")


if __name__ == "__main__":
    main()
