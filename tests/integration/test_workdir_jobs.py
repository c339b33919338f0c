"""include_local_workdir: the caller's directory travels to the job, all files, filtered."""

from __future__ import annotations

import sys

import pytest

import shoal
from shoal import remote
from shoal.core import JobQuery
from shoal.errors import InvalidArgumentError
from shoal.remote_function import CustomFileFilter


@pytest.fixture
def project(tmp_path, monkeypatch):
    root = tmp_path / "project"
    (root / "pkg").mkdir(parents=True)
    (root / "my_module.py").write_text("def where():\n    return 'shipped module'\n")
    (root / "pkg" / "__init__.py").write_text("VALUE = 42\n")
    (root / "data.csv").write_text("a,b\n1,2\n")
    (root / "notes.txt").write_text("keep me\n")
    (root / "secret.txt").write_text("do not ship\n")
    (root / "scratch.tmp").write_text("filtered\n")
    (root / ".gitignore").write_text("secret.txt\n")
    monkeypatch.chdir(root)
    monkeypatch.syspath_prepend(str(root))
    yield root
    for name in ("my_module", "pkg"):
        sys.modules.pop(name, None)


def _inspect():
    import os

    import my_module
    import pkg

    return (my_module.where(), pkg.VALUE, open("data.csv").read(), os.path.exists("secret.txt"),
            os.path.exists("scratch.tmp"), os.path.exists("notes.txt"),
            os.path.dirname(my_module.__file__) == os.getcwd())


def test_workdir_ships_all_files_honouring_gitignore_and_filters(session, project):
    f = remote(include_local_workdir=True,
               custom_file_filter=CustomFileFilter(ignore_name_patterns=["*.tmp"]))(_inspect)
    module, value, csv, secret, scratch, notes, imported_from_cwd = f()
    assert (module, value, csv) == ("shipped module", 42, "a,b\n1,2\n")
    assert not secret and not scratch and notes
    assert imported_from_cwd  # the shipped copy, in the job's own working directory
    [record] = session.metadata.list_jobs(JobQuery())
    sha = record.spec.workdir.sha256
    assert session.artifacts.exists(f"{record.name}/workdir/{sha}.zip")


def test_workdir_reaches_an_isolated_environment(session, project):
    (project / "requirements.txt").write_text("six==1.16.0\n")

    @remote(include_local_workdir=True, dependencies="requirements.txt")
    def use_both():
        import my_module
        import six

        return my_module.where(), six.__version__

    assert use_both() == ("shipped module", "1.16.0")


def test_workdir_over_the_limit_fails_naming_the_largest_files(session, project):
    with open(project / "huge.bin", "wb") as f:
        f.truncate(101 * 1024**2)  # sparse: large to stat, nothing on disk
    with pytest.raises(InvalidArgumentError) as info:
        remote(include_local_workdir=True)(_inspect)()
    assert "huge.bin" in str(info.value) and "CustomFileFilter" in str(info.value)
    assert session.metadata.list_jobs(JobQuery()) == []


def test_config_file_turns_the_workdir_on_with_its_filter(tmp_path, project, monkeypatch):
    config = tmp_path / "config.yaml"
    config.write_text("SchemaVersion: '1.0'\nSageMaker:\n  PythonSDK:\n    Modules:\n"
                      "      RemoteFunction:\n        IncludeLocalWorkDir: true\n"
                      "        CustomFileFilter:\n          IgnoreNamePatterns: ['*.tmp']\n")
    s = shoal.Session(home=str(tmp_path / "home2"), config_files=[config])
    try:
        result = remote(sagemaker_session=s)(_inspect)()
        assert result[0] == "shipped module" and result[4] is False
    finally:
        s.backend.shutdown_launcher()
        s.close()
