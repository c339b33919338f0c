"""Auto-capture: the installed distributions a function needs, pinned as installed on the client.

The walk is static: globals the code names, closure cells, defaults, ``import`` in the body, the
types of the call's arguments, and the caller's own code it reaches (the job imports a local
module whole, so all its globals count). It pins the whole dependency closure as installed
(requirements whose markers hold here, extras-only ones skipped, recursively), so the job
reproduces the client rather than what a fresh resolve would pick.

Limits: a module imported from a computed string (``importlib.import_module(name)``,
``__import__``, entry points) is not seen; objects are looked at one level deep (not the arrays in
a global list); a namespace package (``google``) pins every distribution sharing its top-level
name. The standard library, ``shoal`` and file-less modules (``__main__``) are left out.
"""

from __future__ import annotations

import contextlib
import dis
import functools
import importlib.metadata as metadata
import importlib.util
import json
import site
import sys
import sysconfig
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

from packaging.markers import UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from shoal.errors import RuntimeEnvError

__all__ = ["CapturedRequirements", "capture_requirements", "require_no_editable"]

_SELF = "shoal"  # the job's runtime brings shoal (and what it needs) itself
_LOADS = frozenset({"LOAD_CONST", "LOAD_SMALL_INT"})  # how an import's level is pushed (3.14+)
_IGNORED = (frozenset({"__main__", "__mp_main__", "builtins", _SELF})
            | sys.stdlib_module_names | frozenset(sys.builtin_module_names))


@dataclass(frozen=True, slots=True)
class CapturedRequirements:
    """What a function needs from the client's environment; every field is sorted."""

    requirements: tuple[str, ...]  # one per distribution: "numpy==2.4.6", "x @ git+url@commit"
    modules: tuple[str, ...]  # top-level modules found, outside the stdlib and shoal
    local_modules: tuple[str, ...]  # those that are the user's own files, not installed
    editable: tuple[str, ...]  # installed from a local path, "name @ file:///path": no index has it


def capture_requirements(func: Callable[..., Any], *,
                         extra_objects: Sequence[object] = ()) -> CapturedRequirements:
    """Find what ``func`` (called with ``extra_objects``) needs, pinned at installed versions."""
    walker = _Walker(func)
    for obj in extra_objects:
        walker.add(obj)
    classified = {top: _classify(top) for top in sorted(walker.tops - _IGNORED)}
    found = {top: dists for top, dists in classified.items() if dists is not None}
    pins, editable = _pin_closure({name for dists in found.values() for name in dists})
    local = tuple(top for top, dists in found.items() if not dists)
    return CapturedRequirements(tuple(pins), tuple(found), local, tuple(editable))


def require_no_editable(captured: CapturedRequirements, *, shipped_workdir: Path | None) -> None:
    """Raise ``RuntimeEnvError`` if a local-path distribution lies outside the shipped workdir."""
    root = shipped_workdir.resolve() if shipped_workdir is not None else None
    missing: dict[str, str] = {}
    for line in captured.editable:
        name, _, url = line.partition(" @ ")
        path = Path(url2pathname(urlparse(url).path)).resolve()
        if root is None or not path.is_relative_to(root):
            missing[name] = str(path)
    if missing:
        listed = ", ".join(f"{name} ({path})" for name, path in missing.items())
        raise RuntimeEnvError(
            f"the function needs {listed}, installed from a local path, which the job cannot install "
            "from a package index; pass include_local_workdir=True from a working directory that "
            "contains it, or install it non-editable from an index", distributions=missing)


class _Walker:
    """Collects top-level module names from a function and what it reaches."""

    def __init__(self, root: Callable[..., Any]) -> None:
        self.tops: set[str] = set()
        self._seen: set[int] = set()
        self._root_globals = getattr(root, "__globals__", None)
        self.add(root)

    def add(self, value: object) -> None:
        if isinstance(value, types.ModuleType):
            self._add_module(value)
        elif isinstance(value, types.FunctionType):
            self._add_home(value)
            if self._follows(value.__module__, value.__globals__):
                self._function(value)
        elif isinstance(value, type):
            self._add_type(value)
        elif isinstance(value, (types.MethodType, functools.partial)):
            parts = ((value.__func__, value.__self__) if isinstance(value, types.MethodType)
                     else (value.func, *value.args, *value.keywords.values()))
            for part in parts:
                self.add(part)
        else:
            module = getattr(value, "__module__", None) if callable(value) else None
            self._add_module_name(module)  # a builtin function: numpy.zeros is "numpy"
            self._add_type(type(value))

    def _add_module_name(self, name: object) -> None:
        if isinstance(name, str) and name:
            self.tops.add(name.partition(".")[0])

    def _add_module(self, module: types.ModuleType) -> None:
        """Add a module; a local one is imported whole by the job, so its globals count too."""
        self._add_module_name(module.__name__)
        top = module.__name__.partition(".")[0]
        if id(module) not in self._seen and top not in _IGNORED and _classify(top) == ():
            self._seen.add(id(module))
            for value in list(vars(module).values()):
                self.add(value)

    def _add_named(self, name: object) -> None:
        module = sys.modules.get(name) if isinstance(name, str) else None
        self._add_module(module) if module is not None else self._add_module_name(name)

    def _add_home(self, obj: types.FunctionType | type) -> None:
        """Add the module a function or class is pickled by reference from (not <locals>)."""
        if "<locals>" not in obj.__qualname__:  # else cloudpickle ships it by value
            self._add_named(getattr(obj, "__module__", None))

    def _follows(self, module: object, globals_: object) -> bool:
        """Whether to look inside: code from the root's module, ``__main__`` or a local file."""
        if globals_ is not None and globals_ is self._root_globals:
            return True
        top = module.partition(".")[0] if isinstance(module, str) else "builtins"
        return top in ("__main__", "__mp_main__") or (top not in _IGNORED and _classify(top) == ())

    def _add_type(self, cls: type) -> None:
        for klass in cls.__mro__:
            self._add_home(klass)
            if id(klass) in self._seen or not self._follows(klass.__module__, None):
                continue
            self._seen.add(id(klass))
            for attr in vars(klass).values():
                if isinstance(attr, (staticmethod, classmethod)):
                    attr = attr.__func__
                parts = (attr.fget, attr.fset, attr.fdel) if isinstance(attr, property) else (attr,)
                for part in parts:
                    if isinstance(part, types.FunctionType):
                        self._function(part)

    def _function(self, fn: types.FunctionType) -> None:
        if id(fn) in self._seen:
            return
        self._seen.add(id(fn))
        globals_ = fn.__globals__
        package = globals_.get("__package__") or fn.__module__ or ""
        codes = [fn.__code__]
        while codes:  # the function's own code, then nested ones: lambdas, comprehensions, defs
            code = codes.pop()
            codes.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
            for name in code.co_names:
                if name in globals_:
                    self.add(globals_[name])
            for module, level in _imports(code):
                self._add_named(package if level else module)
        for cell in fn.__closure__ or ():
            with contextlib.suppress(ValueError):  # a cell not yet filled
                self.add(cell.cell_contents)
        wrapped = getattr(fn, "__wrapped__", None)  # None adds nothing
        for value in (*(fn.__defaults__ or ()), *(fn.__kwdefaults__ or {}).values(), wrapped):
            self.add(value)


def _imports(code: types.CodeType) -> Iterator[tuple[str, int]]:
    """``(module, level)`` for each IMPORT_NAME; the level is the LOAD_CONST two before it."""
    before: list[object] = [None, None]
    for ins in dis.get_instructions(code):
        if ins.opname == "IMPORT_NAME":
            yield ins.argval, before[0] if isinstance(before[0], int) else 0
        before = [before[1], ins.argval if ins.opname in _LOADS else None]


def _classify(top: str) -> tuple[str, ...] | None:
    """The distributions providing ``top``; ``()`` for the user's own file; None to ignore it."""
    names = _packages().get(top)
    if names:
        return names
    entry = _sys_path_entry(top)
    if entry is None or {"site-packages", "dist-packages"} & set(entry.parts) or any(
            entry.is_relative_to(root) for root in _installed_roots()):
        return None  # no file (__main__), or a stray file in site-packages: nothing to pin
    owner = _editable_roots().get(entry)  # an editable install whose .pth puts it on sys.path
    return (owner,) if owner is not None else ()


def _sys_path_entry(top: str) -> Path | None:
    """The directory on sys.path that holds module ``top``, or None if it is no file."""
    module = sys.modules.get(top)
    try:
        spec = getattr(module, "__spec__", None) if module else importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is not None and spec.has_location and spec.origin:
        path = Path(spec.origin).resolve()
        return path.parent.parent if path.name.startswith("__init__.") else path.parent
    locations = list(getattr(spec, "submodule_search_locations", None) or ())  # namespace pkg
    return Path(locations[0]).resolve().parent if locations else None


@functools.cache
def _packages() -> dict[str, tuple[str, ...]]:
    """Top-level module → canonical distribution names; slow (~0.1 s), so once per process."""
    return {top: tuple(dict.fromkeys(canonicalize_name(n) for n in names))
            for top, names in metadata.packages_distributions().items()}


@functools.cache
def _installed_roots() -> tuple[Path, ...]:
    paths = sysconfig.get_paths()
    found = [*(paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths),
             *site.getsitepackages(), site.getusersitepackages()]
    return tuple(dict.fromkeys(Path(p).resolve() for p in found))


@functools.cache
def _editable_roots() -> dict[Path, str]:
    """Directories that local-path installs put on sys.path (their .pth lines) → distribution."""
    roots: dict[Path, str] = {}
    for dist in metadata.distributions():
        if not str(_direct_url(dist).get("url", "")).startswith("file:"):
            continue
        for file in (f for f in dist.files or () if f.suffix == ".pth"):
            try:
                lines = [line.strip() for line in file.read_text().splitlines()]
            except OSError:
                continue
            roots.update((Path(line).resolve(), canonicalize_name(dist.name)) for line in lines
                         if line and not line.startswith(("#", "import ", "import\t")))
    return roots


def _direct_url(dist: metadata.Distribution) -> dict[str, Any]:
    try:
        data = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


@functools.cache
def _dist_info(name: str) -> tuple[str, bool, tuple[str, ...]] | None:
    """``(pin, installed from a local path, names it requires here)``, None if not installed."""
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None
    direct = _direct_url(dist)
    url, vcs = str(direct.get("url", "")), direct.get("vcs_info")
    pin = f"{name} @ {url}" if url else f"{name}=={dist.version}"
    if isinstance(vcs, dict) and url:  # pip and uv both take "name @ git+url@commit"
        pin = f"{name} @ {vcs.get('vcs', 'git')}+{url}@{vcs.get('commit_id', '')}"
        pin += f"#subdirectory={direct['subdirectory']}" if direct.get("subdirectory") else ""
    return pin, url.startswith("file:"), tuple(_requires(dist))


def _requires(dist: metadata.Distribution) -> Iterator[str]:
    """Requirements whose markers hold here; ``extra == ...`` ones are false with extra ''."""
    for line in dist.requires or ():
        try:
            req = Requirement(line)
            needed = req.marker is None or req.marker.evaluate({"extra": ""})
        except (InvalidRequirement, UndefinedComparison, UndefinedEnvironmentName):
            continue
        if needed:
            yield canonicalize_name(req.name)


def _pin_closure(roots: set[str]) -> tuple[list[str], list[str]]:
    """Pins for ``roots`` and all installed they require (by name), local-path ones apart."""
    pins: dict[str, str] = {}
    local: dict[str, str] = {}
    todo = sorted(roots)
    while todo:
        name = todo.pop()
        if name in pins or name in local or name == _SELF:
            continue
        info = _dist_info(name)
        if info is not None:  # else required but not installed here
            pin, is_local, requires = info
            (local if is_local else pins)[name] = pin
            todo.extend(requires)
    return [pins[n] for n in sorted(pins)], [local[n] for n in sorted(local)]
