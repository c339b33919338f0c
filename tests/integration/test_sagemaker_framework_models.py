"""Issue #22: ``create_model()`` of the framework estimators, as SageMaker code uses it: the
trained job's model as ``SKLearnModel`` / ``PyTorchModel``, with the training script as its
inference code (its ``model_fn``), named after the job, ready to deploy."""

from __future__ import annotations

import textwrap
import uuid
from importlib.metadata import version

import numpy as np
import pytest

import shoal as sagemaker
from shoal.pytorch import PyTorch, PyTorchModel
from shoal.sklearn import SKLearn, SKLearnModel, SKLearnPredictor

_SKLEARN_TRAIN = """
import argparse, os

import joblib
import numpy as np
from sklearn.linear_model import LinearRegression


def model_fn(model_dir):
    return joblib.load(os.path.join(model_dir, "model.joblib"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--intercept", type=float, default=0.0)
    parser.add_argument("--model-dir", default=os.environ["SM_MODEL_DIR"])
    args = parser.parse_args()
    X = np.random.default_rng(0).normal(size=(20, 2))
    y = X @ np.array([1.0, 2.0]) + args.intercept
    joblib.dump(LinearRegression().fit(X, y), os.path.join(args.model_dir, "model.joblib"))
"""


def test_sklearn_create_model_serves_the_training_scripts_model_fn(session, tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    (source / "train.py").write_text(textwrap.dedent(_SKLEARN_TRAIN))
    sklearn_estimator = SKLearn(entry_point="train.py", source_dir=str(source),
                                framework_version=version("scikit-learn"),
                                instance_type="ml.m5.large",
                                role=sagemaker.get_execution_role(),
                                hyperparameters={"intercept": 3.0})
    sklearn_estimator.fit(logs=False)

    model = sklearn_estimator.create_model(model_server_workers=1)
    assert isinstance(model, SKLearnModel)
    assert model.name == sklearn_estimator.latest_training_job.name
    assert model.entry_point == "train.py" and model.source_dir == source.resolve()
    assert model.framework_version == version("scikit-learn")
    assert model.model_data == sklearn_estimator.model_data
    predictor = model.deploy(initial_instance_count=1, instance_type="ml.m5.large",
                             endpoint_name=f"sk-{uuid.uuid4().hex[:8]}")
    try:
        assert isinstance(predictor, SKLearnPredictor)
        x = np.array([[1.0, 1.0], [2.0, 0.5]])
        assert np.allclose(predictor.predict(x), x @ np.array([1.0, 2.0]) + 3.0)
    finally:
        predictor.delete_endpoint()


def test_pytorch_create_model_is_a_pytorch_model_of_the_job(session, tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text("import os, torch\n"
                      "m = torch.jit.script(torch.nn.Linear(2, 1))\n"
                      "m.save(os.path.join(os.environ['SM_MODEL_DIR'], 'model.pt'))\n")
    estimator = PyTorch(entry_point=str(script), framework_version=version("torch").split("+")[0],
                        py_version="py3", instance_type="ml.m5.large")
    estimator.fit(logs=False)
    model = estimator.create_model(role="arn:aws:iam::111122223333:role/Other",
                                   entry_point=str(script), env={"OMP_NUM_THREADS": "1"})
    assert isinstance(model, PyTorchModel)
    assert model.name == estimator.latest_training_job.name
    assert model.role == "arn:aws:iam::111122223333:role/Other"
    assert model.framework_version == estimator.framework_version
    assert model.env == {"OMP_NUM_THREADS": "1"} and model.entry_point == str(script)
