"""The ray backend against raw Ray: dispatch latency of one trivial call, and map throughput.

Raw Ray: ``ray.get(f.remote())`` of the same function on the same cluster (warm workers), and
``ray.get([f.remote(i) for i in range(n)])``. shoal: ``@remote`` / ``RemoteExecutor.map``
with ``SHOAL_BACKEND=ray`` on that cluster, with the stores on this machine (SQLite + file://,
allowed on a one-node cluster). Every shoal call is still a job: its record and transitions,
signed payloads and result, and its log.

Raw Ray runs first (its idle workers hold no resources); shoal's warm supervisor actors then
hold the cluster's CPUs until they idle out, so they run second. Both warm up before timing.
Starts a one-node cluster with 'shoal ray up' under a scratch home and stops it afterwards.

    .venv/bin/python bench/ray_backend.py [--calls 50] [--map 2000] [--num-cpus 2]
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

from _common import scratch


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--map", type=int, default=2000)
    ap.add_argument("--num-cpus", type=int, default=2)
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
        session.close()
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        _shoal_ray(home, "down")
    rp50, sp50 = statistics.median(r_times), statistics.median(s_times)
    print(f"dispatch p50: raw ray {rp50 * 1e3:.2f} ms, shoal {sp50 * 1e3:.2f} ms "
          f"({sp50 / rp50:.2f}x; target <= 3x); p90 raw {pct(r_times, 0.9) * 1e3:.2f} ms, "
          f"shoal {pct(s_times, 0.9) * 1e3:.2f} ms; {args.calls} calls")
    print(f"map throughput: raw ray {r_rate:.0f} tasks/s, shoal {s_rate:.0f} jobs/s "
          f"({s_rate / r_rate:.2f}x; target >= 0.5x) over {args.map} calls, "
          f"{args.num_cpus} CPUs")


if __name__ == "__main__":
    main()
