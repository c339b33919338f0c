"""The console's jobs page over a large history (issue #21: 100,000 jobs paint in < 1 s):
time from navigation to the first row shown, in headless Chromium, for every sort, both
orders, a tag filter (common and rare), a page deep in the list, and the store's
``list_jobs`` alone for each.

    .venv/bin/python bench/console_jobs.py [--jobs 100000] [--rounds 5]

The jobs go into a ``shoal ui`` home's SQLite store with ``create_jobs`` (batches of 1,000;
each spec has two tags, ``team`` one of 10 values and ``run`` unique), 90 % of them then
ended with a duration of their own (written into the table), before ``shoal ui`` starts. Each round opens a fresh browser context (empty cache).
Chromium: ``SHOAL_TEST_CHROMIUM`` or ``chromium`` on PATH (``scripts/chromium.sh``).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from _common import cpu_model, scratch
from console import _painted, start_ui

QUERIES = {
    "newest first (default)": "",
    "name A-Z": "sort=name&order=asc",
    "name Z-A": "sort=name",
    "status A-Z": "sort=status&order=asc",
    "status Z-A": "sort=status",
    "longest first": "sort=duration",
    "shortest first": "sort=duration&order=asc",
    "oldest first": "sort=created&order=asc",
    "tag team=t3 (1 in 10)": "tag=team%3Dt3",
    "tag run=r77777 (1 job)": "tag=run%3Dr77777",
    "status=failed, longest first": "status=failed&sort=duration",
}


class _Clock:
    def __init__(self, at: datetime) -> None:
        self.at = at

    def now(self) -> datetime:
        return self.at


def load(home: Path, jobs: int) -> float:
    import sqlite3

    from shoal.core import JobSpec
    from shoal.core.jobs import JobName
    from shoal.storage.sql import SqlMetadataStore

    t0 = time.perf_counter()
    clock = _Clock(datetime(2026, 1, 1, tzinfo=UTC))
    store = SqlMetadataStore.open(f"sqlite:///{home / 'shoal.db'}", clock=clock, create=True)
    try:
        for start in range(0, jobs, 1000):
            batch = range(start, min(jobs, start + 1000))
            clock.at += timedelta(seconds=1)
            store.create_jobs([JobSpec(name=JobName(f"bench-{i:06d}"), instance_type="ml.m5.large",
                                       tags=(("team", f"t{i % 10}"), ("run", f"r{i}")))
                               for i in batch], key_salts=["s"] * len(batch), backend="local")
    finally:
        store.close()
    # Their ends, written straight into the table (270,000 single transitions would take
    # longer than the measurement): 90 % ended, each with its own duration.
    rnd = random.Random(7)
    ends = ("completed", "completed", "failed", "stopped")
    db = sqlite3.connect(home / "shoal.db")
    with db:
        rows = db.execute("SELECT name, created_at FROM jobs").fetchall()
        db.executemany("UPDATE jobs SET status = ?, started_at = ?, ended_at = ? WHERE name = ?",
                       [(rnd.choice(ends), at + 1, at + 1 + rnd.uniform(0.01, 5000), name)
                        for name, at in rows if rnd.random() < 0.9])
    db.close()
    return time.perf_counter() - t0


def store_ms(home: Path, query: str) -> float:
    """``list_jobs`` of the page's query on the store in this process (ms, best of 3)."""
    from urllib.parse import parse_qsl

    from shoal.console._jobs import JobsView
    from shoal.storage.sql import SqlMetadataStore

    view = JobsView(**dict(parse_qsl(query)))
    store = SqlMetadataStore.open(f"sqlite:///{home / 'shoal.db'}")
    try:
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            store.list_jobs(view.query())
            best = min(best, time.perf_counter() - t0)
    finally:
        store.close()
    return best * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--keep", type=Path, help="reuse (or fill once) this home")
    args = p.parse_args()
    from playwright.sync_api import sync_playwright

    chromium = os.environ.get("SHOAL_TEST_CHROMIUM") or shutil.which("chromium") or ""
    home = args.keep or Path(tempfile.mkdtemp(prefix="console-jobs-", dir=scratch()))
    home.mkdir(parents=True, exist_ok=True)
    home.chmod(0o700)
    print(f"# {cpu_model()}, load {os.getloadavg()[0]:.1f}, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    if not (home / "shoal.db").exists():
        print(f"loaded {args.jobs} jobs in {load(home, args.jobs):.0f} s")
    ui = start_ui(home)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, headless=True)
            # a page deep in the list: the 50 after the 50,000th job, newest first
            deep = f"after=bench-{args.jobs // 2:06d}"
            for label, query in {**QUERIES, "a page deep in the list": deep}.items():
                times = [_painted(browser, f"{ui.url}/jobs?{query}",
                                  lambda page: page.wait_for_selector("#jobs tbody tr[data-job]"))
                         for _ in range(args.rounds)]
                print(f"| {label} | {statistics.median(times):.2f} s "
                      f"({', '.join(f'{t:.2f}' for t in times)}) | {store_ms(home, query):.0f} ms |",
                      flush=True)
            browser.close()
    finally:
        ui.stop()
        if args.keep is None:
            shutil.rmtree(home, ignore_errors=True)
    print(f"# load {os.getloadavg()[0]:.1f} at the end", file=sys.stderr)


if __name__ == "__main__":
    main()
