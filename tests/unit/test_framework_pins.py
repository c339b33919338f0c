"""Framework estimators pin their framework in the job's environment."""

from __future__ import annotations

from importlib.metadata import version

import pytest

from shoal.errors import InvalidArgumentError
from shoal.sklearn import SKLearn
from shoal.training._estimator import Framework
from shoal.training._estimator import PyTorch as _PyTorch


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("pass\n")
    return str(path)


def test_pins_follow_sagemaker_version_strings():
    assert Framework._pin("2.13.0") == "==2.13.0"
    assert Framework._pin("2.13") == "==2.13.*"
    assert SKLearn._pin("1.2-1") == "==1.2.*"


def test_installed_framework_needs_no_environment_build(script):
    pytest.importorskip("torch")
    est = _PyTorch(entry_point=script, framework_version=version("torch").split("+")[0],
                   py_version="py311")
    assert est._framework == ("torch", f"=={version('torch').split('+')[0]}")
    assert est._env_requirements() is None  # the client's environment already has it


def test_another_framework_version_is_installed_in_the_job_environment(script):
    est = SKLearn(entry_point=script, framework_version="0.23-1")
    assert est._env_requirements() == "scikit-learn==0.23.*\n"


def test_requirements_txt_in_source_dir_joins_the_pin(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("pass\n")
    (src / "requirements.txt").write_text("six==1.16.0\n")
    est = SKLearn(entry_point="train.py", source_dir=str(src),
                  framework_version=version("scikit-learn"))
    assert est._env_requirements().splitlines() == [
        f"scikit-learn=={version('scikit-learn')}", "six==1.16.0"]


def test_bad_python_version_and_multi_instance_sklearn(script):
    with pytest.raises(InvalidArgumentError, match="py_version='py27'"):
        SKLearn(entry_point=script, framework_version="1.2-1", py_version="py27")
    with pytest.raises(InvalidArgumentError, match="SKLearn trains on one instance"):
        SKLearn(entry_point=script, framework_version="1.2-1", instance_count=2)
