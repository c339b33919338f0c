"""shoal as a user installs it: the wheel built from this checkout, installed with some extras
into a fresh virtualenv (``uv venv`` + ``uv pip install``), nothing else in it (no editable
install, no test-only packages). Used by tests/e2e/test_install.py and test_readme.py.

The wheel and each venv are made once per test session and shared between pytest-xdist
workers (a file lock per venv). ``make test`` (scripts/test.sh) points ``SHOAL_TEST_INSTALLS``
at a fresh directory it removes afterwards; without it they go under the temp directory, keyed
by a hash of the sources, so a changed checkout gets new ones. Every install shares the one uv
cache, so a venv costs seconds once the cache is warm. torch comes from ``PIP_FIND_LINKS``
(this machine's CPU build, as the Makefile's pip step takes it) and stays there: the
constraints pin it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Read at import, before the autouse clean_env fixture strips SHOAL_* from the environment.
_INSTALLS = os.environ.get("SHOAL_TEST_INSTALLS", "")


def uv() -> str:
    local = Path(sys.executable).with_name("uv")
    return str(local) if local.exists() else (shutil.which("uv") or "uv")


def _sources_hash() -> str:
    digest = hashlib.sha256()
    files = [ROOT / "pyproject.toml", ROOT / "constraints.txt", ROOT / "README.md",
             *sorted((ROOT / "src" / "shoal").rglob("*"))]
    for path in files:
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(ROOT)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def installs_root() -> Path:
    if _INSTALLS:
        root = Path(_INSTALLS)
    else:
        root = Path(tempfile.gettempdir()) / f"shoal-installs-{os.getuid()}-{_sources_hash()}"
    root.mkdir(parents=True, exist_ok=True)
    return root


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def install_env() -> dict[str, str]:
    """The environment for uv: no PYTHONPATH (the checkout must not leak in), this machine's
    wheel directory for uv as well as pip."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    links = env.get("PIP_FIND_LINKS")
    if links and "UV_FIND_LINKS" not in env:
        env["UV_FIND_LINKS"] = ",".join(links.split())
    return env


def _run(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, env=install_env(), timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")


def wheel() -> Path:
    """shoal's wheel, built from this checkout once per session."""
    root = installs_root()
    out = root / "dist"
    with _locked(root / ".wheel.lock"):
        found = sorted(out.glob("shoal-*.whl"))
        if not found:
            _run([uv(), "build", "-q", "--wheel", "--out-dir", str(out), str(ROOT)],
                 "uv build --wheel")
            found = sorted(out.glob("shoal-*.whl"))
    return found[-1]


def venv(extras: str = "") -> Path:
    """A venv holding the wheel with *extras* (``""``: the base install; ``"torch,serve"``)."""
    names = sorted(e.strip() for e in extras.split(",") if e.strip())
    root = installs_root()
    path = root / ("venv-" + ("-".join(names) or "base"))
    built = wheel()
    with _locked(root / f".{path.name}.lock"):
        if not (path / ".ready").exists():
            shutil.rmtree(path, ignore_errors=True)
            _run([uv(), "venv", "-q", "--python", sys.executable, str(path)], "uv venv")
            spec = f"{built}[{','.join(names)}]" if names else str(built)
            _run([uv(), "pip", "install", "-q", "--python", str(path / "bin" / "python"),
                  "-c", str(ROOT / "constraints.txt"), spec], f"installing {spec}")
            # Bytecode only for shoal itself: its modules start in every job, supervisor and
            # launcher process (PYTHONDONTWRITEBYTECODE is set here). torch & co. are imported
            # a few times per test, fewer than compiling them would cost.
            site = next((path / "lib").glob("python*/site-packages"))
            _run([str(path / "bin" / "python"), "-m", "compileall", "-q", str(site / "shoal")],
                 "compileall shoal")
            (path / ".ready").touch()
    return path


def user_env(home: Path, **extra: str) -> dict[str, str]:
    """A user's environment for running the venv's python or shoal: no PYTHONPATH, no SHOAL_*
    of the test process but a home of its own."""
    env = {k: v for k, v in os.environ.items()
           if k != "PYTHONPATH" and not k.startswith("SHOAL_")}
    env.update(SHOAL_HOME=str(home / "shoal-home"), XDG_CONFIG_HOME=str(home / "xdg"),
               OMP_NUM_THREADS="1")
    env.update(extra)
    return env


def run_python(env_dir: Path, code_or_file: str | Path, cwd: Path,
               env: Mapping[str, str] | None = None, timeout: float = 300,
               args: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """Run Python code (a string) or a script (a Path) with the venv's interpreter in *cwd*."""
    python = str(env_dir / "bin" / "python")
    argv = [python, str(code_or_file)] if isinstance(code_or_file, Path) else \
        [python, "-c", code_or_file]
    return subprocess.run([*argv, *args], cwd=cwd, env=dict(env or user_env(cwd)),
                          capture_output=True, text=True, timeout=timeout)
