"""Cold dispatch of a trivial @remote call vs the floor, and RemoteExecutor.map throughput.

Floor: a fresh interpreter per call that unpickles a function, calls it and pickles the
result (``subprocess.run([python, "-c", ...])``), measured in the same run.

    .venv/bin/python bench/dispatch.py [--calls 40] [--map 200]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cloudpickle

FLOOR_CODE = """
import sys, cloudpickle
fn = cloudpickle.loads(open(sys.argv[1], "rb").read())
open(sys.argv[2], "wb").write(cloudpickle.dumps(fn(2, 3.0)))
"""



def _scratch() -> str:
    """Benchmarks run where a user's SHOAL_HOME lives (under $HOME), not in /tmp, whose
    directory operations are several times slower on these machines."""
    path = Path.home() / ".cache" / "shoal-bench"
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


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


def shoal_calls(session, calls: int) -> list[float]:
    from shoal import remote

    f = remote(sagemaker_session=session)(trivial)
    f(2, 3.0)  # starts the launcher once, as the first call of a session does
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        f(2, 3.0)
        times.append(time.perf_counter() - t)
    return times


def shoal_map(session, n: int) -> float:
    from shoal import RemoteExecutor

    t = time.perf_counter()
    with RemoteExecutor(max_parallel_jobs=2, sagemaker_session=session) as e:
        results = list(e.map(trivial, range(n), [1.0] * n))
    elapsed = time.perf_counter() - t
    assert results == [float(i) for i in range(n)]
    return n / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--map", type=int, default=200)
    args = parser.parse_args()
    import shoal

    tmp = Path(tempfile.mkdtemp(prefix="shoal-bench-", dir=_scratch()))
    session = shoal.Session(home=str(tmp / "home"))
    try:
        # Interleave rounds so machine noise hits both sides alike.
        fl, sh = [], []
        for _ in range(2):
            fl += floor(args.calls // 2, tmp)
            sh += shoal_calls(session, args.calls // 2)
        f50, s50 = statistics.median(fl), statistics.median(sh)
        print(f"floor  (fresh interpreter + cloudpickle): p50 {f50 * 1e3:7.1f} ms  "
              f"p90 {pct(fl, 0.9) * 1e3:7.1f} ms  (n={len(fl)})")
        print(f"shoal  @remote, durable record + signed:  p50 {s50 * 1e3:7.1f} ms  "
              f"p90 {pct(sh, 0.9) * 1e3:7.1f} ms  (n={len(sh)})")
        print(f"ratio  shoal/floor p50: {s50 / f50:.2f}x  (target <= 3x)")
        rate = shoal_map(session, args.map)
        print(f"RemoteExecutor(max_parallel_jobs=2).map over {args.map} calls: "
              f"{rate:.0f} jobs/s  (cores: {os.cpu_count()})")
    finally:
        session.backend.shutdown_launcher()
        session.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
