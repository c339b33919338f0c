"""Cost of experiment metrics: 10,000 ``log_metric`` calls inside a ``@remote`` job.

Compares the same job with and without the logging (both inside ``with Run(...)``, so both
get the run context) and reports the seconds the logging adds. Anchor, measured in the same
run: a bare ``sqlite3`` ``executemany`` of the same 10,000 rows in one transaction (the floor
for storing them durably in SQLite).

    .venv/bin/python bench/metrics.py [--points 10000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from _common import cpu_model, scratch, stop_background


def train(points: int, log: bool) -> int:
    """The job: a loop that computes a loss per step and (or not) logs it."""
    run = None
    if log:
        from shoal.experiments import load_run

        run = load_run()
    for step in range(points):
        loss = 1.0 / (step + 1)
        if run is not None:
            run.log_metric("loss", loss, step=step)
    if run is not None:
        run.close()
    return points


def job_seconds(session, points: int, log: bool, index: int) -> float:
    from shoal import remote
    from shoal.experiments import Run

    with Run(experiment_name="bench", run_name=f"{'log' if log else 'nolog'}-{index}",
             sagemaker_session=session) as run:
        t = time.perf_counter()
        assert remote(sagemaker_session=session)(train)(points, log) == points
        elapsed = time.perf_counter() - t
    if log:
        stored = session.metadata.get_metrics(session.metadata.get_run("bench",
                                                                       run.run_name).metrics_owner)
        assert len(stored) == points, (len(stored), points)
    return elapsed


def in_process_seconds(session, points: int, index: int) -> float:
    from shoal.experiments import Run

    with Run(experiment_name="bench", run_name=f"local-{index}",
             sagemaker_session=session) as run:
        run.log_metric("warm-up", 0.0)
        run.flush()
        t = time.perf_counter()
        for step in range(points):
            run.log_metric("loss", 1.0 / (step + 1), step=step)
        run.flush()
        return time.perf_counter() - t


def floor_seconds(tmp: Path, points: int, index: int) -> float:
    """sqlite3 executemany of *points* rows into an indexed table, one transaction (WAL)."""
    path = tmp / f"floor-{index}.db"
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("CREATE TABLE metrics (id INTEGER PRIMARY KEY, owner TEXT, name TEXT, "
                     "value REAL, step INTEGER, timestamp REAL)")
        conn.execute("CREATE INDEX ix ON metrics (owner, name)")
        now = time.time()
        t = time.perf_counter()
        rows = [("run:bench/floor", "loss", 1.0 / (i + 1), i, now + i * 1e-6)
                for i in range(points)]
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany("INSERT INTO metrics (owner, name, value, step, timestamp) "
                         "VALUES (?, ?, ?, ?, ?)", rows)
        conn.execute("COMMIT")
        return time.perf_counter() - t
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--points", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    import shoal

    tmp = Path(tempfile.mkdtemp(prefix="shoal-bench-", dir=scratch()))
    session = shoal.Session(home=str(tmp / "home"))
    try:
        job_seconds(session, 10, True, -1)  # starts the launcher, creates the database
        with_log, without, local, floor = [], [], [], []
        for i in range(args.repeats):  # interleaved, so machine noise hits both alike
            without.append(job_seconds(session, args.points, False, i))
            with_log.append(job_seconds(session, args.points, True, i))
            local.append(in_process_seconds(session, args.points, i))
            floor.append(floor_seconds(tmp, args.points, i))
        w, wo = statistics.median(with_log), statistics.median(without)
        added, f50, l50 = w - wo, statistics.median(floor), statistics.median(local)
        n = args.points
        print(f"CPU: {cpu_model()}")
        print(f"job without logging:                  p50 {wo * 1e3:8.1f} ms")
        print(f"job with {n:,} log_metric calls:     p50 {w * 1e3:8.1f} ms")
        print(f"added by the logging:                 {added * 1e3:8.1f} ms  (target <= 2000 ms)")
        print(f"in process, {n:,} calls + flush:      p50 {l50 * 1e3:8.1f} ms")
        print(f"floor: sqlite3 executemany {n:,} rows: p50 {f50 * 1e3:8.1f} ms")
        print(f"ratio added/floor: {added / f50:.1f}x   in-process/floor: {l50 / f50:.1f}x  "
              f"(repeats={args.repeats})")
    finally:
        stop_background(session)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
