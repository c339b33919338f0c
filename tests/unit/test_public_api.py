"""The public surface is frozen here; changing it is a deliberate act (httpx's habit)."""

from __future__ import annotations

import concurrent.futures
import inspect

import shoal
import shoal.remote_function as rf

EXPECTED = [
    "InvalidArgumentError", "JobCancelledError", "JobError", "JobFailedError",
    "JobTimeoutError", "NotFoundError", "RemoteExecutor", "Session", "ShoalError",
    "__version__", "get_future", "list_futures", "remote", "use",
    "Estimator", "PyTorch", "SKLearn", "TrainingInput",
    "Run", "load_run", "ExperimentAnalytics", "get_execution_role",
    "Model", "Predictor", "JSONSerializer", "CSVSerializer", "NumpySerializer",
    "IdentitySerializer", "JSONDeserializer", "CSVDeserializer", "NumpyDeserializer",
    "BytesDeserializer", "StringDeserializer",
]


def test_shoal_all_is_frozen():
    assert sorted(shoal.__all__) == sorted(EXPECTED)
    for name in shoal.__all__:
        assert getattr(shoal, name) is not None


def test_remote_is_the_decorator_not_the_subpackage():
    assert callable(shoal.remote) and inspect.isfunction(shoal.remote)
    from shoal import remote

    assert remote is shoal.remote


def test_sagemaker_import_path_mirrors_remote_function():
    assert {"CustomFileFilter", "RemoteExecutor", "get_future", "list_futures",
            "remote"} <= set(rf.__all__)
    assert issubclass(rf.RemoteExecutor, concurrent.futures.Executor)
    f = rf.CustomFileFilter(ignore_name_patterns=["*.ipynb", "data"])
    assert f.ignore_name_patterns == ("*.ipynb", "data")


def test_internals_are_not_exported():
    for name in ("Supervisor", "JobService", "SqlMetadataStore", "LocalBackend", "Settings",
                 "serialize", "deserialize"):
        assert name not in shoal.__all__
        assert not hasattr(shoal, name)


def test_remote_accepts_every_sagemaker_parameter_name():
    from shoal.remote_function import RemoteOptions

    sagemaker_names = {
        "dependencies", "pre_execution_commands", "pre_execution_script",
        "environment_variables", "image_uri", "include_local_workdir", "custom_file_filter",
        "instance_count", "instance_type", "job_conda_env", "job_name_prefix",
        "keep_alive_period_in_seconds", "max_retry_attempts", "max_runtime_in_seconds", "role",
        "s3_kms_key", "s3_root_uri", "sagemaker_session", "security_group_ids", "subnets",
        "tags", "volume_kms_key", "volume_size", "encrypt_inter_container_traffic",
        "spark_config", "use_spot_instances", "max_wait_time_in_seconds", "use_torchrun",
        "use_mpirun", "nproc_per_node", "disable_output_compression",
    }
    accepted = set(inspect.signature(RemoteOptions).parameters)
    assert sagemaker_names <= accepted


def test_sagemaker_training_import_paths():
    """A port replaces ``sagemaker`` with ``shoal`` in its import lines."""
    from shoal.estimator import Estimator
    from shoal.inputs import TrainingInput
    from shoal.pytorch import PyTorch
    from shoal.sklearn import SKLearn

    assert shoal.Estimator is Estimator and shoal.TrainingInput is TrainingInput
    assert issubclass(PyTorch, Estimator) and issubclass(SKLearn, Estimator)
    assert shoal.PyTorch is PyTorch and shoal.SKLearn is SKLearn
    params = inspect.signature(Estimator).parameters
    for name in ("entry_point", "source_dir", "hyperparameters", "instance_type",
                 "instance_count", "output_path", "environment", "dependencies",
                 "metric_definitions", "max_run", "max_retry_attempts", "checkpoint_s3_uri",
                 "checkpoint_local_path", "base_job_name", "tags",
                 "keep_alive_period_in_seconds"):
        assert name in params, name
    assert list(params)[:4] == ["image_uri", "role", "instance_count", "instance_type"]
    assert {"framework_version", "py_version"} <= set(inspect.signature(PyTorch).parameters)


def test_sagemaker_experiments_import_paths():
    from shoal.analytics import ExperimentAnalytics
    from shoal.experiments import Run, current_run_context, load_run
    from shoal.experiments.run import Run as RunAtRunPath
    from shoal.experiments.run import load_run as load_run_at_run_path

    assert Run is RunAtRunPath is shoal.Run and load_run is load_run_at_run_path is shoal.load_run
    assert shoal.ExperimentAnalytics is ExperimentAnalytics and callable(current_run_context)
    assert list(inspect.signature(Run).parameters) == [
        "experiment_name", "run_name", "experiment_display_name", "run_display_name", "tags",
        "sagemaker_session", "artifact_bucket", "artifact_prefix"]
    assert list(inspect.signature(load_run).parameters)[:3] == [
        "run_name", "experiment_name", "sagemaker_session"]
    assert list(inspect.signature(Run.log_metric).parameters) == [
        "self", "name", "value", "timestamp", "step"]  # SageMaker's order
    for method in ("log_parameter", "log_parameters", "log_metric", "log_artifact", "log_file",
                   "log_confusion_matrix", "log_precision_recall", "log_roc_curve", "close"):
        assert callable(getattr(Run, method)), method
    params = inspect.signature(ExperimentAnalytics).parameters
    assert {"experiment_name", "sort_by", "sort_order", "metric_names", "parameter_names",
            "sagemaker_session"} <= set(params)


def test_sagemaker_serving_import_paths():
    """``sagemaker.model``, ``.predictor``, ``.serializers`` and ``.deserializers`` ported."""
    from shoal.deserializers import (
        BytesDeserializer,
        CSVDeserializer,
        JSONDeserializer,
        NumpyDeserializer,
        StringDeserializer,
    )
    from shoal.model import Model
    from shoal.predictor import Predictor
    from shoal.serializers import CSVSerializer, IdentitySerializer, JSONSerializer, NumpySerializer

    assert shoal.Model is Model and shoal.Predictor is Predictor
    for cls in (CSVSerializer, IdentitySerializer, JSONSerializer, NumpySerializer):
        assert getattr(shoal, cls.__name__) is cls and isinstance(cls().CONTENT_TYPE, str)
    for cls in (BytesDeserializer, CSVDeserializer, JSONDeserializer, NumpyDeserializer,
                StringDeserializer):
        assert getattr(shoal, cls.__name__) is cls and isinstance(cls().ACCEPT, tuple)
    model_params = list(inspect.signature(Model).parameters)
    assert model_params[:3] == ["image_uri", "model_data", "role"]  # SageMaker v2's order
    assert {"entry_point", "source_dir", "dependencies", "env", "name", "sagemaker_session",
            "predictor_cls"} <= set(model_params)
    deploy = inspect.signature(Model.deploy).parameters
    assert list(deploy)[1:3] == ["initial_instance_count", "instance_type"]
    assert {"serializer", "deserializer", "endpoint_name", "wait", "batching"} <= set(deploy)
    predictor = inspect.signature(Predictor).parameters
    assert list(predictor)[:4] == ["endpoint_name", "sagemaker_session", "serializer",
                                   "deserializer"]
    assert {"data", "initial_args", "target_model"} <= set(inspect.signature(
        Predictor.predict).parameters)
    assert callable(shoal.Estimator.deploy)
