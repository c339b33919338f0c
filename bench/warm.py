"""Warm workers vs Ray's warm workers: round trip of a trivial call, and map throughput.

    .venv/bin/python bench/warm.py [--calls 100] [--map 2000] [--unbatched]

Ray (installed by the ``bench`` extra) runs first and is shut down before shoal runs, so the two
do not compete for the two cores. shoal's figures include the durable job record (SQLite), the
signed payloads in the artifact store and the job's log, for every call. ``map`` hands calls
that wait to a warm worker together (each still its own job); ``--unbatched`` also measures it
one call per hand-over (``chunksize=1``). The CPU per job of ``map`` (this process, and the
workers' supervisors and executors) comes from ``/proc``. The round trip is also timed for a
function imported from a module (``_warm_module``, as a user's code usually is), call by call
interleaved with the ``__main__`` one.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from _common import cpu_model, scratch, stop_background


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


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of *pid* so far (Linux /proc), 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _with_children(pids: set[int]) -> set[int]:
    """*pids* and their children (a warm worker's executor)."""
    out = set(pids)
    for pid in pids:
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    out |= {int(c) for c in f.read().split()}
        except OSError:
            continue
    return out


def _workers(session) -> set[int]:
    from shoal.core import JobQuery

    return _with_children({r.handle["pid"] for r in session.metadata.list_jobs(
        JobQuery(limit=100)) if r.handle.get("pid")})


def _timed_map(e, session, n: int, chunksize: int | None) -> tuple[float, float, float]:
    """Jobs per second, and CPU ms per job in this process and in the workers."""
    workers = _workers(session)
    before = {pid: _cpu_seconds(pid) for pid in workers}
    t, cpu = time.perf_counter(), time.process_time()
    assert list(e.map(trivial, range(n), chunksize=chunksize)) == list(range(n))
    rate = n / (time.perf_counter() - t)
    client = (time.process_time() - cpu) / n * 1e3
    worker = sum(_cpu_seconds(pid) - before.get(pid, 0.0)
                 for pid in workers | _workers(session)) / n * 1e3
    return rate, client, worker


def shoal_side(calls: int, n: int, unbatched: bool = False
               ) -> tuple[float, float, tuple[float, float, float], tuple[float, ...], float]:
    """p50 of a warm round trip (a function of ``__main__``), map's rate and CPU (batched,
    unbatched), and p50 of the same round trip of a function imported from a module,
    interleaved call by call with the first."""
    from _warm_module import trivial as module_trivial

    import shoal
    from shoal import RemoteExecutor

    tmp = Path(tempfile.mkdtemp(prefix="shoal-bench-warm-", dir=scratch()))
    session = shoal.Session(home=str(tmp / "home"))
    try:
        with RemoteExecutor(max_parallel_jobs=1, keep_alive_period_in_seconds=120,
                            sagemaker_session=session) as e:
            list(e.map(trivial, range(5)))  # start a warm worker
            times, from_module = [], []
            for i in range(calls):
                for fn, out in ((trivial, times), (module_trivial, from_module)):
                    t = time.perf_counter()
                    assert e.submit(fn, i).result() == i
                    out.append(time.perf_counter() - t)
        with RemoteExecutor(max_parallel_jobs=2, keep_alive_period_in_seconds=120,
                            sagemaker_session=session) as e:
            list(e.map(trivial, range(10)))
            batched = _timed_map(e, session, n, None)
            single = _timed_map(e, session, n, 1) if unbatched else ()
        return (statistics.median(times), batched[0], batched, single,
                statistics.median(from_module))
    finally:
        stop_background(session)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--map", type=int, default=2000)
    parser.add_argument("--unbatched", action="store_true",
                        help="also time map with chunksize=1 (one call per hand-over)")
    args = parser.parse_args()
    r50, rrate = ray_side(args.calls, args.map)
    s50, srate, batched, single, m50 = shoal_side(args.calls, args.map, args.unbatched)
    print(f"CPU: {cpu_model()}")
    print(f"warm round trip p50: ray.get(f.remote(x)) {r50 * 1e3:6.2f} ms | shoal warm worker "
          f"{s50 * 1e3:6.2f} ms | ratio {s50 / r50:.1f}x (target <= 2x)")
    print(f"  the same call of a function imported from a module: {m50 * 1e3:6.2f} ms | "
          f"{m50 / s50:.2f}x the __main__ function's (interleaved)")
    print(f"map over {args.map} trivial calls: Ray {rrate:7.0f} tasks/s | shoal "
          f"{srate:7.0f} jobs/s | shoal/Ray {srate / rrate:.2f} (target >= 0.5)")
    print(f"  CPU per job: this process {batched[1]:.2f} ms, warm workers {batched[2]:.2f} ms")
    if single:
        print(f"map, one call per hand-over (chunksize=1): {single[0]:7.0f} jobs/s | "
              f"shoal/Ray {single[0] / rrate:.2f} | CPU per job: this process "
              f"{single[1]:.2f} ms, warm workers {single[2]:.2f} ms")


if __name__ == "__main__":
    main()
