"""Framework estimators: the container table, the resolution of its pins for this Python, the
notices and ``strict_versions``. Resolution asks the real uv (PyPI) and caches the answer."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

import shoal
from shoal.envs import NotInstallable, lowest_installable, sagemaker_alias_dir
from shoal.errors import InvalidArgumentError, RuntimeEnvError
from shoal.sklearn import SKLearn
from shoal.training._framework_env import plan_framework_env, requirement_bounds
from shoal.training._frameworks import PyTorch as _PyTorch
from shoal.training.containers import CONTAINERS, container_for

OURS = f"{sys.version_info.major}.{sys.version_info.minor}"


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("pass\n")
    return str(path)


# --- the table ------------------------------------------------------------------------


def test_every_container_row_names_the_release_its_version_string_means():
    for (framework, ver), c in CONTAINERS.items():
        if framework == "sklearn":  # SageMaker's "1.2-1": scikit-learn 1.2.x, image build 1
            assert c.release.split(".")[:2] == ver.split("-")[0].split(".")[:2], (ver, c)
        else:
            assert c.release == ver
        assert all(p[:1].isdigit() or p[:1] in "<>" for p in c.pins.values()), c


def test_short_names_and_unknown_versions():
    assert container_for("pytorch", "1.13").release == "1.13.1"
    assert container_for("sklearn", "1.2").release == "1.2.1"
    assert container_for("sklearn", "1.3-1") is None


def test_bounds_are_the_container_pins_within_their_major():
    _, release, reqs = requirement_bounds("sklearn", "scikit-learn", "0.23-1")
    assert release == "0.23.2"
    assert reqs == ["scikit-learn>=0.23.2", "numpy>=1.19.2,<2", "pandas>=1.1.3,<2",
                    "scipy>=1.5.3,<2", "boto3>=1.14.62,<2"]
    # A release built against NumPy 1 keeps NumPy 1, in the table or not.
    assert "numpy<2" in requirement_bounds("pytorch", "torch", "1.5.0")[2]
    assert "numpy<2" in requirement_bounds("sklearn", "scikit-learn", "1.3-1")[2]
    assert not [r for r in requirement_bounds("pytorch", "torch", "2.5.1")[2] if "numpy" in r]
    # What the user's requirements.txt names is the user's to choose.
    assert requirement_bounds("sklearn", "scikit-learn", "0.23-1", {"numpy", "boto3"})[2] == [
        "scikit-learn>=0.23.2", "pandas>=1.1.3,<2", "scipy>=1.5.3,<2"]
    with pytest.raises(InvalidArgumentError, match="not a scikit-learn version"):
        requirement_bounds("sklearn", "scikit-learn", "latest")


# --- resolution (real uv) ---------------------------------------------------------------


def test_a_release_with_a_wheel_here_runs_as_itself(tmp_path):
    plan = plan_framework_env("sklearn", "scikit-learn", "1.2-1", strict=True,
                              python=sys.executable, cache_dir=tmp_path)
    assert plan.resolved == "1.2.1" and plan.requirements[0] == "scikit-learn==1.2.1"
    numpy = [r for r in plan.requirements if r.startswith("numpy==")]
    assert numpy and numpy[0].startswith("numpy==1.")
    assert not [n for n in plan.notices if "ran as" in n]


def test_a_release_without_a_wheel_falls_back_to_the_nearest_with_a_notice(tmp_path):
    plan = plan_framework_env("pytorch", "torch", "1.5.0", strict=False, python=sys.executable,
                              cache_dir=tmp_path)
    # torch 1.5 has no wheel for this Python: the nearest later release uv finds that has.
    assert (1, 5) < tuple(int(p) for p in plan.resolved.split(".")[:2]) < (2, 0)
    assert plan.notices == (f"framework_version 1.5.0 ran as torch {plan.resolved}: torch 1.5.0 "
                            f"has no wheel for Python {OURS}",)
    assert plan.requirements == (f"torch=={plan.resolved}", "numpy<2", "boto3")
    # uv says the same when asked for 1.5 itself.
    with pytest.raises(NotInstallable):
        lowest_installable(["torch>=1.5.0,<1.6"], binary=["torch"], python=sys.executable)


def test_the_answer_is_cached_and_serves_without_uv(tmp_path, monkeypatch):
    first = lowest_installable(["scikit-learn>=0.23.2"], binary=["scikit-learn"],
                               python=sys.executable, cache_dir=tmp_path)
    assert [p.name for p in tmp_path.glob("*.json")]
    monkeypatch.setattr("shoal.envs._wheels.find_uv", lambda: "/nonexistent/uv")
    assert lowest_installable(["scikit-learn>=0.23.2"], binary=["scikit-learn"],
                              python=sys.executable, cache_dir=tmp_path) == first
    with pytest.raises(RuntimeEnvError, match="failed"):  # a new question does need uv
        lowest_installable(["scikit-learn>=1.0.2"], binary=["scikit-learn"],
                           python=sys.executable, cache_dir=tmp_path)


def test_a_version_nothing_installs_for_is_a_clear_error(tmp_path):
    with pytest.raises(RuntimeEnvError, match="no scikit-learn release at or after 99.1"):
        plan_framework_env("sklearn", "scikit-learn", "99.1-1", strict=False,
                           python=sys.executable, cache_dir=tmp_path)


# --- the estimators ---------------------------------------------------------------------


def test_strict_versions_turns_the_fallback_into_an_error(script):
    est = SKLearn(entry_point=script, framework_version="0.23-1", strict_versions=True)
    with pytest.raises(InvalidArgumentError) as info:
        est._env_requirements()
    message = str(info.value)
    assert message.startswith("strict_versions: sklearn framework_version 0.23-1 needs "
                              f"scikit-learn 0.23.2, which has no wheel for Python {OURS}")


def test_strict_versions_as_a_setting(script, tmp_path):
    session = shoal.Session(home=str(tmp_path / "h"), strict_versions=True)
    with pytest.raises(InvalidArgumentError, match="strict_versions: pytorch framework_version"
                                                   " 2.0.1 with py_version py310"):
        _PyTorch(entry_point=script, framework_version="2.0.1", py_version="py310",
                 sagemaker_session=session)
    est = _PyTorch(entry_point=script, framework_version="2.0.1", py_version="py310",
                   sagemaker_session=session, strict_versions=False)
    assert est._framework_notices == (f"py_version py310 ran on Python {OURS}: shoal runs a job "
                                      "on the client's Python",)


def test_python_2_is_refused(script):
    with pytest.raises(InvalidArgumentError, match="py_version='py27'"):
        SKLearn(entry_point=script, framework_version="1.2-1", py_version="py27")
    with pytest.raises(InvalidArgumentError, match="SKLearn trains on one instance"):
        SKLearn(entry_point=script, framework_version="1.2-1", instance_count=2)


def test_another_version_gets_the_container_pins_and_shoals_own(script):
    est = SKLearn(entry_point=script, framework_version="0.23-1")
    lines = est._env_requirements().splitlines()
    assert lines[0].startswith("scikit-learn==") and "boto3==1.14.62" in lines
    assert f"sqlalchemy=={version('sqlalchemy')}" in lines  # sagemaker (shoal) imports there
    assert [n for n in est._framework_notices if n.startswith("framework_version 0.23-1 ran")]


def test_installed_framework_needs_no_environment_build(script):
    pytest.importorskip("torch")
    installed = version("torch").split("+")[0]
    est = _PyTorch(entry_point=script, framework_version=installed, py_version=f"py3"
                   f"{sys.version_info.minor}")
    assert est._framework == ("torch", installed)
    assert est._env_requirements() is None  # the client's environment already has it


def test_requirements_txt_in_source_dir_joins_the_pin(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("pass\n")
    (src / "requirements.txt").write_text("six==1.16.0\n")
    est = SKLearn(entry_point="train.py", source_dir=str(src),
                  framework_version=version("scikit-learn"))
    assert est._env_requirements().splitlines() == [
        f"scikit-learn=={version('scikit-learn')}", "six==1.16.0"]


# --- sagemaker as shoal ---------------------------------------------------------------


def test_the_alias_directory_makes_sagemaker_shoal_module_for_module(tmp_path):
    alias = sagemaker_alias_dir(tmp_path / "alias")
    src = Path(shoal.__file__).resolve().parent.parent
    probe = ("import sagemaker, shoal, shoal.experiments.run as r\n"
             "from sagemaker.experiments.run import load_run\n"
             "import sagemaker.experiments.run as s\n"
             "assert sagemaker is shoal and s is r and load_run is r.load_run\n"
             "print(sagemaker.__name__)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env={"PYTHONPATH": f"{alias}:{src}", "PATH": "/usr/bin:/bin"},
                          check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "shoal"
    assert sagemaker_alias_dir(tmp_path / "alias") == alias  # made once


def test_a_job_environments_alias_is_the_one_shoal_alias_install_writes(tmp_path):
    from shoal.cli import _alias
    from shoal.envs import write_sagemaker_alias_pth
    from shoal.envs._sagemaker_alias import PTH_FILE, PTH_LINE

    assert (PTH_FILE, PTH_LINE) == (_alias._PTH, _alias._PTH_LINE)
    site = tmp_path / "site-packages"
    site.mkdir()
    assert write_sagemaker_alias_pth(site)
    assert all(_alias._ours(site / n) for n in (_alias._PTH, _alias._MODULE))
    (site / "sagemaker").mkdir()  # a real one: left alone
    other = tmp_path / "other"
    other.mkdir()
    (other / "sagemaker-2.200.0.dist-info").mkdir()
    assert not write_sagemaker_alias_pth(other) and list(other.iterdir()) == [
        other / "sagemaker-2.200.0.dist-info"]
