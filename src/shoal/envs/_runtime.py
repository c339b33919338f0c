"""The few shoal modules a job's own interpreter needs, copied beside its environment.

A job in an isolated environment imports only ``shoal.jobs._entrypoint`` (and through it
``shoal.errors``, ``shoal._internal.secrets`` and ``shoal.serialization``: the standard library and cloudpickle). Putting a
copy of just those on the job's ``PYTHONPATH`` keeps the client's site-packages out of the job.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from pathlib import Path

__all__ = ["RUNTIME_MODULES", "ensure_package_path", "ensure_runtime"]

RUNTIME_MODULES = (
    "__init__.py",
    "errors.py",
    "_internal/__init__.py",
    "_internal/lazy.py",
    "_internal/jsoncodec.py",
    "_internal/secrets.py",
    "_internal/private.py",
    "serialization/__init__.py",
    "jobs/__init__.py",
    "jobs/_entrypoint.py",
    "jobs/_child.py",
    "jobs/_descendants.py",
    "jobs/_zygote.py",
    "jobs/_executor.py",
)


def ensure_runtime(root: Path) -> Path:
    """A directory to put on the job's PYTHONPATH; shared by every job of this shoal version."""
    package = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for rel in RUNTIME_MODULES:
        h.update(rel.encode())
        h.update((package / rel).read_bytes())
    target = Path(root) / h.hexdigest()[:16]
    if (target / "shoal" / "__init__.py").exists():
        return target
    tmp = Path(root) / f".tmp-{uuid.uuid4().hex}"
    for rel in RUNTIME_MODULES:
        dest = tmp / "shoal" / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(package / rel, dest)
    try:
        os.rename(tmp, target)
    except OSError:  # another job put the same copy in place first
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def ensure_package_path(root: Path) -> Path:
    """A directory holding all of shoal's package, for an isolated environment's PYTHONPATH.

    A source checkout's ``src/`` holds only shoal, so it is used as it is; an installed shoal
    lives among the client's packages, which must stay out of the job's environment, so the
    package is copied (once per content) under *root*.
    """
    package = Path(__file__).resolve().parent.parent
    parent = package.parent
    if parent.name not in ("site-packages", "dist-packages"):
        return parent
    h = hashlib.sha256()
    files = sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts)
    for path in files:
        h.update(str(path.relative_to(package)).encode())
        h.update(path.read_bytes())
    target = Path(root) / h.hexdigest()[:16]
    if (target / "shoal" / "__init__.py").exists():
        return target
    tmp = Path(root) / f".tmp-{uuid.uuid4().hex}"
    shutil.copytree(package, tmp / "shoal", ignore=shutil.ignore_patterns("__pycache__"))
    try:
        os.rename(tmp, target)
    except OSError:  # another supervisor put the same copy in place first
        shutil.rmtree(tmp, ignore_errors=True)
    return target
