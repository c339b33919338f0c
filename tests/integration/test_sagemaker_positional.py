"""SageMaker code that passes arguments by position runs as it does on SageMaker (issue #22,
item 4): ``Model(image_uri, model_data, role)``, ``estimator.deploy(1, "ml.m5.large",
serializer, deserializer)``, ``Estimator(image_uri, role, 1, "ml.m5.large", ...)``; and a
SageMaker setting with no effect here is kept on the record and reported once.

Real jobs and real endpoints: a training script in a job process, model servers on 127.0.0.1.
"""

from __future__ import annotations

import logging
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import shoal
from helpers import endpoint_test_session, linear_onnx
from shoal.core.ports import JobQuery
from shoal.deserializers import JSONDeserializer, NumpyDeserializer
from shoal.endpoints import EndpointService
from shoal.errors import InvalidArgumentError
from shoal.estimator import Estimator
from shoal.experiments.run import Run, load_run
from shoal.inputs import TrainingInput
from shoal.model import Model
from shoal.predictor import Predictor
from shoal.remote_function import remote
from shoal.serializers import CSVSerializer, NumpySerializer
from shoal.sklearn import SKLearn

W = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0], [0.5, -1.0]], dtype=np.float32)
B = np.array([0.25, -0.5], dtype=np.float32)
IMAGE = "683313688378.dkr.ecr.us-east-1.amazonaws.com/sagemaker-scikit-learn:1.2-1-cpu-py3"
ROLE = "arn:aws:iam::111122223333:role/service-role/AmazonSageMaker-ExecutionRole"

# The training script of a SageMaker example: it takes the model from the "model" channel
# (the estimator's model_uri) and saves it where SageMaker expects the trained model.
COPY_MODEL = """
import os, shutil
shutil.copy(os.path.join(os.environ["SM_CHANNEL_MODEL"], "model.onnx"),
            os.path.join(os.environ["SM_MODEL_DIR"], "model.onnx"))
print("channels", os.environ["SM_CHANNELS"])
"""


@pytest.fixture(scope="module")
def onnx_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("onnx-model")
    linear_onnx(d / "model.onnx", W, B)
    return d


@pytest.fixture
def session(tmp_path: Path) -> Iterator[shoal.Session]:
    s = shoal.Session(home=str(tmp_path / "home"), launcher_idle_seconds=60)
    with endpoint_test_session(s, local=True):
        yield s


def _reports(caplog: pytest.LogCaptureFixture, key: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "shoal.session" and r.getMessage().startswith(f"{key}=")]


def test_model_image_data_role_and_deploy_by_position(session, onnx_dir, caplog):
    model = Model(IMAGE, str(onnx_dir), ROLE)
    assert (model.image_uri, model.model_data, model.role) == (IMAGE, str(onnx_dir), ROLE)
    tags = [{"Key": "project", "Value": "positional"}]
    capture = {"EnableCapture": True, "InitialSamplingPercentage": 100,
               "DestinationS3Uri": "s3://bucket/capture"}
    with caplog.at_level(logging.WARNING, logger="shoal.session"):
        # SageMaker's positions: count, type, serializer, deserializer, accelerator_type,
        # endpoint_name, tags, kms_key, wait, data_capture_config.
        predictor = model.deploy(1, "ml.m5.large", CSVSerializer(), JSONDeserializer(), None,
                                 "positional", tags, None, True, capture)
        assert isinstance(predictor, Predictor) and predictor.endpoint_name == "positional"
        assert predictor.content_type == "text/csv"
        x = np.array([[1, 2, 3, 4]], dtype=np.float32)
        assert np.allclose(predictor.predict(x), x @ W + B)
        record = predictor.describe()
        assert record.config.instance_type == "ml.m5.large"
        assert record.config.tags == (("project", "positional"),)
        assert record.config.inert_settings == {"image_uri": IMAGE, "role": ROLE,
                                                "data_capture_config": capture}
        # The same settings on a second endpoint: kept there too, reported no more.
        again = Model(IMAGE, str(onnx_dir), ROLE).deploy(
            1, "ml.m5.large", endpoint_name="positional-2", data_capture_config=capture)
        assert again.describe().config.inert_settings["data_capture_config"] == capture
    assert len(_reports(caplog, "data_capture_config")) == 1
    assert len(_reports(caplog, "role")) == 1


def test_model_data_given_first_as_in_shoals_old_order_is_refused_clearly(session, onnx_dir):
    with pytest.raises(InvalidArgumentError,
                       match=r"first parameter is image_uri .*" + re.escape(str(onnx_dir))):
        Model(str(onnx_dir))


def test_update_endpoint_replaces_the_model_behind_the_same_name(session, onnx_dir, tmp_path):
    first = Model(model_data=str(onnx_dir)).deploy(1, "ml.m5.large", endpoint_name="swap")
    x = np.array([[1, 2, 3, 4]], dtype=np.float32)
    assert np.allclose(first.predict(x), x @ W + B)
    linear_onnx(tmp_path / "model.onnx", 2 * W, B)  # a second model that answers differently
    with pytest.raises(InvalidArgumentError, match="endpoint_name"):
        Model(model_data=str(tmp_path / "model.onnx")).deploy(update_endpoint=True)
    second = Model(model_data=str(tmp_path / "model.onnx")).deploy(
        1, "ml.m5.large", endpoint_name="swap", update_endpoint=True)
    assert np.allclose(second.predict(x), x @ (2 * W) + B)
    assert [r.name for r in EndpointService.for_session(session).list()].count("swap") == 1
    assert not second.describe().config.inert_settings  # the flag did something: not inert


def test_predictor_by_position(session, onnx_dir):
    Model(model_data=str(onnx_dir)).deploy(endpoint_name="by-position")
    predictor = Predictor("by-position", session, NumpySerializer(), NumpyDeserializer())
    assert predictor.sagemaker_session is session
    got = predictor.predict(np.zeros((2, 4), dtype=np.float32))
    assert isinstance(got, np.ndarray) and np.allclose(got, np.tile(B, (2, 1)))


def test_estimator_by_position_trains_and_deploys_by_position(session, onnx_dir, tmp_path,
                                                               caplog):
    script = tmp_path / "train.py"
    script.write_text(COPY_MODEL)
    out = tmp_path / "artifacts"
    with caplog.at_level(logging.WARNING, logger="shoal.session"):
        # image_uri, role, instance_count, instance_type, keep_alive_period_in_seconds,
        # volume_size, volume_kms_key, max_run, input_mode, output_path
        est = Estimator(IMAGE, ROLE, 1, "ml.m5.large", None, 30, None, 900, "File",
                        out.as_uri(), entry_point=str(script), model_uri=str(onnx_dir),
                        enable_session_tag_chaining=True,
                        tags=[{"Key": "team", "Value": "ml"}])
        est.fit(None, True, False)  # inputs, wait, logs
        record = session.jobs.get(est.latest_training_job.name)
        assert record.spec.max_runtime_in_seconds == 900
        assert record.spec.instance_type == "ml.m5.large"
        assert est.model_data.startswith(out.as_uri())
        assert record.spec.inert_settings == {"image_uri": IMAGE, "role": ROLE,
                                              "enable_session_tag_chaining": True}
        channels = record.spec.training.channels
        assert list(channels) == ["model"] and channels["model"]["input_mode"] == "File"
        # initial_instance_count, instance_type, serializer, deserializer
        predictor = est.deploy(1, "ml.m5.large", NumpySerializer(), NumpyDeserializer())
        x = np.array([[1, 0, 0, 0], [0, 0, 0, 1]], dtype=np.float32)
        assert np.allclose(predictor.predict(x), x @ W + B)
        endpoint = predictor.describe()
        assert endpoint.name == est.latest_training_job.name
        assert endpoint.config.tags == (("team", "ml"),)  # the estimator's, as in SageMaker
        est.fit(wait=True, logs="None")  # a second job with the same settings
    assert len(_reports(caplog, "enable_session_tag_chaining")) == 1


def test_framework_estimator_by_position_and_its_no_effect_settings(session, tmp_path,
                                                                     caplog):
    from importlib.metadata import version

    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text(textwrap.dedent("""
        import argparse, os
        p = argparse.ArgumentParser()
        p.add_argument("--n-estimators", type=int)
        args = p.parse_args()
        open(os.path.join(os.environ["SM_MODEL_DIR"], "n.txt"), "w").write(str(args.n_estimators))
    """))
    sklearn = version("scikit-learn")
    with caplog.at_level(logging.WARNING, logger="shoal.session"):
        # entry_point, framework_version, py_version, source_dir, hyperparameters, image_uri,
        # image_uri_region
        est = SKLearn("train.py", sklearn, "py3", str(src), {"n-estimators": 7}, None,
                      "us-west-2", role=ROLE, instance_type="ml.m5.large",
                      disable_output_compression=True)
        # a JumpStart-style channel: model_access_config has no effect here
        est.fit({"train": TrainingInput(str(src), model_access_config={"AcceptEula": True})},
                logs=False)
    record = session.jobs.get(est.latest_training_job.name)
    assert record.spec.training.hyperparameters == {"n-estimators": 7}
    assert record.spec.inert_settings == {"role": ROLE, "disable_output_compression": True,
                                          "image_uri_region": "us-west-2",
                                          "model_access_config": {"AcceptEula": True}}
    assert "inert" not in record.spec.training.channels["train"]
    assert len(_reports(caplog, "image_uri_region")) == 1
    assert len(_reports(caplog, "model_access_config")) == 1


def test_estimator_pipe_mode_and_a_bad_volume_size_are_refused_clearly(session, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    with pytest.raises(InvalidArgumentError, match="input_mode='Pipe' is not supported"):
        Estimator(entry_point=str(script), input_mode="Pipe")
    with pytest.raises(InvalidArgumentError, match="volume_size must be a positive integer"):
        Estimator(entry_point=str(script), volume_size=0)


def test_run_and_load_run_by_position_with_sagemakers_extras(session, tmp_path, caplog):
    data = tmp_path / "metrics.csv"
    data.write_text("epoch,loss\n1,0.5\n")
    tags = [{"Key": "owner", "Value": "ana"}]
    with caplog.at_level(logging.WARNING, logger="shoal.session"):
        # experiment_name, run_name, experiment_display_name, run_display_name, tags
        with Run("churn", "baseline", "Churn", "Baseline", tags) as run:
            run.log_parameter("lr", 0.1)
            run.log_metric("loss", 0.5, None, 1)
            # file_path, name, media_type, is_output, extra_args
            uri = run.log_file(str(data), "metrics", None, True,
                               {"ContentType": "text/csv", "ServerSideEncryption": "AES256"})
            run.log_file(str(data), "again", None, False, {"ServerSideEncryption": "AES256"})
        # run_name, experiment_name, sagemaker_session, artifact_bucket, artifact_prefix, tags
        with load_run("baseline", "churn", session, None, None, [{"Key": "stage", "Value": "2"}]):
            pass
    record = session.metadata.get_run("churn", "baseline")
    assert record.display_name == "Baseline"
    assert record.tags == {"owner": "ana", "stage": "2"}
    artifacts = {a.name: a for a in record.artifacts}
    assert artifacts["metrics"].value == uri and artifacts["metrics"].media_type == "text/csv"
    assert artifacts["again"].is_output is False
    sse = [m for m in (r.getMessage() for r in caplog.records)
           if "ServerSideEncryption" in m]
    assert len(sse) == 1 and "has no effect" in sse[0]


def test_remote_takes_sagemakers_and_chaining_settings_reporting_each_once(session, caplog):
    @remote(instance_type="ml.m5.large", disable_output_compression=True,
            enable_session_tag_chaining=True, sagemaker_session=session)
    def add(a, b):
        return a + b

    with caplog.at_level(logging.WARNING, logger="shoal.session"):
        assert add(1, 2) == 3
        assert add(2, 3) == 5
    [first, second] = session.metadata.list_jobs(JobQuery(name_prefix="add-"))
    for record in (first, second):
        assert record.spec.inert_settings == {"disable_output_compression": True,
                                              "enable_session_tag_chaining": True}
    assert len(_reports(caplog, "enable_session_tag_chaining")) == 1
