"""Runtime environments for jobs.

Today a job runs on the client's own interpreter; ``dependencies=`` is checked against what is
installed there, and a requirement that is missing fails the job's environment phase with the
requirement named. Building isolated environments with uv is TODO(#3).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from shoal.errors import RuntimeEnvError

__all__ = ["RequirementsCheck", "check_requirements"]


@dataclass(frozen=True, slots=True)
class RequirementsCheck:
    path: str
    satisfied: tuple[str, ...]
    problems: tuple[str, ...]


def _lines(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise RuntimeEnvError(f"cannot read requirements file {path}: {e}", file=str(path)) from e
    out = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def check_requirements(path: str | Path) -> RequirementsCheck:
    """Check each line of a requirements file against the installed distributions."""
    from importlib import metadata

    from packaging.requirements import InvalidRequirement, Requirement

    p = Path(path)
    ok: list[str] = []
    problems: list[str] = []
    for line in _lines(p):
        if line.startswith("-"):
            problems.append(f"{line!r}: pip options are not supported yet (TODO(#3))")
            continue
        try:
            req = Requirement(line)
        except InvalidRequirement as e:
            problems.append(f"{line!r} is not a valid requirement: {e}")
            continue
        if req.marker is not None and not req.marker.evaluate():
            ok.append(line)
            continue
        try:
            version = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            problems.append(f"{req.name} is not installed")
            continue
        if req.specifier and not req.specifier.contains(version, prereleases=True):
            problems.append(f"{req.name} {version} is installed, {line} is required")
            continue
        ok.append(line)
    return RequirementsCheck(str(p), tuple(ok), tuple(problems))
