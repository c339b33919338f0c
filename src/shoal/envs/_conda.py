"""Job environments from a conda ``environment.yml``, or from an existing named conda env.

With micromamba, mamba or conda on PATH the file is handed to that tool, and the environment
is cached under the same root and ready marker as the uv ones (so ``shoal envs list|prune``
see it), keyed by the normalised file, the tool and the platform. Without a tool, the file's
``python=`` must admit the client's interpreter and its ``pip:`` section is built with uv;
any conda-only package is refused by name.

Conda environments embed their prefix in scripts and binaries, so unlike the uv ones they are
built in place (under the per-key lock, ready marker written last, removed on any failure)
rather than built aside and renamed.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from shoal.envs._conda_pypi import CondaAsPip, conda_name_error, conda_specifier, conda_to_pip
from shoal.envs._uv import _READY, BuiltEnv, EnvInfo, UvEnvBuilder, _abi_tag, _flock, find_uv
from shoal.errors import RuntimeEnvError

if TYPE_CHECKING:
    from packaging.specifiers import SpecifierSet

__all__ = ["CondaEnvBuilder", "CondaSpec", "UvPlan", "ensure_conda_file_env",
           "ensure_named_conda_env", "find_conda_tool", "parse_environment_yml",
           "plan_without_conda", "resolve_conda_env"]

_TOOLS = ("micromamba", "mamba", "conda")
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_Log = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class CondaSpec:
    """What an ``environment.yml`` asks for. *python* is its constraint as written (``=3.11``,
    ``>=3.10``), or None when the file names no Python version."""

    name: str | None
    channels: tuple[str, ...]
    python: str | None
    conda_packages: tuple[str, ...]
    pip_packages: tuple[str, ...]


# --- parsing --------------------------------------------------------------------------


def parse_environment_yml(text: str, *, source: str) -> CondaSpec:
    """Parse a conda environment file; a malformed one raises RuntimeEnvError naming *source*."""
    import yaml  # deferred: importing shoal.envs stays cheap

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise RuntimeEnvError(f"{source} is not valid YAML: {e}", path=source) from e
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RuntimeEnvError(f"{source} must be a YAML mapping with a dependencies: list",
                              path=source)
    name = data.get("name")
    if name is not None and not isinstance(name, str):
        raise RuntimeEnvError(f"{source}: name must be a string, got {name!r}", path=source,
                              key="name")
    channels = data.get("channels") or []
    if not _strings(channels):
        raise RuntimeEnvError(f"{source}: channels must be a list of strings, got {channels!r}",
                              path=source, key="channels")
    deps = data.get("dependencies") or []
    if not isinstance(deps, list):
        raise RuntimeEnvError(f"{source}: dependencies must be a list, got {deps!r}",
                              path=source, key="dependencies")
    python: str | None = None
    conda: list[str] = []
    pip: list[str] = []
    for dep in deps:
        if isinstance(dep, dict) and set(dep) == {"pip"}:
            if not _strings(dep["pip"]):
                raise RuntimeEnvError(f"{source}: the pip: entry of dependencies must be a list "
                                      f"of strings, got {dep['pip']!r}", path=source, key="pip")
            pip.extend(dep["pip"])
        elif isinstance(dep, str) and dep.strip():
            pkg, constraint = _split(dep)
            if pkg == "python":
                python = constraint or None
            elif pkg != "pip":  # pip itself is a given wherever a pip: section is honoured
                conda.append(dep.strip())
        else:
            raise RuntimeEnvError(f"{source}: dependencies entry {dep!r} is neither a package "
                                  "nor a pip: list", path=source, key="dependencies")
    return CondaSpec(name, tuple(channels), python, tuple(conda), tuple(pip))


def _strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _split(dep: str) -> tuple[str, str]:
    """``conda-forge::numpy >=1.26`` -> (``numpy``, ``>=1.26``)."""
    dep = dep.strip().split("::", 1)[-1]
    match = _NAME.match(dep)
    name = match.group(0) if match else dep
    return name.lower(), dep[len(name):].strip()


def python_specifier(constraint: str) -> SpecifierSet:
    """A conda version constraint for python as a PEP 440 specifier set.

    ``=3.11`` and ``3.11`` mean ``==3.11.*``; ``=3.11.7`` means ``==3.11.7``; ``==3.11.*``,
    ``>=3.10`` and ``>=3.10,<3.13`` stay; a build string (``=3.11=h123_0``) is dropped.
    """
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        return SpecifierSet(conda_specifier(constraint, what="python"))
    except InvalidSpecifier as e:
        raise RuntimeEnvError(f"python{constraint} is not a version constraint shoal "
                              f"understands: {e}") from e


def _client_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def check_python(spec: CondaSpec, *, source: str, client_version: str | None = None,
                 exact: bool = True) -> None:
    """Refuse a file whose ``python`` constraint excludes the client's interpreter.

    *exact* checks the client's full version (the job runs that very interpreter); otherwise
    any patch release of the client's major.minor will do (a conda tool picks the patch).
    """
    if spec.python is None:
        return
    version = client_version or platform.python_version()
    allowed = python_specifier(spec.python)
    minor = _client_minor(version)
    candidates = [version] if exact else [f"{minor}.{patch}" for patch in range(100)]
    if not any(allowed.contains(v, prereleases=True) for v in candidates):
        raise RuntimeEnvError(
            f"{source} asks for python{spec.python} but the client runs Python {version}; "
            f"a job must run the client's Python major.minor ({minor}), so change the file to "
            f"python={minor} (or run the client on the Python the file asks for)",
            path=source, python=spec.python, client_python=version)


# --- without a conda tool -------------------------------------------------------------


def find_conda_tool() -> str | None:
    """The first of micromamba, mamba and conda on PATH, or None."""
    for tool in _TOOLS:
        found = shutil.which(tool)
        if found:
            return found
    return None


@dataclass(frozen=True, slots=True)
class UvPlan:
    """How uv builds a conda file: *python* runs it, *requirements* is the text to install,
    *notices* say what differs from what a conda tool would have built."""

    python: str
    requirements: str
    notices: tuple[str, ...]
    translated: CondaAsPip


def plan_without_conda(spec: CondaSpec, *, client_python: str, client_version: str | None = None,
                       source: str = "environment.yml", strict: bool = False) -> UvPlan:
    """How to build *spec* with uv when no conda tool exists: its conda packages by their PyPI
    names (system packages dropped), its ``pip:`` section as it is, on the client's Python."""
    translated = conda_to_pip(spec.conda_packages, source=source)
    notices = []
    if spec.channels:
        notices.append(f"{Path(source).name}: channels {', '.join(spec.channels)} ignored; "
                       "without a conda tool the packages come from PyPI")
    if translated.dropped:
        notices.append(f"{Path(source).name}: {', '.join(translated.dropped)} dropped: system "
                       "packages, which PyPI wheels bundle or the machine provides")
    if translated.renamed:
        notices.append(f"{Path(source).name}: conda names installed by their PyPI names: "
                       + ", ".join(f"{c} as {p}" for c, p in translated.renamed))
    try:
        check_python(spec, source=source, client_version=client_version, exact=True)
    except RuntimeEnvError as e:
        version = client_version or platform.python_version()
        if strict:
            raise RuntimeEnvError(f"strict_versions: {e}", **e.details) from e
        notices.append(f"{Path(source).name} asks for python{spec.python}; the job runs on the "
                       f"client's Python {version} (no conda tool to install another)")
    text = "\n".join([*translated.requirements, *spec.pip_packages])
    return UvPlan(client_python, text + "\n" if text else "", tuple(notices), translated)


# --- with a conda tool ----------------------------------------------------------------


def _run(argv: list[str], *, what: str, cwd: Path | None = None) -> str:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME") and not k.startswith("VIRTUAL_ENV")}
    env.update(CONDA_ALWAYS_YES="true", MAMBA_ALWAYS_YES="true", UV_NO_PROGRESS="1")
    try:
        done = subprocess.run(argv, cwd=cwd, env=env, text=True, capture_output=True,
                              stdin=subprocess.DEVNULL, timeout=1800, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeEnvError(f"{what} failed: {e}") from e
    if done.returncode != 0:
        output = (done.stderr.strip() + "\n" + done.stdout.strip()).strip()
        raise RuntimeEnvError(f"{what} failed (exit code {done.returncode}):\n{output[-4000:]}",
                              output=output[-4000:])
    return done.stdout


def python_minor_of(python: Path) -> str:
    """The ``major.minor`` of the interpreter *python*."""
    if not python.exists():
        raise RuntimeEnvError(f"the environment has no Python at {python}; add python=X.Y to "
                              "its dependencies", python=str(python))
    out = _run([str(python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
               what=f"asking {python} for its version")
    return out.strip()


def _tool_name(tool: str) -> str:
    return Path(tool).name.removesuffix(".exe")


def _create_argv(tool: str, prefix: Path, file: Path) -> list[str]:
    if _tool_name(tool).startswith("micromamba"):
        return [tool, "create", "-y", "-p", str(prefix), "-f", str(file)]
    return [tool, "env", "create", "-p", str(prefix), "-f", str(file)]


def pin_client_python(text: str, spec: CondaSpec, *, client_version: str | None = None) -> str:
    """The file with its python entry narrowed to the client's major.minor (a conda tool would
    otherwise pick the newest Python it allows). A pin already within it is kept."""
    minor = _client_minor(client_version or platform.python_version())
    major, low = minor.split(".")
    bounds = [f">={minor}", f"<{major}.{int(low) + 1}"]
    if spec.python is not None:
        allowed = python_specifier(spec.python)
        below = f"{major}.{int(low) - 1}.99" if int(low) else f"{int(major) - 1}.99.99"
        if not any(allowed.contains(v, prereleases=True)
                   for v in (f"{major}.{int(low) + 1}.0", below)):
            return text  # already confined to the client's minor (or to a patch of it)
        bounds = [str(s) for s in allowed if s.operator in (">", ">=", "<", "<=")] + bounds
    wanted = "python " + ",".join(bounds)
    import yaml

    data = yaml.safe_load(text) or {}
    deps = [d for d in data.get("dependencies") or []
            if not (isinstance(d, str) and _split(d)[0] == "python")]
    data["dependencies"] = [*deps, wanted]
    return yaml.safe_dump(data, sort_keys=False)


class CondaEnvBuilder:
    """Build and cache environments from conda files with *tool* (micromamba, mamba or conda).

    Environments live beside the uv ones under *root*, as ``conda-<key>`` with the same ready
    marker, so ``UvEnvBuilder(root).list()`` and ``prune()`` cover them too.
    """

    def __init__(self, root: Path, tool: str) -> None:
        self.root = Path(root)
        self.tool = tool

    def key_for(self, text: str, extra: tuple[str, ...]) -> str:
        import yaml

        data = yaml.safe_load(text)  # formatting and comments do not make a new environment
        normalised = json.dumps(data, sort_keys=True, default=str)
        request = "\n".join([normalised, *extra, _tool_name(self.tool), _abi_tag()])
        return "conda-" + hashlib.sha256(request.encode()).hexdigest()[:32]

    def ensure(self, text: str, *, base_dir: Path, extra: tuple[str, ...] = (),
               log: _Log | None = None, source: str = "environment.yml") -> BuiltEnv:
        """The environment for the conda file *text*: the cached one, or one built now."""
        log = log or (lambda _msg: None)
        t0 = time.monotonic()
        spec = parse_environment_yml(text, source=source)
        check_python(spec, source=source, exact=False)
        text = pin_client_python(text, spec)
        key = self.key_for(text, extra)
        path = self.root / key
        if (hit := self._cached(key, text, t0)) is not None:
            return hit
        self.root.mkdir(parents=True, exist_ok=True)
        with _flock(self.root / f"{key}.lock"):
            if (hit := self._cached(key, text, t0)) is not None:
                return hit  # built by another job while we waited
            self._build(text, key, base_dir=base_dir, extra=extra, log=log)
        return BuiltEnv(key, path, path / "bin" / "python", text, False, time.monotonic() - t0)

    def _cached(self, key: str, text: str, t0: float) -> BuiltEnv | None:
        path = self.root / key
        if not (path / _READY).exists():
            return None
        with contextlib.suppress(OSError):
            os.utime(path / _READY)
        return BuiltEnv(key, path, path / "bin" / "python", text, True, time.monotonic() - t0)

    def _build(self, text: str, key: str, *, base_dir: Path, extra: tuple[str, ...],
               log: _Log) -> None:
        path = self.root / key
        scratch = self.root / f".build-{key}-{uuid.uuid4().hex[:12]}"
        name = _tool_name(self.tool)
        log(f"[shoal] building a conda environment with {name}\n")
        try:
            if path.exists():  # a leftover of a crashed build: no ready marker
                shutil.rmtree(path)
            scratch.mkdir()
            file = scratch / "environment.yml"
            file.write_text(text)
            _run(_create_argv(self.tool, path, file), cwd=base_dir,
                 what=f"creating the environment with {name}")
            python = path / "bin" / "python"
            minor, want = python_minor_of(python), _client_minor(platform.python_version())
            if minor != want:
                raise RuntimeEnvError(f"{name} built an environment with Python {minor} but the "
                                      f"client runs Python {want}; pin python={want} in the file",
                                      python=minor, client_python=want)
            if extra:
                _run([find_uv(), "pip", "install", "--python", str(python), "--quiet", *extra],
                     cwd=base_dir, what="installing shoal's job runtime packages")
            (path / "environment.yml").write_text(text)
            packages = _count_packages(path)
            (path / _READY).write_text(json.dumps({"key": key, "created_at": time.time(),
                                                   "packages": packages, "kind": "conda",
                                                   "tool": name}))
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        log(f"[shoal] conda environment {key[:16]} ready ({packages} packages)\n")

    def list(self) -> list[EnvInfo]:
        return [e for e in UvEnvBuilder(self.root).list() if e.key.startswith("conda-")]

    def prune(self, *, unused_for_seconds: float = 0.0, keep: frozenset[str] = frozenset()
              ) -> builtins.list[str]:  # builtins.: the method list() shadows the type here
        others = frozenset(e.key for e in UvEnvBuilder(self.root).list()
                           if not e.key.startswith("conda-"))
        return UvEnvBuilder(self.root).prune(unused_for_seconds=unused_for_seconds,
                                             keep=keep | others)


def _count_packages(prefix: Path) -> int:
    """Conda packages plus those pip/uv installed on top."""
    conda = len(list(prefix.glob("conda-meta/*.json")))
    pip = 0
    for info in prefix.glob("lib/python*/site-packages/*.dist-info"):
        with contextlib.suppress(OSError):
            if (info / "INSTALLER").read_text().strip() != "conda":
                pip += 1
    return conda + pip


# --- named environments ---------------------------------------------------------------


def resolve_conda_env(name: str, tool: str) -> Path:
    """The Python of the existing conda environment *name* (``base`` for the root one)."""
    out = _run([tool, "env", "list", "--json"], what=f"listing conda environments with {tool}")
    try:
        prefixes = [Path(p) for p in json.loads(out).get("envs", [])]
    except (ValueError, AttributeError) as e:
        raise RuntimeEnvError(f"{tool} env list --json printed something shoal cannot read: "
                              f"{out[:200]!r}") from e

    def label(prefix: Path) -> str:
        return prefix.name if prefix.parent.name == "envs" else "base"

    found = [p for p in prefixes if (str(p) == name if "/" in name else
                                     label(p) == name or p.name == name)]
    if not found:
        names = ", ".join(sorted({label(p) for p in prefixes})) or "none"
        raise RuntimeEnvError(f"job_conda_env={name!r}: no such conda environment; the ones "
                              f"{_tool_name(tool)} knows are: {names}", conda_env=name,
                              known=sorted({label(p) for p in prefixes}))
    return found[0] / "bin" / "python"


def ensure_named_conda_env(name: str, *, requirements: str | None, base_dir: Path,
                           extra: tuple[str, ...] = (), log: _Log | None = None) -> BuiltEnv:
    """Use the existing conda environment *name* for a job, adding what the job needs.

    As on SageMaker, the job's requirements (and shoal's runtime packages, when missing) are
    installed into that environment; nothing is cached by shoal.
    """
    log = log or (lambda _msg: None)
    t0 = time.monotonic()
    tool = find_conda_tool()
    if tool is None:
        raise RuntimeEnvError(f"job_conda_env={name!r} needs micromamba, mamba or conda on "
                              "PATH, and none is there", conda_env=name)
    python = resolve_conda_env(name, tool)
    minor, want = python_minor_of(python), _client_minor(platform.python_version())
    if minor != want:
        raise RuntimeEnvError(f"conda environment {name!r} runs Python {minor} but the client "
                              f"runs Python {want}; client and job major.minor must match",
                              conda_env=name, python=minor, client_python=want)
    if extra:
        log(f"[shoal] installing {', '.join(extra)} into conda environment {name!r}\n")
        _run([find_uv(), "pip", "install", "--python", str(python), "--quiet", *extra],
             cwd=base_dir, what=f"installing shoal's job runtime packages into {name!r}")
    if requirements:
        log(f"[shoal] installing the job's requirements into conda environment {name!r}\n")
        _install_requirements(python, requirements, base_dir=base_dir, name=name)
    prefix = python.parent.parent
    return BuiltEnv(f"named-{name}", prefix, python, f"# conda environment {name} at {prefix}\n",
                    True, time.monotonic() - t0)


def _install_requirements(python: Path, requirements: str, *, base_dir: Path, name: str) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", prefix="shoal-requirements-") as f:
        f.write(requirements)
        f.flush()
        _run([find_uv(), "pip", "install", "--python", str(python), "--quiet", "-r", f.name],
             cwd=base_dir, what=f"installing the requirements into {name!r}")


# --- the job's conda file -------------------------------------------------------------


def ensure_conda_file_env(text: str, *, source: str, uv_builder: UvEnvBuilder, base_dir: Path,
                          extra: tuple[str, ...], client_python: str,
                          log: _Log | None = None, strict: bool = False) -> BuiltEnv:
    """The environment for a job's conda file: with a conda tool if one is on PATH, else with
    uv (``plan_without_conda``; a conda package PyPI does not have fails, named)."""
    log = log or (lambda _msg: None)
    spec = parse_environment_yml(text, source=source)
    tool = find_conda_tool()
    if tool is not None:
        return CondaEnvBuilder(uv_builder.root, tool).ensure(
            text, base_dir=base_dir, extra=extra, log=log, source=source)
    plan = plan_without_conda(spec, client_python=client_python, source=source, strict=strict)
    log(f"[shoal] no conda tool on PATH: building {Path(source).name} with uv on Python "
        f"{platform.python_version()} ({plan.python})\n")
    for notice in plan.notices:
        log(f"[shoal] {notice}\n")
    try:
        return uv_builder.ensure(plan.requirements, base_dir=base_dir, extra=extra, log=log)
    except RuntimeEnvError as e:
        named = conda_name_error(str(e), plan.translated, source=source)
        if named is None:
            raise
        raise RuntimeEnvError(named, path=source) from e
