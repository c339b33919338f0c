"""capture_requirements: what a function needs, pinned as installed; require_no_editable."""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import shoal
from shoal.envs import capture as capture_module
from shoal.envs.capture import CapturedRequirements, capture_requirements, require_no_editable
from shoal.errors import RuntimeEnvError


def pinned(name: str) -> str:
    return f"{canonicalize_name(name)}=={metadata.version(name)}"


def names(captured: CapturedRequirements) -> list[str]:
    return [Requirement(line).name for line in captured.requirements]


def in_main(source: str) -> dict[str, object]:
    """Run ``source`` as a notebook cell would: functions land in a module named __main__."""
    namespace: dict[str, object] = {"__name__": "__main__"}
    exec(compile(source, "<cell>", "exec"), namespace)
    return namespace


def test_a_global_module_is_pinned_at_its_installed_version() -> None:
    def f(n: int) -> object:
        return np.zeros(n)

    captured = capture_requirements(f)

    assert captured.requirements == (pinned("numpy"),)
    assert captured.modules == ("numpy",)
    assert captured.local_modules == captured.editable == ()


def test_an_import_in_the_body_pins_the_distribution_not_the_module_name() -> None:
    def f() -> str:
        import yaml  # module "yaml", distribution "PyYAML"

        return yaml.safe_dump({"a": 1})

    captured = capture_requirements(f)

    assert captured.requirements == ("pyyaml==" + metadata.version("PyYAML"),)
    assert captured.modules == ("yaml",)


def test_imports_in_nested_code_are_seen() -> None:
    def f() -> list[object]:
        def inner() -> object:
            import yaml

            return yaml

        return [inner() for _ in range(1)]

    assert names(capture_requirements(f)) == ["pyyaml"]


def test_a_closure_pins_the_distribution_and_its_installed_requirements() -> None:
    engine_type = sqlalchemy.engine.Engine

    def f() -> str:
        return engine_type.__name__

    captured = capture_requirements(f)

    # Whatever SQLAlchemy requires here (typing-extensions; greenlet where a marker asks for it
    # and it is installed), at its installed version. Those leaves require nothing installed.
    needed = {"typing-extensions", *installed_requirements("SQLAlchemy")}
    assert set(captured.requirements) == {pinned("SQLAlchemy"), *map(pinned, needed)}
    assert captured.modules == ("sqlalchemy",)


def installed_requirements(dist: str) -> set[str]:
    found = set()
    for line in metadata.requires(dist) or ():
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            try:
                metadata.version(req.name)
            except metadata.PackageNotFoundError:
                continue
            found.add(canonicalize_name(req.name))
    return found


def test_extras_only_requirements_are_skipped() -> None:
    # SQLAlchemy lists psycopg under the "postgresql" extra; psycopg is installed here.
    def f() -> object:
        return sqlalchemy.text

    assert "psycopg" not in names(capture_requirements(f))


def test_the_closure_is_walked_recursively() -> None:
    import pydantic

    def f() -> object:
        return pydantic.BaseModel

    found = set(names(capture_requirements(f)))

    assert {"pydantic", "pydantic-core", "typing-extensions"} <= found


def test_a_stdlib_only_function_needs_nothing() -> None:
    def f(path: str) -> str:
        return json.dumps(os.path.basename(path))

    captured = capture_requirements(f)

    assert captured.requirements == captured.modules == captured.editable == ()


def test_the_types_of_the_arguments_count() -> None:
    def f(x: object) -> object:
        return x

    assert capture_requirements(f).requirements == ()
    assert capture_requirements(f, extra_objects=[np.zeros(2)]).requirements == (pinned("numpy"),)


def test_a_helper_reached_through_globals_is_followed() -> None:
    cell = in_main("import yaml\n"
                   "def helper():\n    return yaml.safe_dump({})\n"
                   "def f():\n    return helper()\n")

    assert names(capture_requirements(cell["f"])) == ["pyyaml"]  # type: ignore[arg-type]


def _module_level_helper() -> str:
    import yaml

    return yaml.safe_dump({})


def test_a_module_level_helper_brings_its_whole_module() -> None:
    # Pickled by reference, the helper makes the job import this test module, and with it
    # everything the module imports.
    def f() -> str:
        return _module_level_helper()

    captured = capture_requirements(f)

    assert {"pyyaml", "numpy", "pytest", "sqlalchemy"} <= set(names(captured))
    assert captured.local_modules == (__name__.partition(".")[0],)


def test_methods_of_a_class_reached_through_globals_are_followed() -> None:
    cell = in_main("import yaml\n"
                   "class Dumper:\n    def dump(self):\n        return yaml.safe_dump({})\n"
                   "def f():\n    return Dumper().dump()\n")

    assert names(capture_requirements(cell["f"])) == ["pyyaml"]  # type: ignore[arg-type]


def test_decorated_and_recursive_functions_terminate() -> None:
    cell = in_main("import functools, numpy\n"
                   "def deco(fn):\n"
                   "    @functools.wraps(fn)\n"
                   "    def wrapper(*a):\n        return fn(*a)\n"
                   "    return wrapper\n"
                   "@deco\n"
                   "def f(n):\n    return f(n - 1) if n else numpy.ones(1)\n")

    assert names(capture_requirements(cell["f"])) == ["numpy"]  # type: ignore[arg-type]


def test_shoal_itself_is_never_listed() -> None:
    def f() -> object:
        import shoal.errors

        return shoal.errors, shoal.remote, capture_module

    captured = capture_requirements(f)

    assert "shoal" not in names(captured)
    assert "shoal" not in captured.modules
    assert not any("shoal" in line for line in captured.editable)


def test_requirements_are_sorted_by_name_and_unique() -> None:
    import pydantic
    import yaml

    def f(x: object) -> object:
        import sqlalchemy as sa

        return yaml, pydantic, np, sa, x

    captured = capture_requirements(f, extra_objects=[np.zeros(1), np.ones(1)])

    found = names(captured)
    assert found == sorted(found)
    assert len(found) == len(set(found))
    assert list(captured.modules) == sorted(captured.modules)


def test_a_local_module_is_reported_not_pinned(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "shoal_capture_mymod.py").write_text(
        "import yaml\n\ndef helper():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "shoal_capture_mymod", raising=False)  # dropped afterwards
    mymod = importlib.import_module("shoal_capture_mymod")

    def f() -> object:
        return mymod.helper()

    captured = capture_requirements(f)

    assert captured.local_modules == ("shoal_capture_mymod",)
    assert "shoal_capture_mymod" in captured.modules
    # The job imports the module whole, so what it imports is pinned too.
    assert names(captured) == ["pyyaml"]


def test_a_local_package_imported_in_the_body_is_reported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "shoal_capture_pkg").mkdir()
    (tmp_path / "shoal_capture_pkg" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))

    def f() -> object:
        import shoal_capture_pkg  # not imported yet: found on sys.path

        return shoal_capture_pkg

    captured = capture_requirements(f)

    assert captured.local_modules == ("shoal_capture_pkg",)
    assert captured.requirements == ()


def test_a_missing_module_imported_in_the_body_is_ignored() -> None:
    def f() -> object:
        try:
            import shoal_capture_not_installed  # type: ignore[import-not-found]
        except ImportError:
            return None
        return shoal_capture_not_installed

    captured = capture_requirements(f)

    assert captured.requirements == captured.modules == ()


@pytest.fixture
def fresh_caches() -> Iterator[None]:
    """Installed distributions are cached per process; these tests install fake ones."""
    caches = (capture_module._packages, capture_module._editable_roots,
              capture_module._dist_info)
    for cache in caches:
        cache.cache_clear()
    yield
    for cache in caches:
        cache.cache_clear()


def fake_dist(site_dir: Path, name: str, *, direct_url: dict[str, object], requires: str = "",
              top_level: str = "", pth: str = "") -> None:
    """Write ``name``-1.0.dist-info as pip leaves it: METADATA, direct_url.json, RECORD."""
    info = site_dir / f"{name.replace('-', '_')}-1.0.dist-info"  # escaped, as in a wheel
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
                                   + "".join(f"Requires-Dist: {r}\n" for r in requires.split()))
    (info / "direct_url.json").write_text(json.dumps(direct_url))
    record = [f"{info.name}/METADATA,,", f"{info.name}/direct_url.json,,"]
    if top_level:
        (info / "top_level.txt").write_text(top_level + "\n")
    if pth:
        (site_dir / f"__editable__.{name}-1.0.pth").write_text(pth + "\n")
        record.append(f"__editable__.{name}-1.0.pth,,")
    (info / "RECORD").write_text("\n".join(record) + "\n")


@pytest.mark.usefixtures("fresh_caches")
def test_an_editable_install_is_reported_with_its_requirements_pinned(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "proj"
    (project / "src" / "shoal_capture_ed").mkdir(parents=True)
    (project / "src" / "shoal_capture_ed" / "__init__.py").write_text("")
    # No top_level.txt: only the .pth line ties the source directory to the distribution.
    fake_dist(tmp_path / "site", "shoal-capture-ed", requires="pyyaml",
              direct_url={"url": project.as_uri(), "dir_info": {"editable": True}},
              pth=str(project / "src"))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.syspath_prepend(str(project / "src"))  # what the .pth does at startup

    def f() -> object:
        import shoal_capture_ed

        return shoal_capture_ed

    captured = capture_requirements(f)

    assert captured.editable == (f"shoal-capture-ed @ {project.as_uri()}",)
    assert captured.requirements == (pinned("PyYAML"),)
    assert captured.local_modules == ()
    require_no_editable(captured, shipped_workdir=project)
    with pytest.raises(RuntimeEnvError, match="shoal-capture-ed"):
        require_no_editable(captured, shipped_workdir=None)


@pytest.mark.usefixtures("fresh_caches")
def test_a_distribution_installed_from_vcs_is_pinned_to_its_commit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_dist(tmp_path, "shoal-capture-vcs", top_level="shoal_capture_vcs",
              direct_url={"url": "https://example.com/vcs.git",
                          "vcs_info": {"vcs": "git", "commit_id": "abc123"}})
    monkeypatch.syspath_prepend(str(tmp_path))

    def f() -> object:
        import shoal_capture_vcs  # type: ignore[import-not-found]

        return shoal_capture_vcs

    captured = capture_requirements(f)

    assert captured.requirements == ("shoal-capture-vcs @ git+https://example.com/vcs.git@abc123",)
    assert captured.modules == ("shoal_capture_vcs",)


def editable(*lines: str) -> CapturedRequirements:
    return CapturedRequirements(requirements=(), modules=(), local_modules=(), editable=lines)


def test_require_no_editable_names_each_distribution_and_its_path(tmp_path: Path) -> None:
    captured = editable(f"mypkg @ {(tmp_path / 'mypkg').as_uri()}",
                        f"other @ {(tmp_path / 'other').as_uri()}")

    with pytest.raises(RuntimeEnvError) as info:
        require_no_editable(captured, shipped_workdir=None)

    message = str(info.value)
    assert f"mypkg ({tmp_path / 'mypkg'})" in message
    assert f"other ({tmp_path / 'other'})" in message
    assert "include_local_workdir=True" in message
    assert info.value.details["distributions"] == {
        "mypkg": str(tmp_path / "mypkg"), "other": str(tmp_path / "other")}


def test_require_no_editable_accepts_paths_inside_the_shipped_workdir(tmp_path: Path) -> None:
    inside = editable(f"mypkg @ {(tmp_path / 'src' / 'mypkg').as_uri()}")
    outside = editable(f"mypkg @ {(tmp_path.parent / 'elsewhere').as_uri()}")

    require_no_editable(inside, shipped_workdir=tmp_path)
    require_no_editable(editable(), shipped_workdir=None)
    with pytest.raises(RuntimeEnvError, match="elsewhere"):
        require_no_editable(outside, shipped_workdir=tmp_path)


def test_the_editable_project_of_this_checkout_is_not_captured() -> None:
    # shoal is installed editable here; its own modules must never reach `editable`.
    def f() -> object:
        return shoal, shoal.errors.ShoalError

    assert capture_requirements(f).editable == ()


def test_capture_once_warm_scans_no_installed_distribution_again(monkeypatch) -> None:
    """The slow part (reading every installed distribution's metadata) runs once per process:
    a warm capture gives the same answer with those scans made impossible. (How fast that is
    lives in bench/, not here: a timed assertion fails on a busy machine.)"""
    import shoal.envs.capture as capture

    def f(n: int) -> object:
        return np.linalg.norm(np.arange(n))

    cold = capture_requirements(f)

    def no_scan(*_a: object, **_k: object) -> None:
        raise AssertionError("a warm capture scanned the installed distributions again")

    monkeypatch.setattr(capture.metadata, "packages_distributions", no_scan)
    monkeypatch.setattr(capture.metadata, "distributions", no_scan)
    assert [capture_requirements(f) for _ in range(3)] == [cold] * 3
