"""Cold dispatch of a trivial @remote call vs the floor, a client process's first call, and
RemoteExecutor.map throughput.

Floor: a fresh interpreter per call that unpickles a function, calls it and pickles the
result (``subprocess.run([python, "-c", ...])``). Every figure is measured in the same run,
in interleaved rounds (floor, shoal woken by the supervisor, shoal polling as before the
wake-up existed), so machine noise hits all sides alike. A client process's first call is
reported on its own: in a new process with the home's launcher running, and on a fresh home
(the launcher starts first). Everything started is stopped at the end.

    .venv/bin/python bench/dispatch.py [--calls 40] [--first 5] [--map 200]
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

import cloudpickle
from _common import cpu_model, scratch, stop_background

FLOOR_CODE = """
import sys, cloudpickle
fn = cloudpickle.loads(open(sys.argv[1], "rb").read())
open(sys.argv[2], "wb").write(cloudpickle.dumps(fn(2, 3.0)))
"""

FIRST_CALL_CODE = """
import sys, time
import shoal
from shoal import remote
def trivial(x, y):
    return x / y
session = shoal.Session(home=sys.argv[1])
f = remote(sagemaker_session=session)(trivial)
t = time.perf_counter()
f(2, 3.0)
print(time.perf_counter() - t)
session.close()
"""


def trivial(x, y):
    return x / y


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def floor(calls: int, tmp: Path) -> list[float]:
    fn_file, out_file = tmp / "fn.pkl", tmp / "out.pkl"
    fn_file.write_bytes(cloudpickle.dumps(lambda x, y: x / y))
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", FLOOR_CODE, str(fn_file), str(out_file)],
                       check=True)
        cloudpickle.loads(out_file.read_bytes())
        times.append(time.perf_counter() - t)
    return times


def shoal_calls(session, calls: int, *, wake: bool) -> list[float]:
    from shoal import remote

    jobs = session.jobs
    saved = jobs._wake_dir
    jobs._wake_dir = saved if wake else None  # None: the bounded polling alone, as before
    try:
        f = remote(sagemaker_session=session)(trivial)
        times = []
        for _ in range(calls):
            t = time.perf_counter()
            f(2, 3.0)
            times.append(time.perf_counter() - t)
        return times
    finally:
        jobs._wake_dir = saved


def first_call(home: Path) -> float:
    """The first @remote call of a new client process on *home* (timed inside it)."""
    out = subprocess.run([sys.executable, "-c", FIRST_CALL_CODE, str(home)], check=True,
                         capture_output=True, text=True).stdout
    return float(out.split()[-1])


def fresh_home_first_call(tmp: Path, i: int) -> float:
    import shoal

    home = tmp / f"fresh-{i}"
    try:
        return first_call(home)
    finally:
        stop_background(shoal.Session(home=str(home)))
        shutil.rmtree(home, ignore_errors=True)


def shoal_map(session, n: int) -> float:
    from shoal import RemoteExecutor

    t = time.perf_counter()
    with RemoteExecutor(max_parallel_jobs=2, sagemaker_session=session) as e:
        results = list(e.map(trivial, range(n), [1.0] * n))
    elapsed = time.perf_counter() - t
    assert results == [float(i) for i in range(n)]
    return n / elapsed


def line(label: str, values: list[float]) -> str:
    return (f"{label}: p50 {statistics.median(values) * 1e3:7.1f} ms  "
            f"p90 {pct(values, 0.9) * 1e3:7.1f} ms  (n={len(values)})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--first", type=int, default=5, help="first-call samples of each kind")
    parser.add_argument("--map", type=int, default=200)
    args = parser.parse_args()
    import shoal

    tmp = Path(tempfile.mkdtemp(prefix="shoal-bench-", dir=scratch()))
    session = shoal.Session(home=str(tmp / "home"))
    try:
        shoal_calls(session, 1, wake=True)  # starts the launcher, as a session's first call
        fl: list[float] = []
        woken: list[float] = []
        polled: list[float] = []
        first_warm: list[float] = []
        first_fresh: list[float] = []
        rounds = 5
        for r in range(rounds):
            fl += floor(args.calls // rounds, tmp)
            woken += shoal_calls(session, args.calls // rounds, wake=True)
            polled += shoal_calls(session, args.calls // rounds, wake=False)
            if r < args.first:
                first_warm.append(first_call(tmp / "home"))
                first_fresh.append(fresh_home_first_call(tmp, r))
        f50 = statistics.median(fl)
        print(f"CPU: {cpu_model()}")
        print(line("floor  (fresh interpreter + cloudpickle)     ", fl))
        print(line("shoal  @remote, woken when the job ends      ", woken))
        print(line("shoal  @remote, polling the record (before)  ", polled))
        print(f"ratio  shoal/floor p50: woken {statistics.median(woken) / f50:.2f}x, polling "
              f"{statistics.median(polled) / f50:.2f}x  (target <= 3x)")
        print(line("first call, new process, launcher running    ", first_warm))
        print(line("first call, new process, fresh home          ", first_fresh))
        print(f"ratio  first call/floor p50: launcher running "
              f"{statistics.median(first_warm) / f50:.2f}x, fresh home "
              f"{statistics.median(first_fresh) / f50:.2f}x  (goal <= 2x)")
        rate = shoal_map(session, args.map)
        print(f"RemoteExecutor(max_parallel_jobs=2).map over {args.map} calls: "
              f"{rate:.0f} jobs/s")
    finally:
        stop_background(session)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
