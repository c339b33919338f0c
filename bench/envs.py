"""Environments: cold build of numpy + pandas vs raw uv and pip, and the cost of a cache hit.

    .venv/bin/python bench/envs.py [--calls 30] [--skip-pip]

Cold builds install from the local package caches (uv's and pip's), as on a developer laptop:
a warm-up round fills them first, so no figure includes a download.
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

from shoal.envs import UvEnvBuilder, find_uv

PKGS = ["numpy", "pandas"]



def _scratch() -> str:
    """Benchmarks run where a user's SHOAL_HOME lives (under $HOME), not in /tmp, whose
    directory operations are several times slower on these machines."""
    path = Path.home() / ".cache" / "shoal-bench"
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


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

    return timed(run)


def raw_pip(tmp: Path) -> float:
    venv = tmp / f"pip-{time.monotonic_ns()}"

    def run() -> None:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                        *PKGS], check=True)

    return timed(run)


def shoal_cold(tmp: Path) -> float:
    builder = UvEnvBuilder(tmp / f"shoal-{time.monotonic_ns()}")
    return timed(lambda: builder.ensure("\n".join(PKGS), base_dir=tmp))


def dispatch(session, deps: str | None, calls: int) -> float:  # type: ignore[no-untyped-def]
    from shoal import remote

    def trivial():
        return 1

    f = remote(sagemaker_session=session, dependencies=deps)(trivial)
    f()
    return statistics.median(timed(f) for _ in range(calls))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--skip-pip", action="store_true")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="shoal-bench-envs-", dir=_scratch()))
    try:
        raw_uv(tmp), shoal_cold(tmp)  # fill uv's cache
        if not args.skip_pip:
            raw_pip(tmp)  # fill pip's cache
        uv_t = statistics.median([raw_uv(tmp), raw_uv(tmp)])
        sh_t = statistics.median([shoal_cold(tmp), shoal_cold(tmp)])
        print(f"cold numpy+pandas: raw uv venv+install {uv_t:6.2f} s | shoal build "
              f"(resolve+lock+venv+sync) {sh_t:6.2f} s | ratio {sh_t / uv_t:.2f}x (target <= 1.3x)")
        if not args.skip_pip:
            pip_t = statistics.median([raw_pip(tmp), raw_pip(tmp)])
            print(f"                   python -m venv + pip install {pip_t:6.2f} s | pip/shoal "
                  f"{pip_t / sh_t:.1f}x (target >= 10x)")
        import shoal

        session = shoal.Session(home=str(tmp / "home"))
        req = tmp / "requirements.txt"
        req.write_text("six==1.16.0\n")
        try:
            none = dispatch(session, None, args.calls)
            hit = dispatch(session, str(req), args.calls)
        finally:
            session.backend.shutdown_launcher()
            session.close()
        print(f"trivial @remote p50: no dependencies {none * 1e3:6.1f} ms | env cache hit "
              f"{hit * 1e3:6.1f} ms | added {(hit - none) * 1e3:5.1f} ms (target <= 50 ms)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
