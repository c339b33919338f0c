"""`import shoal`: wall time against `python -c pass` (the floor), and what it must not import.

    .venv/bin/python bench/import_time.py [--runs 20]

The floor and the import alternate, one run of each per round, so machine noise hits both.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from _common import cpu_model

HEAVY = ("torch", "ray", "fastapi", "uvicorn", "sqlalchemy", "fsspec", "pydantic_settings")


def wall(code: str) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    bases: list[float] = []
    imps: list[float] = []
    wall("import shoal")  # the first import writes bytecode; not a sample
    for _ in range(args.runs):
        bases.append(wall("pass"))
        imps.append(wall("import shoal"))
    base, imp = statistics.median(bases), statistics.median(imps)
    diff = statistics.median(i - b for i, b in zip(imps, bases, strict=True))
    loaded = subprocess.run(
        [sys.executable, "-c", "import shoal, sys; print(' '.join(sorted(sys.modules)))"],
        capture_output=True, text=True, check=True).stdout.split()
    heavy = [m for m in HEAVY if m in loaded]
    print(f"CPU: {cpu_model()}")
    print(f"python -c pass:      p50 {base * 1e3:6.1f} ms  (n={len(bases)}, interleaved)")
    print(f"python -c 'import shoal': p50 {imp * 1e3:6.1f} ms  (import itself, median of "
          f"paired differences ≈ {diff * 1e3:.1f} ms; target < 150 ms)")
    print(f"heavy modules imported: {heavy or 'none'}")


if __name__ == "__main__":
    main()
