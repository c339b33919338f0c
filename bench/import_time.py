"""`import shoal`: wall time against `python -c pass` (the floor), and what it must not import.

    .venv/bin/python bench/import_time.py [--runs 20]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

HEAVY = ("torch", "ray", "fastapi", "uvicorn", "sqlalchemy", "fsspec", "pydantic_settings")


def wall(code: str, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    base = wall("pass", args.runs)
    imp = wall("import shoal", args.runs)
    loaded = subprocess.run(
        [sys.executable, "-c", "import shoal, sys; print(' '.join(sorted(sys.modules)))"],
        capture_output=True, text=True, check=True).stdout.split()
    heavy = [m for m in HEAVY if m in loaded]
    print(f"python -c pass:      p50 {base * 1e3:6.1f} ms")
    print(f"python -c 'import shoal': p50 {imp * 1e3:6.1f} ms  (import itself ≈ "
          f"{(imp - base) * 1e3:.1f} ms; target < 150 ms)")
    print(f"heavy modules imported: {heavy or 'none'}")


if __name__ == "__main__":
    main()
