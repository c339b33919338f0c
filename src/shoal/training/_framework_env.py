"""A framework estimator's job environment: the container's pins, resolved for this Python.

``plan_framework_env`` turns ``framework_version`` (and ``py_version``) into the requirement
lines the job's environment installs. The framework and each package the container pins are
asked of uv at their lowest release at or above the container's (``envs.lowest_installable``):
the container's own version where it has a wheel for the client's Python, else the nearest
that does, same minor series first. Each such fallback is said once, as a notice the job
record and log carry; ``strict_versions`` makes it an error instead.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from shoal.errors import InvalidArgumentError, RuntimeEnvError
from shoal.training.containers import Container, container_for

__all__ = ["FrameworkEnv", "check_py_version", "framework_requirements", "installed_matches",
           "installed_version", "pin_for", "plan_framework_env", "requirement_bounds"]

# The first release of each framework whose wheels are built against NumPy 2; older ones need
# NumPy 1 ("numpy.dtype size changed" otherwise).
_NUMPY2_SINCE = {"scikit-learn": (1, 4, 2), "torch": (2, 3, 0)}
# What every SageMaker framework container gives a script besides its framework.
_ALWAYS = ("boto3",)
_PY = re.compile(r"^py(\d)(\d*)$")


@dataclass(frozen=True, slots=True)
class FrameworkEnv:
    """What the job's environment installs for the framework, and what to tell the user."""

    dist: str
    release: str
    resolved: str
    requirements: tuple[str, ...]
    notices: tuple[str, ...]


def _client_python() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def check_py_version(py_version: str | None, *, framework: str, version: str,
                     strict: bool) -> str | None:
    """None when *py_version* is the client's (or ``py3``/unset), else the notice saying the
    job runs on the client's Python; with *strict*, an error instead."""
    ours = f"py{sys.version_info.major}{sys.version_info.minor}"
    if py_version in (None, "py3", ours):
        return None
    match = _PY.match(str(py_version))
    if not match or match.group(1) != "3":
        raise InvalidArgumentError(
            f"py_version={py_version!r}: jobs here run Python {_client_python()} (the "
            f"client's); use py_version={ours!r} or 'py3'", argument="py_version")
    wanted = f"3.{match.group(2)}" if match.group(2) else "3"
    why = (f"py_version {py_version} ran on Python {_client_python()}: shoal runs a job on the "
           "client's Python")
    if strict:
        raise InvalidArgumentError(
            f"strict_versions: {framework} framework_version {version} with py_version "
            f"{py_version} needs Python {wanted}, but jobs here run the client's Python "
            f"{_client_python()}; run the client on Python {wanted}, or drop "
            "strict_versions", argument="py_version")
    return why


def _release(framework: str, dist: str, version: str) -> tuple[Container | None, str]:
    container = container_for(framework, version)
    if container is not None:
        return container, container.release
    release = version.split("-")[0] if framework == "sklearn" else version
    if not re.fullmatch(r"\d+(\.\d+){0,2}", release):
        raise InvalidArgumentError(f"framework_version={version!r} is not a {dist} version "
                                   "(e.g. '1.2-1' for SKLearn, '2.1.0' for PyTorch)",
                                   argument="framework_version")
    return None, release


def requirement_bounds(framework: str, dist: str, version: str,
                       overridden: Collection[str] = ()) -> tuple[Container | None, str,
                                                                  list[str]]:
    """(container, release, lower-bound requirements) for the resolver: the framework at or
    above its release, each pin at or above the container's version within its major."""
    container, release = _release(framework, dist, version)
    reqs = [f"{dist}>={release}"]
    pins = dict(container.pins) if container else {}
    since = _NUMPY2_SINCE.get(dist)
    if since and _key(release) < since and "numpy" not in pins:
        pins["numpy"] = "<2"
    for name in dict.fromkeys([*pins, *_ALWAYS]):
        if name in overridden:
            continue
        pin = pins.get(name)
        if pin is None:
            reqs.append(name)
        elif pin[:1] in "<>=!~":
            reqs.append(f"{name}{pin}")
        else:
            reqs.append(f"{name}>={pin},<{_key(pin)[0] + 1}")
    return container, release, reqs


def plan_framework_env(framework: str, dist: str, version: str, *, strict: bool, python: str,
                       cache_dir: Path | None, overridden: Collection[str] = ()
                       ) -> FrameworkEnv:
    """The requirement lines (``name==version``) for *framework* ``framework_version``."""
    from shoal.envs import NotInstallable, lowest_installable

    container, release, reqs = requirement_bounds(framework, dist, version, overridden)
    names = [re.split(r"[<>=!~]", r, maxsplit=1)[0] for r in reqs]
    asked = [r for r in reqs if re.search(r"[<>=!~]", r)]  # a bare name has nothing to find
    binary = [n for n, r in zip(names, reqs, strict=True) if r in asked and n not in _ALWAYS]
    try:
        versions = lowest_installable(asked, binary=binary, python=python, cache_dir=cache_dir)
    except NotInstallable as e:
        raise RuntimeEnvError(
            f"{framework} framework_version {version}: no {dist} release at or after {release} "
            f"installs on Python {_client_python()} together with the container's pins "
            f"({', '.join(reqs[1:]) or 'none'}); uv says:\n{e}", framework_version=version
        ) from e
    resolved = versions[dist]
    notices: list[str] = []
    # "1.3" (a series) is met by any 1.3.x; "0.23.2" only by itself.
    if _key(resolved)[:len(_key(release))] != _key(release):
        why = f"{dist} {release} has no wheel for Python {_client_python()}"
        if strict:
            raise InvalidArgumentError(
                f"strict_versions: {framework} framework_version {version} needs {dist} "
                f"{release}, which has no wheel for Python {_client_python()} (the nearest "
                f"that installs is {resolved}); drop strict_versions to run it as {resolved}",
                argument="framework_version")
        notices.append(f"framework_version {version} ran as {dist} {resolved}: {why}")
    moved = []
    if container is not None:
        for name, pin in container.pins.items():
            got = versions.get(name)
            if got and pin[:1].isdigit() and name not in overridden and _key(got) != _key(pin):
                moved.append(f"{name} {pin} -> {got}")
    if moved:
        notices.append(f"the {framework} {version} container's {', '.join(moved)}: the "
                       f"nearest releases that install together on Python {_client_python()}")
    # The framework and the container's exact pins at the versions found; a bound alone
    # ("numpy<2") or a name the container does not pin ("boto3") is left to the build, which
    # takes the newest release that fits.
    lines = tuple(f"{n}=={versions[n]}" if _exact(r) else r for n, r in zip(names, reqs,
                                                                             strict=True))
    return FrameworkEnv(dist, release, resolved, lines, tuple(notices))


def _exact(requirement: str) -> bool:
    """Whether *requirement* came from a version (``numpy>=1.19.2,<2``), not a bound."""
    return ">=" in requirement


def framework_requirements(framework: str, dist: str, version: str, user: str | None, *,
                           strict: bool, cache_dir: Path | None
                           ) -> tuple[list[str], bool, tuple[str, ...]]:
    """(requirement lines, whether the job needs an environment of its own, notices) for a
    framework job whose own requirements.txt is *user*.

    A framework the user's file names is left to it; one the client has installed at the
    container's release runs in the client's environment; any other gets the container's
    pins, resolved for this Python, and shoal's own dependencies (so ``sagemaker``, which is
    shoal in the job, imports).
    """
    named = requirement_names(user)
    if dist in named:
        return [], True, ()
    _, release, _ = requirement_bounds(framework, dist, version)
    have = (installed_version(dist) or "").split("+")[0]
    if have and have.split(".")[:len(release.split("."))] == release.split("."):
        return [f"{dist}=={have}"], False, ()
    plan = plan_framework_env(framework, dist, version, strict=strict, python=sys.executable,
                              cache_dir=cache_dir, overridden=named)
    from shoal.envs import shoal_requirements

    own = [r for r in shoal_requirements() if requirement_names(r).isdisjoint(named)]
    return [*plan.requirements, *own], True, plan.notices


def installed_version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def requirement_names(text: str | None) -> set[str]:
    """The normalised distribution names a requirements text asks for."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    names = set()
    for line in (text or "").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        try:
            names.add(str(canonicalize_name(Requirement(line).name)))
        except InvalidRequirement:
            continue
    return names


def pin_for(version: str) -> str:
    """A version as given as a pin: ``2.13.0`` -> ``==2.13.0``, ``2.13`` -> ``==2.13.*``."""
    return f"=={version}" if len(version.split(".")) >= 3 else f"=={version}.*"


def installed_matches(dist: str, pin: str) -> bool:
    """Whether the client's installed *dist* satisfies ``pin_for``'s *pin*."""
    have = (installed_version(dist) or "").split("+")[0]
    want = pin.removeprefix("==")
    if not have:
        return False
    return have.startswith(want[:-1]) if want.endswith(".*") else have == want
