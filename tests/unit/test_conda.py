"""Conda environment files: parsing, the python constraint, the plan without a conda tool."""

from __future__ import annotations

import platform

import pytest
import yaml

from shoal.envs._conda import (
    CondaEnvBuilder,
    CondaSpec,
    parse_environment_yml,
    pin_client_python,
    plan_without_conda,
    python_specifier,
)
from shoal.envs._conda_pypi import conda_to_pip
from shoal.errors import RuntimeEnvError

CLIENT = platform.python_version()
MINOR = ".".join(CLIENT.split(".")[:2])

FULL = """\
name: analysis
channels:
  - conda-forge
  - defaults
dependencies:
  - python=3.11
  - numpy=1.26
  - conda-forge::libgcc
  - pip
  - pip:
      - six==1.16.0
      - requests>=2
"""


def spec(**kw: object) -> CondaSpec:
    values: dict[str, object] = {"name": None, "channels": (), "python": None,
                                 "conda_packages": (), "pip_packages": ()}
    values.update(kw)
    return CondaSpec(**values)  # type: ignore[arg-type]


# --- parsing --------------------------------------------------------------------------


def test_parse_separates_python_conda_and_pip_packages() -> None:
    parsed = parse_environment_yml(FULL, source="environment.yml")
    assert parsed == CondaSpec(name="analysis", channels=("conda-forge", "defaults"),
                               python="=3.11",
                               conda_packages=("numpy=1.26", "conda-forge::libgcc"),
                               pip_packages=("six==1.16.0", "requests>=2"))


@pytest.mark.parametrize(("entry", "constraint"), [
    ("python=3.11", "=3.11"), ("python==3.11.*", "==3.11.*"), ("python>=3.10", ">=3.10"),
    ("python >=3.10,<3.13", ">=3.10,<3.13"), ("python", None), ("conda-forge::python=3.12",
                                                                  "=3.12"),
])
def test_parse_keeps_the_python_constraint_as_written(entry: str, constraint: str | None) -> None:
    parsed = parse_environment_yml(f"dependencies: [{entry!r}]", source="env.yml")
    assert parsed.python == constraint and parsed.conda_packages == ()


def test_an_empty_file_or_one_without_dependencies_asks_for_nothing() -> None:
    assert parse_environment_yml("", source="e.yml") == spec()
    assert parse_environment_yml("name: x\n", source="e.yml") == spec(name="x")


@pytest.mark.parametrize(("text", "key"), [
    ("dependencies: [unclosed", "YAML"),
    ("- just\n- a list\n", "mapping"),
    ("dependencies: numpy\n", "dependencies"),
    ("dependencies:\n  - pip: six==1.16.0\n", "pip"),
    ("dependencies:\n  - pip: [1, 2]\n", "pip"),
    ("dependencies:\n  - 3.11\n", "dependencies"),
    ("dependencies:\n  - {conda: numpy}\n", "dependencies"),
    ("channels: conda-forge\n", "channels"),
    ("name: [a]\n", "name"),
])
def test_malformed_files_raise_naming_the_file_and_the_key(text: str, key: str) -> None:
    with pytest.raises(RuntimeEnvError) as info:
        parse_environment_yml(text, source="/proj/environment.yml")
    assert "/proj/environment.yml" in str(info.value)
    assert key in str(info.value)


@pytest.mark.parametrize(("constraint", "inside", "outside"), [
    ("=3.11", ["3.11.0", "3.11.9"], ["3.12.0", "3.1.0"]),
    ("=3.11.7", ["3.11.7"], ["3.11.8"]),
    ("==3.11.*", ["3.11.2"], ["3.10.2"]),
    ("3.11", ["3.11.4"], ["3.12.0"]),
    (">=3.10", ["3.10.0", "3.13.1"], ["3.9.18"]),
    (">=3.10,<3.12", ["3.11.0"], ["3.12.0"]),
    ("=3.11.7=h955ad1f_0", ["3.11.7"], ["3.11.6"]),
])
def test_conda_python_constraints_translate_to_pep440(constraint: str, inside: list[str],
                                                      outside: list[str]) -> None:
    allowed = python_specifier(constraint)
    assert all(allowed.contains(v) for v in inside)
    assert not any(allowed.contains(v) for v in outside)


def test_a_constraint_shoal_cannot_read_is_a_clear_error() -> None:
    with pytest.raises(RuntimeEnvError, match="python~~3 is not a version constraint"):
        python_specifier("~~3")


# --- without a conda tool -------------------------------------------------------------


def test_conda_packages_become_pypi_requirements() -> None:
    parsed = parse_environment_yml(FULL.replace("python=3.11", f"python={MINOR}"),
                                   source="environment.yml")
    plan = plan_without_conda(parsed, client_python="/usr/bin/python3")
    assert plan.requirements == "numpy==1.26.*\nsix==1.16.0\nrequests>=2\n"
    assert plan.notices == (
        "environment.yml: channels conda-forge, defaults ignored; without a conda tool the "
        "packages come from PyPI",
        "environment.yml: conda-forge::libgcc dropped: system packages, which PyPI wheels "
        "bundle or the machine provides")


@pytest.mark.parametrize(("entry", "requirement"), [
    ("numpy", "numpy"), ("numpy=1.26", "numpy==1.26.*"), ("numpy=1.26.4", "numpy==1.26.4"),
    ("numpy 1.26.4", "numpy==1.26.4"), ("numpy==1.26.4", "numpy==1.26.4"),
    ("numpy>=1.20,<2", "numpy>=1.20,<2"), ("numpy=1.26.4=py311h64a7726_0", "numpy==1.26.4"),
    ("numpy 1.26.*", "numpy==1.26.*"), ("pytorch=2.1", "torch==2.1.*"),
    ("conda-forge::py-xgboost>=2", "xgboost>=2"), ("matplotlib-base", "matplotlib"),
    ("scikit-learn=1.4", "scikit-learn==1.4.*"), ("msgpack-python", "msgpack"),
])
def test_conda_names_and_versions_translate(entry: str, requirement: str) -> None:
    assert conda_to_pip([entry], source="e.yml").requirements == (requirement,)


def test_system_packages_are_dropped_and_r_packages_fail_named() -> None:
    out = conda_to_pip(["libgcc-ng", "_openmp_mutex", "cudatoolkit=11.8", "mkl", "pandas"],
                       source="e.yml")
    assert out.requirements == ("pandas",)
    assert out.dropped == ("libgcc-ng", "_openmp_mutex", "cudatoolkit=11.8", "mkl")
    with pytest.raises(RuntimeEnvError, match="e.yml needs conda for r-base, r-ggplot2"):
        conda_to_pip(["r-base", "numpy", "r-ggplot2"], source="e.yml")
    with pytest.raises(RuntimeEnvError, match="'|'"):
        conda_to_pip(["numpy 1.25|1.26"], source="e.yml")


@pytest.mark.parametrize("constraint", [f"={MINOR}", f"=={MINOR}.*", ">=3.8", f"={CLIENT}",
                                        None])
def test_a_python_constraint_the_client_satisfies_is_fine(constraint: str | None) -> None:
    plan = plan_without_conda(
        spec(python=constraint, pip_packages=("six==1.16.0", "--index-url https://x/simple")),
        client_python="/opt/py/bin/python")
    assert plan.python == "/opt/py/bin/python" and plan.notices == ()
    assert plan.requirements == "six==1.16.0\n--index-url https://x/simple\n"


def test_a_python_the_client_does_not_run_runs_on_the_clients_with_a_notice() -> None:
    plan = plan_without_conda(spec(python="=3.99"), client_python="python",
                              source="/proj/environment.yml")
    assert plan.python == "python"
    assert plan.notices == (f"environment.yml asks for python=3.99; the job runs on the "
                            f"client's Python {CLIENT} (no conda tool to install another)",)
    with pytest.raises(RuntimeEnvError) as info:
        plan_without_conda(spec(python="=3.99"), client_python="python",
                           source="/proj/environment.yml", strict=True)
    assert str(info.value).startswith("strict_versions: /proj/environment.yml asks for "
                                      f"python=3.99 but the client runs Python {CLIENT}")


def test_the_client_patch_release_counts_without_a_conda_tool() -> None:
    assert plan_without_conda(spec(python="=3.11.7"), client_python="python",
                              client_version="3.11.9").notices != ()
    assert plan_without_conda(spec(python="=3.11.7"), client_python="python",
                              client_version="3.11.7").notices == ()


# --- with a conda tool (no subprocess: the file handed to the tool and the cache key) ----


def _python_entry(text: str) -> str:
    [entry] = [d for d in yaml.safe_load(text)["dependencies"]
               if isinstance(d, str) and d.startswith("python")]
    return entry


def test_the_python_a_conda_tool_may_pick_is_narrowed_to_the_client_minor() -> None:
    text = "dependencies:\n  - numpy\n  - python>=3.8\n  - pip:\n      - six\n"
    pinned = pin_client_python(text, parse_environment_yml(text, source="e.yml"),
                               client_version="3.11.7")
    assert _python_entry(pinned) == "python >=3.8,>=3.11,<3.12"
    assert yaml.safe_load(pinned)["dependencies"][:1] == ["numpy"]
    bare = "dependencies: [numpy]\n"
    pinned = pin_client_python(bare, parse_environment_yml(bare, source="e.yml"),
                               client_version="3.11.7")
    assert _python_entry(pinned) == "python >=3.11,<3.12"


def test_a_python_already_within_the_client_minor_is_left_alone() -> None:
    text = "dependencies: [python=3.11.7, numpy]  # as written\n"
    assert pin_client_python(text, parse_environment_yml(text, source="e.yml"),
                             client_version="3.11.2") == text


def test_the_cache_key_ignores_formatting_but_not_packages_or_tool(tmp_path) -> None:
    micromamba = CondaEnvBuilder(tmp_path, "/usr/bin/micromamba")
    a = micromamba.key_for("dependencies: [python=3.11, numpy]\n", ("cloudpickle==3",))
    assert a.startswith("conda-")
    assert a == micromamba.key_for("# comment\ndependencies:\n  - python=3.11\n  - numpy\n",
                                   ("cloudpickle==3",))
    assert a != micromamba.key_for("dependencies: [python=3.11, scipy]\n", ("cloudpickle==3",))
    assert a != micromamba.key_for("dependencies: [python=3.11, numpy]\n", ("cloudpickle==2",))
    assert a != CondaEnvBuilder(tmp_path, "/usr/bin/conda").key_for(
        "dependencies: [python=3.11, numpy]\n", ("cloudpickle==3",))


def test_a_conda_tool_is_not_asked_for_a_python_the_client_cannot_run(tmp_path) -> None:
    builder = CondaEnvBuilder(tmp_path / "envs", "/nonexistent/micromamba")
    with pytest.raises(RuntimeEnvError, match="asks for python=3.99"):
        builder.ensure("dependencies: [python=3.99]\n", base_dir=tmp_path)
    assert not (tmp_path / "envs").exists()
