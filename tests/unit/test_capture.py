"""capture_requirements: what a function needs, pinned as installed; require_no_editable."""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import shoal
from shoal.envs import _capture
from shoal.envs._capture import CapturedRequirements, capture_requirements, require_no_editable
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

    expected = {pinned("SQLAlchemy"), pinned("typing_extensions")}
    try:  # greenlet is only an extra of SQLAlchemy 2.1, but some platforms' markers require it
        expected.add(pinned("greenlet")) if _needs("sqlalchemy", "greenlet") else None
    except metadata.PackageNotFoundError:
        pass
    assert set(captured.requirements) == expected
    assert captured.modules == ("sqlalchemy",)


def _needs(dist: str, dep: str) -> bool:
    for line in metadata.requires(dist) or ():
        req = Requirement(line)
        if canonicalize_name(req.name) == dep and (
                req.marker is None or req.marker.evaluate({"extra": ""})):
            metadata.version(dep)
            return True
    return False


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

        return shoal.errors, shoal.remote, _capture

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
    mymod = importlib.import_module("shoal_capture_mymod")
    monkeypatch.setitem(sys.modules, "shoal_capture_mymod", mymod)

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


def test_a_distribution_installed_from_a_local_path_is_editable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_capture, "_direct_url", _fake_direct_url(
        "pyyaml", {"url": "file:///src/mypkg", "dir_info": {"editable": True}}))
    _capture._dist_info.cache_clear()
    try:
        def f() -> object:
            import yaml

            return yaml

        captured = capture_requirements(f)
    finally:
        _capture._dist_info.cache_clear()

    assert captured.editable == ("pyyaml @ file:///src/mypkg",)
    assert captured.requirements == ()


def test_a_distribution_installed_from_vcs_is_pinned_to_its_commit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_capture, "_direct_url", _fake_direct_url(
        "pyyaml", {"url": "https://example.com/yaml.git",
                   "vcs_info": {"vcs": "git", "commit_id": "abc123"}}))
    _capture._dist_info.cache_clear()
    try:
        def f() -> object:
            import yaml

            return yaml

        captured = capture_requirements(f)
    finally:
        _capture._dist_info.cache_clear()

    assert captured.requirements == ("pyyaml @ git+https://example.com/yaml.git@abc123",)


def _fake_direct_url(name: str, data: dict[str, object]):  # noqa: ANN202
    real = _capture._direct_url

    def fake(dist: metadata.Distribution) -> dict[str, object]:
        return data if canonicalize_name(dist.name) == name else real(dist)

    return fake


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
        return shoal.Session if hasattr(shoal, "Session") else shoal

    assert capture_requirements(f).editable == ()


def test_capture_is_fast_once_warm() -> None:
    def f(n: int) -> object:
        return np.linalg.norm(np.arange(n))

    capture_requirements(f)
    start = time.perf_counter()
    for _ in range(10):
        capture_requirements(f)
    assert (time.perf_counter() - start) / 10 < 0.1


def test_direct_url_json_is_read_from_the_distribution() -> None:
    # Sanity: the editable checkout of shoal carries a direct_url.json saying so.
    data = json.loads(metadata.distribution("shoal").read_text("direct_url.json") or "{}")
    if not data.get("dir_info", {}).get("editable"):
        pytest.skip("shoal is not installed editable here")
    assert _capture._direct_url(metadata.distribution("shoal"))["url"].startswith("file:")
