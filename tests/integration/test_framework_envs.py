"""Framework jobs in the environment SageMaker's container would give them, on this Python.

Real environments built with uv from PyPI (slow on a loaded machine: each test builds one;
uv's own cache makes the second build of the same packages quick). The training scripts are
written as SageMaker scripts are: ``import sagemaker``, ``boto3``, ``load_run`` unmodified.
"""

from __future__ import annotations

import json
import sys
import textwrap
from importlib.metadata import version

import pytest

from shoal.core.experiments import run_owner
from shoal.experiments.run import Run
from shoal.pytorch import PyTorch
from shoal.sklearn import SKLearn

pytestmark = pytest.mark.slow

# What a SageMaker scikit-learn script typically does, plus a report of what it saw.
SKLEARN_SCRIPT = """
import argparse, json, os

import boto3
import numpy as np
import pandas as pd
import sklearn
from sagemaker.experiments.run import load_run
from sklearn.linear_model import LogisticRegression

import sagemaker

parser = argparse.ArgumentParser()
parser.add_argument("--C", type=float, default=1.0)
args = parser.parse_args()
X = np.array([[0.0], [1.0], [2.0], [3.0]])
y = pd.Series([0, 0, 1, 1])
model = LogisticRegression(C=args.C).fit(X, y)
with load_run() as run:
    run.log_metric("train:accuracy", float(model.score(X, y)))
print("SEEN " + json.dumps({
    "sklearn": sklearn.__version__, "numpy": np.__version__, "pandas": pd.__version__,
    "boto3": boto3.__version__, "sagemaker": sagemaker.__name__,
    "load_run": load_run.__module__}))
"""


def _seen(session, job: str) -> dict:
    log = session.jobs.read_log(job).decode()
    [line] = [ln for ln in log.splitlines() if ln.startswith("SEEN ")]
    return json.loads(line[len("SEEN "):])


def test_sklearn_1_2_1_runs_with_numpy_1_and_sagemaker_as_shoal(session, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SKLEARN_SCRIPT)
    with Run(experiment_name="containers", run_name="sk-1-2"):
        est = SKLearn(entry_point=str(script), framework_version="1.2-1", py_version="py310",
                      hyperparameters={"C": 0.5})
        est.fit(logs=False)
    job = est.latest_training_job.name
    seen = _seen(session, job)
    assert seen["sklearn"] == "1.2.1"  # the container's own release: it has a wheel here
    assert int(seen["numpy"].split(".")[0]) == 1  # no "numpy.dtype size changed"
    assert seen["pandas"].startswith("1.")
    assert seen["boto3"] and seen["sagemaker"] == "shoal"
    assert seen["load_run"] == "shoal.experiments.run"
    points = session.metadata.get_metrics(run_owner("containers", "sk-1-2"))
    assert [p.value for p in points if p.name == "train:accuracy"] == [1.0]
    # py_version asked for Python 3.10; the job ran on the client's, and said so once.
    record = session.jobs.get(job)
    ours = f"{sys.version_info.major}.{sys.version_info.minor}"
    py_notice = f"py_version py310 ran on Python {ours}"
    assert [n for n in record.spec.framework_notices if py_notice in n]
    assert session.jobs.read_log(job).decode().count(py_notice) == 1


def test_a_version_without_a_wheel_runs_as_the_nearest_and_says_so(session, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SKLEARN_SCRIPT)
    with Run(experiment_name="containers", run_name="sk-0-23"):
        est = SKLearn(entry_point=str(script), framework_version="0.23-1")
        est.fit(logs=False)
    job = est.latest_training_job.name
    seen = _seen(session, job)
    major, minor = (int(p) for p in seen["sklearn"].split(".")[:2])
    assert (major, minor) > (0, 23) and int(seen["numpy"].split(".")[0]) == 1
    assert seen["boto3"] == "1.14.62"  # the container's boto3 installs on any Python
    notice = (f"framework_version 0.23-1 ran as scikit-learn {seen['sklearn']}: scikit-learn "
              f"0.23.2 has no wheel for Python {sys.version_info.major}."
              f"{sys.version_info.minor}")
    record = session.jobs.get(job)
    assert notice in record.spec.framework_notices
    assert session.jobs.read_log(job).decode().count(notice) == 1


def test_a_framework_on_the_clients_environment_still_imports_sagemaker(session, tmp_path):
    """The installed torch is the version asked for: no environment is built, and the job's
    ``import sagemaker`` is shoal all the same (and boto3 the client's)."""
    pytest.importorskip("torch")
    pytest.importorskip("boto3")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import json, boto3, sagemaker, torch
        from sagemaker.pytorch import PyTorch
        from sagemaker.experiments.run import load_run
        print("SEEN " + json.dumps({"sagemaker": sagemaker.__name__, "torch": torch.__version__,
                                    "estimator": PyTorch.__module__}))
    """))
    installed = version("torch").split("+")[0]
    est = PyTorch(entry_point=str(script), framework_version=installed, py_version="py3")
    est.fit(logs=False)
    seen = _seen(session, est.latest_training_job.name)
    assert seen["sagemaker"] == "shoal" and seen["torch"].startswith(installed)
    assert seen["estimator"].startswith("shoal.")
    assert session.env_builder.list() == []  # the client's environment ran it
