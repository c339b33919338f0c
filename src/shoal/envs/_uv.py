"""Isolated job environments built with uv, cached by what is installed.

A requirements file is resolved (``uv pip compile``) into a lock; the environment's key is the
SHA-256 of that lock, the Python ABI and the platform, so two requests that resolve to the same
packages share one environment. Builds take a per-key file lock and rename a finished
environment into place: concurrent jobs build once, a failed build leaves nothing behind.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from shoal.errors import RuntimeEnvError

__all__ = ["BuiltEnv", "EnvInfo", "UvEnvBuilder", "find_uv"]

_READY = ".shoal-ready.json"


def find_uv() -> str:
    """The uv binary: the PyPI package's, else one on PATH."""
    try:
        from uv import find_uv_bin

        return str(find_uv_bin())
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found:
            return found
    raise RuntimeEnvError("uv is not installed; install shoal with its dependencies "
                          "(pip install shoal) or put uv on PATH")


@dataclass(frozen=True, slots=True)
class BuiltEnv:
    key: str
    path: Path
    python: Path
    lock: str
    cached: bool
    seconds: float


@dataclass(frozen=True, slots=True)
class EnvInfo:
    key: str
    path: Path
    size_bytes: int
    created_at: float
    last_used_at: float
    packages: int


def uv_environment() -> dict[str, str]:
    """The environment uv runs in: ours, less an activated virtualenv's or conda's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "CONDA"))}
    env.setdefault("UV_NO_PROGRESS", "1")
    return env


def _abi_tag() -> str:
    return f"{sys.implementation.cache_tag}-{sysconfig.get_platform()}"


class UvEnvBuilder:
    """Resolve, build and cache environments under *root* for the interpreter *python*."""

    def __init__(self, root: Path, *, python: str | None = None, uv: str | None = None,
                 resolve_ttl_seconds: float = 24 * 3600,
                 withhold_credentials: bool = False) -> None:
        self.root = Path(root)
        #: uv (and the builds of sdists it runs: their setup code is the requirements') gets
        #: none of this process's credentials (an endpoint a team server started).
        self._withhold = withhold_credentials
        self._python = python or sys.executable
        self._uv = uv
        self._ttl = resolve_ttl_seconds
        self._log: Callable[[str], None] = lambda _msg: None

    def _uv_bin(self) -> str:
        if self._uv is None:
            self._uv = find_uv()
        return self._uv

    def _run(self, args: list[str], *, cwd: Path | None = None, what: str) -> str:
        env = uv_environment()
        if self._withhold:
            from shoal.core.secrets import without_credentials

            env = without_credentials(env)
        try:
            done = subprocess.run([self._uv_bin(), *args], cwd=cwd, env=env, text=True,
                                  capture_output=True, timeout=1800, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise RuntimeEnvError(f"{what} failed: {e}") from e
        if done.returncode != 0:
            message = (done.stderr or done.stdout).strip()
            raise RuntimeEnvError(f"{what} failed (uv exit code {done.returncode}):\n{message}",
                                  uv_output=message)
        return done.stdout

    # --- resolving --------------------------------------------------------------------

    def _memo(self, requirements: str, extra: tuple[str, ...]) -> Path:
        request = "\n".join([requirements, *extra, self._python, _abi_tag()])
        return self.root / "requests" / f"{hashlib.sha256(request.encode()).hexdigest()}.lock"

    def _fresh_lock(self, memo: Path) -> str | None:
        with contextlib.suppress(OSError):
            if time.time() - memo.stat().st_mtime < self._ttl:
                return memo.read_text()
        return None

    @staticmethod
    def key_for(lock: str) -> str:
        return hashlib.sha256(f"{lock}\n{_abi_tag()}".encode()).hexdigest()[:32]

    # --- building ---------------------------------------------------------------------

    def ensure(self, requirements: str, *, base_dir: Path, extra: tuple[str, ...] = (),
               log: Callable[[str], None] | None = None) -> BuiltEnv:
        """The environment for *requirements*: the cached one with the same lock, or a new one.

        A request seen before (within the TTL) maps straight to its lock and key. A new one is
        installed into a scratch environment, whose ``uv pip freeze`` is the lock: if an
        environment with that lock exists already, the scratch one is dropped. Building while
        holding a lock on the request makes concurrent jobs with the same request build once.
        """
        if log is not None:
            self._log = log
        t0 = time.monotonic()
        memo = self._memo(requirements, extra)
        lock = self._fresh_lock(memo)
        if lock is not None and (hit := self._cached(lock, t0)) is not None:
            return hit
        memo.parent.mkdir(parents=True, exist_ok=True)
        with _flock(memo.with_suffix(".building")):
            lock = self._fresh_lock(memo)  # built by another job while we waited
            if lock is not None and (hit := self._cached(lock, t0)) is not None:
                return hit
            lock, key, cached = self._build(requirements, extra, base_dir)
            tmp = memo.with_suffix(f".tmp-{uuid.uuid4().hex}")
            tmp.write_text(lock)
            os.replace(tmp, memo)
        path = self.root / key
        return BuiltEnv(key, path, path / "bin" / "python", lock, cached, time.monotonic() - t0)

    def _cached(self, lock: str, t0: float) -> BuiltEnv | None:
        key = self.key_for(lock)
        path = self.root / key
        if not (path / _READY).exists():
            return None
        self._touch(path)
        return BuiltEnv(key, path, path / "bin" / "python", lock, True, time.monotonic() - t0)

    def _build(self, requirements: str, extra: tuple[str, ...],
               base_dir: Path) -> tuple[str, str, bool]:
        tmp = self.root / f".build-{uuid.uuid4().hex[:12]}"
        self._log("[shoal] building an environment with uv\n")
        try:
            self._run(["venv", "--relocatable", "--python", self._python, "--quiet", str(tmp)],
                      what="creating the virtual environment")
            req_file = tmp / "requirements.in"
            req_file.write_text("\n".join([requirements, *extra]) + "\n")
            python = str(tmp / "bin" / "python")
            self._run(["pip", "install", "--python", python, "--quiet", "-r", str(req_file)],
                      cwd=base_dir, what="installing the requirements")
            lock = self._run(["pip", "freeze", "--python", python, "--exclude-editable"],
                             what="recording the installed versions")
            key = self.key_for(lock)
            path = self.root / key
            packages = len([ln for ln in lock.splitlines() if ln.strip()])
            (tmp / "requirements.lock").write_text(lock)
            (tmp / _READY).write_text(json.dumps({"key": key, "created_at": time.time(),
                                                  "packages": packages}))
            with _flock(self.root / f"{key}.lock"):
                if (path / _READY).exists():  # an equal lock was built from another request
                    shutil.rmtree(tmp, ignore_errors=True)
                    self._touch(path)
                    self._log(f"[shoal] same packages as environment {key[:12]}; reusing it\n")
                    return lock, key, True
                if path.exists():  # a leftover without its ready marker
                    shutil.rmtree(path)
                os.replace(tmp, path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._log(f"[shoal] environment {key[:12]} ready ({packages} packages)\n")
        self._compile_later(path)
        return lock, key, False

    @staticmethod
    def _compile_later(path: Path) -> None:
        """Compile bytecode in the background: the first job need not wait for it, and every
        later job imports fast even where PYTHONDONTWRITEBYTECODE is set."""
        python = path / "bin" / "python"
        site = [str(p) for p in path.glob("lib/python*/site-packages")]
        if not site:
            return
        # sh puts it in the background and exits, so nothing is left for us to reap; the
        # paths travel as arguments, never inside the command text.
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(["/bin/sh", "-c", '"$0" -m compileall -q -j 0 "$@" >/dev/null 2>&1 &',
                            str(python), *site], stdin=subprocess.DEVNULL, check=False,
                           timeout=30, env={"PATH": os.environ.get("PATH", "")})

    @staticmethod
    def _touch(path: Path) -> None:
        with contextlib.suppress(OSError):
            os.utime(path / _READY)

    # --- listing and pruning ----------------------------------------------------------

    def list(self) -> list[EnvInfo]:
        out: list[EnvInfo] = []
        if not self.root.exists():
            return out
        for path in sorted(self.root.iterdir()):
            ready = path / _READY
            if not ready.exists():
                continue
            meta = json.loads(ready.read_text())
            size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()
                       and not f.is_symlink())
            out.append(EnvInfo(path.name, path, size, float(meta.get("created_at", 0)),
                               ready.stat().st_mtime, int(meta.get("packages", 0))))
        return out

    def prune(self, *, unused_for_seconds: float = 0.0, keep: frozenset[str] = frozenset()
              ) -> builtins.list[str]:  # builtins.: the method list() shadows the type here
        """Remove environments unused for that long (and failed-build leftovers)."""
        removed: builtins.list[str] = []
        now = time.time()
        for info in self.list():
            if info.key in keep or now - info.last_used_at < unused_for_seconds:
                continue
            with _flock(self.root / f"{info.key}.lock"):
                shutil.rmtree(info.path, ignore_errors=True)
            removed.append(info.key)
        for leftover in self.root.glob(".build-*"):
            # A build in progress is younger than an hour; older ones are leftovers of a crash.
            with contextlib.suppress(OSError):
                if now - leftover.stat().st_mtime > 3600:
                    shutil.rmtree(leftover, ignore_errors=True)
        return removed


@contextlib.contextmanager
def _flock(path: Path) -> Iterator[None]:
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
