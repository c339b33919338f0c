"""Environments: cold build of numpy + pandas vs raw uv and pip, and the cost of a cache hit.

    .venv/bin/python bench/envs.py [--rounds 5] [--calls 30] [--skip-pip]

Cold builds install from the local package caches (uv's and pip's), as on a developer laptop:
a warm-up round fills them first, so no figure includes a download. The sides alternate
within each round (uv first in even rounds, shoal first in odd ones), the bytecode shoal
compiles in the background after a build is waited for before the next sample, and every
figure is a median of ``--rounds`` (>= 5) samples. The cache hit is a @remote call whose
requirements are numpy + pandas, interleaved with calls without requirements.
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

from _common import cpu_model, scratch, stop_background, wait_background

from shoal.envs import UvEnvBuilder, find_uv

PKGS = ["numpy", "pandas"]


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def raw_uv(tmp: Path) -> float:
    uv, venv = find_uv(), tmp / f"raw-{time.monotonic_ns()}"

    def run() -> None:
        subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True)
        subprocess.run([uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"),
                        *PKGS], check=True)

    try:
        return timed(run)
    finally:
        shutil.rmtree(venv, ignore_errors=True)


def raw_pip(tmp: Path) -> float:
    venv = tmp / f"pip-{time.monotonic_ns()}"

    def run() -> None:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                        *PKGS], check=True)

    try:
        return timed(run)
    finally:
        shutil.rmtree(venv, ignore_errors=True)


def shoal_cold(tmp: Path) -> float:
    root = tmp / f"shoal-{time.monotonic_ns()}"
    builder = UvEnvBuilder(root)
    try:
        return timed(lambda: builder.ensure("\n".join(PKGS), base_dir=tmp))
    finally:
        wait_background(str(root))  # its background compileall must not overlap a sample
        shutil.rmtree(root, ignore_errors=True)


def dispatch(session, deps: str | None, calls: int) -> list[float]:  # type: ignore[no-untyped-def]
    from shoal import remote

    def trivial():
        return 1

    f = remote(sagemaker_session=session, dependencies=deps)(trivial)
    return [timed(f) for _ in range(calls)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--skip-pip", action="store_true")
    args = parser.parse_args()
    if args.rounds < 5:
        parser.error("--rounds must be at least 5: a median of fewer samples flatters")
    tmp = Path(tempfile.mkdtemp(prefix="shoal-bench-envs-", dir=scratch()))
    try:
        raw_uv(tmp), shoal_cold(tmp)  # fill uv's cache
        if not args.skip_pip:
            raw_pip(tmp)  # fill pip's cache
        uv_s: list[float] = []
        sh_s: list[float] = []
        pip_s: list[float] = []
        for r in range(args.rounds):
            if r % 2 == 0:
                uv_s.append(raw_uv(tmp))
                sh_s.append(shoal_cold(tmp))
            else:
                sh_s.append(shoal_cold(tmp))
                uv_s.append(raw_uv(tmp))
            if not args.skip_pip:
                pip_s.append(raw_pip(tmp))
        uv_t, sh_t = statistics.median(uv_s), statistics.median(sh_s)
        print(f"CPU: {cpu_model()}")
        print(f"cold numpy+pandas (median of {args.rounds}, interleaved): raw uv venv+install "
              f"{uv_t:6.2f} s | shoal build (resolve+lock+venv+sync) {sh_t:6.2f} s | ratio "
              f"{sh_t / uv_t:.2f}x (target <= 1.3x)")
        if pip_s:
            pip_t = statistics.median(pip_s)
            print(f"                   python -m venv + pip install {pip_t:6.2f} s | pip/shoal "
                  f"{pip_t / sh_t:.1f}x (target >= 10x)")
        hit_rate(tmp, args.rounds, args.calls)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def hit_rate(tmp: Path, rounds: int, calls: int) -> None:
    import shoal

    session = shoal.Session(home=str(tmp / "home"))
    req = tmp / "requirements.txt"
    req.write_text("\n".join(PKGS) + "\n")
    try:
        dispatch(session, None, 1)
        dispatch(session, str(req), 1)  # builds the job environment once
        wait_background(str(tmp / "home"))
        none: list[float] = []
        hit: list[float] = []
        for _ in range(rounds):
            none += dispatch(session, None, max(1, calls // rounds))
            hit += dispatch(session, str(req), max(1, calls // rounds))
    finally:
        stop_background(session)
    n50, h50 = statistics.median(none), statistics.median(hit)
    print(f"trivial @remote p50: no dependencies {n50 * 1e3:6.1f} ms | numpy+pandas env cache "
          f"hit {h50 * 1e3:6.1f} ms | added {(h50 - n50) * 1e3:5.1f} ms (target <= 50 ms)")


if __name__ == "__main__":
    main()
