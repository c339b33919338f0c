"""Which release of a package installs here: asked of uv's resolver, and cached.

``lowest_installable`` resolves lower bounds (``scikit-learn>=0.23.2``, ``numpy>=1.19.2,<2``)
with uv's ``lowest-direct`` strategy and wheels only for the named packages: the answer is, for
each, the *nearest* release at or above the bound that has a wheel for this interpreter and
platform (the same minor series when it has one, since versions sort that way). The answer for
one request, interpreter and platform does not change once a release has a wheel, so it is
cached on disk without an expiry; a different request is a different file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

from shoal.envs._uv import _abi_tag, find_uv, uv_environment
from shoal.errors import RuntimeEnvError

__all__ = ["NotInstallable", "lowest_installable"]

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._\-]*)==([^\s;]+)")
_NOT_FOUND = re.compile(r"Because ([A-Za-z0-9._\-]+) was not found in the package registry")


class NotInstallable(RuntimeEnvError):
    """No release satisfying the request has a wheel for this interpreter."""


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lowest_installable(requirements: Sequence[str], *, binary: Sequence[str], python: str,
                       cache_dir: Path | None = None) -> dict[str, str]:
    """``{normalised name: version}`` of every package in the resolution of *requirements*,
    the direct ones at their lowest installable release (wheels only for *binary*)."""
    request = "\n".join(sorted(requirements))
    key = hashlib.sha256("\n".join([request, ",".join(sorted(binary)), python, _abi_tag()])
                         .encode()).hexdigest()[:32]
    cached = cache_dir / f"{key}.json" if cache_dir is not None else None
    if cached is not None and cached.exists():
        return dict(json.loads(cached.read_text())["versions"])
    versions = _resolve(requirements, binary, python)
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".tmp-{uuid.uuid4().hex}")
        tmp.write_text(json.dumps({"request": list(requirements), "python": python,
                                   "abi": _abi_tag(), "versions": versions}, indent=1))
        os.replace(tmp, cached)
    return versions


def _resolve(requirements: Sequence[str], binary: Sequence[str], python: str) -> dict[str, str]:
    argv = [find_uv(), "pip", "compile", "--python", python, "--resolution", "lowest-direct",
            "--no-header", "--no-annotate", "--quiet", "-"]
    for name in binary:
        argv[3:3] = ["--only-binary", name]
    try:
        done = subprocess.run(argv, input="\n".join(requirements) + "\n", text=True,
                              env=uv_environment(),
                              capture_output=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeEnvError(f"asking uv which releases install here failed: {e}") from e
    if done.returncode != 0:
        message = (done.stderr or done.stdout).strip()
        missing = _NOT_FOUND.search(message)
        if "cannot be used" in message or "unsatisfiable" in message:
            raise NotInstallable(message, uv_output=message,
                                 missing=missing.group(1) if missing else None)
        raise RuntimeEnvError(f"asking uv which releases install for Python "
                              f"{sys.version_info.major}.{sys.version_info.minor} failed "
                              f"(is PyPI reachable?):\n{message}", uv_output=message)
    out: dict[str, str] = {}
    for line in done.stdout.splitlines():
        match = _PIN.match(line.strip())
        if match:
            out[_normal(match.group(1))] = match.group(2)
    return out
