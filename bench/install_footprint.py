"""Install footprint per extra: packages and megabytes of a fresh virtualenv holding the wheel
with that extra (``uv pip install`` into ``uv venv``, torch the CPU build as in the Makefile).

    python bench/install_footprint.py [PROJECT_DIR] [EXTRA ...]

Prints one row per extra: packages, site-packages MB (``du -sm``), the uv binary's MB when the
venv has it, and the install's seconds (from a warm uv cache).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import scratch

EXTRAS = ["", "s3", "postgres", "serve", "bundle", "sklearn", "torch", "train", "experiments",
          "llm", "ray"]


def _uv() -> str:
    local = Path(sys.executable).with_name("uv")
    return str(local) if local.exists() else (shutil.which("uv") or "uv")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    links = env.get("PIP_FIND_LINKS")  # this machine's CPU torch (pip's config), for uv too
    if links and "UV_FIND_LINKS" not in env:
        env["UV_FIND_LINKS"] = links.replace(" ", ",")
    return env


def _du_mb(path: Path) -> int:
    out = subprocess.run(["du", "-sm", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def measure(wheel: Path, extra: str, constraints: Path, root: Path) -> dict[str, object]:
    venv = root / (extra or "base")
    subprocess.run([_uv(), "venv", "-q", "--python", sys.executable, str(venv)], check=True,
                   env=_env())
    spec = f"{wheel}[{extra}]" if extra else str(wheel)
    started = time.monotonic()
    subprocess.run([_uv(), "pip", "install", "-q", "--python", str(venv / "bin" / "python"),
                    "-c", str(constraints), spec], check=True, env=_env())
    seconds = time.monotonic() - started
    listing = subprocess.run([_uv(), "pip", "list", "--python", str(venv / "bin" / "python"),
                              "--format", "freeze"], capture_output=True, text=True, check=True,
                             env=_env()).stdout.split()
    site = next((venv / "lib").glob("python*/site-packages"))
    uv_bin = venv / "bin" / "uv"
    row = {"extra": extra or "(base)", "packages": len(listing) - 1,  # shoal itself not counted
           "site_mb": _du_mb(site), "uv_mb": _du_mb(uv_bin) if uv_bin.exists() else 0,
           "seconds": round(seconds, 1)}
    shutil.rmtree(venv)
    return row


def main(argv: list[str]) -> int:
    project = Path(argv[0]).resolve() if argv else Path(__file__).resolve().parents[1]
    extras = argv[1:] or EXTRAS
    with tempfile.TemporaryDirectory(prefix="shoal-footprint-", dir=scratch()) as tmp:
        root = Path(tmp)
        subprocess.run([_uv(), "build", "-q", "--wheel", "--out-dir", str(root / "dist"),
                        str(project)], check=True, env=_env())
        wheel = next((root / "dist").glob("*.whl"))
        print(f"{'extra':<14}{'packages':>9}{'site MB':>9}{'+uv MB':>8}{'seconds':>9}")
        for extra in extras:
            row = measure(wheel, extra, project / "constraints.txt", root)
            print(f"{row['extra']:<14}{row['packages']:>9}{row['site_mb']:>9}{row['uv_mb']:>8}"
                  f"{row['seconds']:>9}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
