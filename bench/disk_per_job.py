"""Disk per trivial job: N cold ``@remote`` calls on a fresh SHOAL_HOME, and what they leave.

Anchor: the content, i.e. the bytes of each job's payloads (function, arguments and result:
pickles and their metadata). Measured over the whole home (artifacts, database, work
directories, ``run/`` files), as the home grows from after one warm-up job (schema, launcher)
to after the N jobs, whose supervisors have all exited: apparent bytes (``du --apparent-size``,
directories included), disk blocks (``du -s``, ``st_blocks``), files and directories.

    .venv/bin/python bench/disk_per_job.py [--jobs 200] [--src DIR]

``--src`` measures the shoal whose sources are in DIR (e.g. an older checkout's ``src``, for
a before/after comparison); the default is this checkout's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import scratch

CHILD = r"""
import json, os, sys, time
import shoal
from shoal import remote
from shoal.core import JobQuery

def add(a, b):
    return a + b

n, stage = int(sys.argv[1]), sys.argv[2]
session = shoal.Session()
with shoal.use(session):
    f = remote(add, job_name_prefix=f"bench-{stage}")
    for i in range(n):
        assert f(i, 1) == i + 1
records = session.metadata.list_jobs(JobQuery(name_prefix=f"bench-{stage}", limit=n + 10))
assert len(records) == n, len(records)
content = 0
for r in records:
    for kind in ("function", "arguments", "results"):
        p = session.jobs.get_payload(r.name, kind)
        content += len(p.data) + len(p.metadata)
pids = [int(r.handle["pid"]) for r in records if r.handle.get("pid")]
deadline = time.monotonic() + 60  # every supervisor has exited (it tidies up on its way out)
while any(os.path.exists(f"/proc/{p}") for p in pids) and time.monotonic() < deadline:
    time.sleep(0.05)
session.backend.shutdown_launcher()
session.close()
print(json.dumps({"content": content, "jobs": n}))
"""

AREAS = ("artifacts", "database", "work", "run", "other")


def area(home: Path, path: Path) -> str:
    rel = path.relative_to(home).parts
    if not rel:
        return "other"
    if rel[0].startswith("shoal.db"):
        return "database"
    return rel[0] if rel[0] in ("artifacts", "work", "run") else "other"


def measure(home: Path) -> dict[str, dict[str, int]]:
    """Per area: apparent bytes, block bytes, files, directories (the home itself left out)."""
    out = {a: {"apparent": 0, "blocks": 0, "files": 0, "dirs": 0} for a in AREAS}
    seen: set[tuple[int, int]] = set()
    for root, dirs, files in os.walk(home):
        for name in dirs + files:
            path = Path(root) / name
            st = path.lstat()
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            a = out[area(home, path)]
            a["apparent"] += st.st_size
            a["blocks"] += st.st_blocks * 512
            a["files" if name in files else "dirs"] += 1
    return out


def checkpoint(home: Path) -> None:
    """Fold SQLite's write-ahead log into the database file, so both measures see the rows."""
    with sqlite3.connect(home / "shoal.db") as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def run_jobs(home: Path, n: int, stage: str, src: str) -> dict[str, int]:
    env = {**os.environ, "SHOAL_HOME": str(home), "PYTHONPATH": src, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD, str(n), stage], env=env,
                          capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        sys.exit(f"the {n} {stage} job(s) failed (exit {done.returncode}):\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--src", default=str(Path(__file__).resolve().parents[1] / "src"))
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=scratch()) as tmp:  # $SHOAL_HOME/bench, or ~/.cache
        home = Path(tmp) / "home"
        run_jobs(home, 1, "warmup", args.src)
        checkpoint(home)
        before = measure(home)
        ran = run_jobs(home, args.jobs, "trivial", args.src)
        checkpoint(home)
        after = measure(home)
    n = ran["jobs"]
    per = {a: {k: (after[a][k] - before[a][k]) / n for k in before[a]} for a in AREAS}
    total = {k: sum(per[a][k] for a in AREAS) for k in ("apparent", "blocks", "files", "dirs")}
    report = {"jobs": n, "src": args.src, "cpu": cpu_model(), "content_per_job": ran["content"] / n,
              "per_job": per, "total_per_job": total,
              "home_before": {k: sum(before[a][k] for a in AREAS) for k in total},
              "home_after": {k: sum(after[a][k] for a in AREAS) for k in total}}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{n} trivial @remote jobs, shoal from {args.src}, CPU {report['cpu']}")
    print(f"content (anchor): {report['content_per_job']:.0f} bytes per job "
          "(function, arguments, result: pickles + metadata)")
    print(f"home before: {report['home_before']['blocks'] / 1024:.0f} KiB in blocks, "
          f"{report['home_before']['files']} files, {report['home_before']['dirs']} dirs; "
          f"after: {report['home_after']['blocks'] / 1024:.0f} KiB, "
          f"{report['home_after']['files']} files, {report['home_after']['dirs']} dirs")
    print(f"{'per job':<10} {'apparent B':>11} {'blocks B':>9} {'files':>6} {'dirs':>5}")
    for a in (*AREAS, "total"):
        row = total if a == "total" else per[a]
        print(f"{a:<10} {row['apparent']:>11.0f} {row['blocks']:>9.0f} {row['files']:>6.2f} "
              f"{row['dirs']:>5.2f}")
    ratio = total["blocks"] / report["content_per_job"]
    print(f"disk blocks per job / content: {ratio:.1f}x")


if __name__ == "__main__":
    main()
