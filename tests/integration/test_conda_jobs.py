"""Jobs whose dependencies are a conda environment.yml, with and without a conda tool on PATH.

``@remote`` still refuses ``.yml`` dependencies and ``job_conda_env`` (TODO(#3) in
remote_function/_options.py), so these tests build the spec with RemoteOptions and replace its
``dependencies`` (or set ``conda_env``) before submitting through JobService.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shoal.core import FailureKind
from shoal.envs import find_conda_tool, find_uv
from shoal.errors import JobFailedError
from shoal.remote_function import RemoteOptions

pytestmark = pytest.mark.slow

MINOR = ".".join(platform.python_version().split(".")[:2])
MARKER = "built-by-fake-micromamba"


def _run_job(session: Any, func: Callable[[], Any], *, dependencies: Path | None = None,
             conda_env: str | None = None) -> tuple[Any, Any]:
    """(record, outcome or the exception) of *func* run as a job with these dependencies."""
    spec = RemoteOptions().build_spec(func, session)
    spec = dataclasses.replace(spec, dependencies=str(dependencies) if dependencies else None,
                               conda_env=conda_env or spec.conda_env)
    record = session.jobs.submit_function(spec, func, (), {})
    record = session.jobs.wait(record.name, timeout=180)
    try:
        return record, session.jobs.outcome(record)
    except JobFailedError as e:
        return record, e


def _probe() -> tuple[str, str, bool, bool]:
    import importlib.util
    import sys

    import six

    return (six.__version__, sys.prefix, importlib.util.find_spec("sqlalchemy") is None,
            os.path.exists(os.path.join(sys.prefix, MARKER)))


def _write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def no_conda_tool() -> None:
    if find_conda_tool() is not None:
        pytest.skip("a conda tool is on PATH; these tests cover the machine without one")


# --- without a conda tool: the pip: section through uv ---------------------------------


def test_pip_section_runs_through_uv_without_a_conda_tool(session, tmp_path, no_conda_tool):
    yml = _write(tmp_path / "environment.yml", f"""\
        name: job
        channels: [conda-forge]
        dependencies:
          - python={MINOR}
          - pip
          - pip:
              - six==1.16.0
        """)
    record, result = _run_job(session, _probe, dependencies=yml)
    version, prefix, no_sqlalchemy, built_by_tool = result
    assert (version, no_sqlalchemy, built_by_tool) == ("1.16.0", True, False)
    [env] = session.env_builder.list()
    assert prefix == str(env.path) and not env.key.startswith("conda-")
    log = session.jobs.read_log(record.name).decode()
    assert "no conda tool on PATH" in log and "with uv" in log


def _conda_named_probe() -> tuple[str, str, str, str]:
    import sys

    import msgpack
    import numpy
    import six

    return (".".join(map(str, msgpack.version)), numpy.__version__, six.__version__,
            sys.prefix)


def test_conda_names_build_with_uv_without_a_conda_tool(session, tmp_path, no_conda_tool):
    yml = _write(tmp_path / "environment.yml", """\
        name: analysis
        channels: [conda-forge, defaults]
        dependencies:
          - python=3.99
          - _libgcc_mutex
          - libgcc-ng
          - ca-certificates
          - msgpack-python=1.0
          - conda-forge::numpy=1.26
          - pip
          - pip:
              - six==1.16.0
        """)
    record, result = _run_job(session, _conda_named_probe, dependencies=yml)
    msgpack_version, numpy_version, six_version, prefix = result
    assert msgpack_version.startswith("1.0.") and numpy_version.startswith("1.26.")
    assert six_version == "1.16.0"
    [env] = session.env_builder.list()
    assert prefix == str(env.path)
    log = session.jobs.read_log(record.name).decode()
    assert "channels conda-forge, defaults ignored" in log
    assert "_libgcc_mutex, libgcc-ng, ca-certificates dropped: system packages" in log
    assert "msgpack-python as msgpack" in log
    assert (f"asks for python=3.99; the job runs on the client's Python "
            f"{platform.python_version()}") in log


def test_a_conda_package_pypi_does_not_have_fails_naming_it(session, tmp_path, no_conda_tool):
    yml = _write(tmp_path / "environment.yml", f"""\
        dependencies:
          - python={MINOR}
          - libgcc
          - poppler=24.04
          - pip: [six==1.16.0]
        """)
    record, error = _run_job(session, _probe, dependencies=yml)
    assert isinstance(error, JobFailedError)
    assert record.failure_kind == FailureKind.ENVIRONMENT
    assert "conda package 'poppler' has no PyPI counterpart" in record.failure_reason
    assert "micromamba" in record.failure_reason and "libgcc" not in record.failure_reason
    assert session.env_builder.list() == []
    assert not list((session.home / "envs").glob(".build-*"))


def test_with_strict_versions_a_python_the_client_does_not_run_fails(tmp_path, no_conda_tool):
    import shoal
    from conftest import make_session

    yml = _write(tmp_path / "environment.yml", """\
        dependencies:
          - python=3.99
          - pip: [six==1.16.0]
        """)
    strict = make_session(tmp_path / "strict-home", strict_versions=True)
    try:
        with shoal.use(strict):
            record, error = _run_job(strict, _probe, dependencies=yml)
    finally:
        strict.backend.shutdown_launcher()
        strict.close()
    assert isinstance(error, JobFailedError)
    assert record.failure_kind == FailureKind.ENVIRONMENT
    assert (f"strict_versions: {yml} asks for python=3.99 but the client runs Python "
            f"{platform.python_version()}") in record.failure_reason


# --- with a conda tool: a stand-in micromamba ------------------------------------------


def _fake_micromamba(tmp_path: Path, *, envs: list[Path]) -> Path:
    """A stand-in ``micromamba``: conda tools cannot be installed on this test machine (no
    conda-forge access), so this script implements just ``create -y -p PREFIX -f FILE`` (a uv
    venv on the client's Python, plus the file's pip: section, plus a marker file in PREFIX)
    and ``env list --json``, which is all shoal asks of the tool."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "micromamba-calls"
    pip_section = ("import sys, yaml; d = yaml.safe_load(open(sys.argv[1])); "
                   "print('\\n'.join(p for e in d.get('dependencies') or [] "
                   "if isinstance(e, dict) for p in e['pip']))")
    script = bin_dir / "micromamba"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        set -eu
        echo "$*" >> {calls}
        if [ "$1 $2" = "env list" ]; then
            echo '{json.dumps({"envs": [str(p) for p in envs]})}'
            exit 0
        fi
        if [ "$1 $2 $3 $5" != "create -y -p -f" ]; then
            echo "unexpected: $*" >&2; exit 2
        fi
        prefix=$4 file=$6
        {find_uv()} venv --quiet --python {sys.executable} "$prefix"
        {sys.executable} -c "{pip_section}" "$file" > "$prefix/pip-section.txt"
        if [ -s "$prefix/pip-section.txt" ]; then
            {find_uv()} pip install --quiet --python "$prefix/bin/python" \\
                -r "$prefix/pip-section.txt"
        fi
        cp "$file" "$prefix/{MARKER}"
        """))
    script.chmod(0o755)
    return bin_dir


@pytest.fixture
def fake_micromamba(tmp_path, monkeypatch) -> Path:
    """PATH with the stand-in micromamba first; the supervisor inherits the client's PATH."""
    named = tmp_path / "mamba-root" / "envs" / "tools"
    bin_dir = _fake_micromamba(tmp_path, envs=[tmp_path / "mamba-root", named])
    monkeypatch.setenv("PATH", os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")]))
    assert find_conda_tool() == str(bin_dir / "micromamba")
    return tmp_path / "micromamba-calls"


def test_with_a_conda_tool_the_file_is_built_by_it_and_cached(session, tmp_path,
                                                              fake_micromamba):
    yml = _write(tmp_path / "environment.yml", """\
        channels: [conda-forge]
        dependencies:
          - python>=3.8
          - libgcc
          - pip: [six==1.16.0]
        """)
    record, result = _run_job(session, _probe, dependencies=yml)
    version, prefix, no_sqlalchemy, built_by_tool = result
    assert (version, no_sqlalchemy, built_by_tool) == ("1.16.0", True, True)
    [env] = session.env_builder.list()
    assert env.key.startswith("conda-") and prefix == str(env.path)
    # The tool got the file with its Python narrowed to the client's major.minor.
    handed = (env.path / MARKER).read_text()
    assert f"python >=3.8,>={MINOR}," in handed and "libgcc" in handed
    lock = session.artifacts.get_bytes(f"{record.name}/env/requirements.lock").decode()
    assert "libgcc" in lock
    assert "building a conda environment with micromamba" in \
        session.jobs.read_log(record.name).decode()

    record, result = _run_job(session, _probe, dependencies=yml)
    assert result[1] == prefix
    assert len(fake_micromamba.read_text().splitlines()) == 1  # built once, then cached
    assert "(cached)" in session.jobs.read_log(record.name).decode()


def test_with_a_conda_tool_a_failed_build_leaves_nothing(session, tmp_path, fake_micromamba):
    yml = _write(tmp_path / "environment.yml", f"""\
        dependencies:
          - python={MINOR}
          - pip: [shoal-surely-not-a-real-package==9.9.9]
        """)
    record, error = _run_job(session, _probe, dependencies=yml)
    assert isinstance(error, JobFailedError)
    assert record.failure_kind == FailureKind.ENVIRONMENT
    assert "shoal-surely-not-a-real-package" in record.failure_reason
    assert session.env_builder.list() == []
    assert [p.name for p in (session.home / "envs").iterdir() if not p.name.endswith(".lock")
            ] == []


def test_with_a_conda_tool_a_python_that_is_not_installed_fails_before_building(
        session, tmp_path, fake_micromamba):
    yml = _write(tmp_path / "environment.yml", "dependencies: [python=3.99]\n")
    record, error = _run_job(session, _probe, dependencies=yml)
    assert record.failure_kind == FailureKind.ENVIRONMENT
    assert "asks for python=3.99" in record.failure_reason
    assert not fake_micromamba.exists()  # the tool was never asked
    assert session.env_builder.list() == []


def test_job_conda_env_installs_the_requirements_into_the_named_env(session, tmp_path,
                                                                   fake_micromamba):
    from shoal.envs._conda import _run

    named = tmp_path / "mamba-root" / "envs" / "tools"
    _run([find_uv(), "venv", "--quiet", "--python", sys.executable, str(named)],
         what="making the named env")
    req = _write(tmp_path / "requirements.txt", "six==1.16.0\n")
    record, result = _run_job(session, _probe, dependencies=req, conda_env="tools")
    version, prefix, _, _ = result
    assert (version, prefix) == ("1.16.0", str(named))
    assert session.env_builder.list() == []  # shoal caches nothing for a named env

    record, error = _run_job(session, _probe, dependencies=req, conda_env="nope")
    assert record.failure_kind == FailureKind.ENVIRONMENT
    assert "no such conda environment" in record.failure_reason
    assert "base, tools" in record.failure_reason


def _prepare_builds_for_conda_env_alone() -> bool:
    import inspect

    from shoal.jobs._prepare import Preparer

    return "conda_env" in inspect.getsource(Preparer.prepare)


@pytest.mark.skipif(not _prepare_builds_for_conda_env_alone(),
                    reason="TODO(#3): Preparer.prepare() must call _build_env when "
                           "spec.conda_env is set without dependencies")
def test_job_conda_env_alone_runs_the_job_in_the_named_env(session, tmp_path, fake_micromamba):
    from shoal.envs._conda import _run

    named = tmp_path / "mamba-root" / "envs" / "tools"
    _run([find_uv(), "venv", "--quiet", "--python", sys.executable, str(named)],
         what="making the named env")

    def where() -> str:
        import sys

        return sys.prefix

    record, result = _run_job(session, where, conda_env="tools")
    assert result == str(named)
    assert "installing cloudpickle==" in session.jobs.read_log(record.name).decode()
