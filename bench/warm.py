"""Warm workers vs Ray's warm workers: round trip of a trivial call, and map throughput.

    .venv/bin/python bench/warm.py [--calls 100] [--map 2000]

Ray (installed by the ``bench`` extra) runs first and is shut down before shoal runs, so the two
do not compete for the two cores. shoal's figures include the durable job record (SQLite), the
signed payloads in the artifact store and the job's log, for every call.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def _scratch() -> str:
    """Benchmarks run where a user's SHOAL_HOME lives (under $HOME), not in /tmp, whose
    directory operations are several times slower on these machines."""
    path = Path.home() / ".cache" / "shoal-bench"
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


def trivial(x):
    return x


def ray_side(calls: int, n: int) -> tuple[float, float]:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        f = ray.remote(trivial)
        ray.get([f.remote(i) for i in range(50)])  # start and warm the workers
        times = []
        for i in range(calls):
            t = time.perf_counter()
            ray.get(f.remote(i))
            times.append(time.perf_counter() - t)
        t = time.perf_counter()
        assert ray.get([f.remote(i) for i in range(n)]) == list(range(n))
        rate = n / (time.perf_counter() - t)
        return statistics.median(times), rate
    finally:
        ray.shutdown()


def shoal_side(calls: int, n: int) -> tuple[float, float]:
    import shoal
    from shoal import RemoteExecutor

    tmp = Path(tempfile.mkdtemp(prefix="shoal-bench-warm-", dir=_scratch()))
    session = shoal.Session(home=str(tmp / "home"))
    try:
        with RemoteExecutor(max_parallel_jobs=1, keep_alive_period_in_seconds=120,
                            sagemaker_session=session) as e:
            list(e.map(trivial, range(5)))  # start a warm worker
            times = []
            for i in range(calls):
                t = time.perf_counter()
                e.submit(trivial, i).result()
                times.append(time.perf_counter() - t)
        with RemoteExecutor(max_parallel_jobs=2, keep_alive_period_in_seconds=120,
                            sagemaker_session=session) as e:
            list(e.map(trivial, range(10)))
            t = time.perf_counter()
            assert list(e.map(trivial, range(n))) == list(range(n))
            rate = n / (time.perf_counter() - t)
        return statistics.median(times), rate
    finally:
        session.backend.shutdown_launcher()
        session.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--map", type=int, default=2000)
    args = parser.parse_args()
    r50, rrate = ray_side(args.calls, args.map)
    s50, srate = shoal_side(args.calls, args.map)
    print(f"warm round trip p50: ray.get(f.remote(x)) {r50 * 1e3:6.2f} ms | shoal warm worker "
          f"{s50 * 1e3:6.2f} ms | ratio {s50 / r50:.1f}x (target <= 2x)")
    print(f"map over {args.map} trivial calls: Ray {rrate:7.0f} tasks/s | shoal "
          f"{srate:7.0f} jobs/s | shoal/Ray {srate / rrate:.2f} (target >= 0.5)")


if __name__ == "__main__":
    main()
