"""shoal's public constructors and methods take SageMaker v2's parameters in SageMaker's order
(issue #22, item 4), so positional calls written for SageMaker mean the same here.

The table is SageMaker Python SDK v2.257's signatures (``src/sagemaker/estimator.py``,
``model.py``, ``base_predictor.py``, ``experiments/run.py``, ``remote_function/client.py``,
``pytorch/estimator.py``, ``sklearn/estimator.py``), by hand. For each: the parameters SageMaker
declares (positional-or-keyword unless marked keyword-only), then, keyword-only, the ones it
passes on through ``**kwargs`` (a framework estimator's ``role``, ``instance_count``...: they go
to ``Framework`` and ``EstimatorBase``), then shoal's own additions, also keyword-only.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest

import shoal
from shoal.estimator import Estimator, Framework
from shoal.experiments.run import Run, load_run
from shoal.model import FrameworkModel, Model
from shoal.predictor import Predictor
from shoal.pytorch import PyTorch, PyTorchModel
from shoal.remote_function import RemoteExecutor, remote
from shoal.remote_function._options import UNSET, RemoteOptions
from shoal.sklearn import SKLearn, SKLearnModel

POK = inspect.Parameter.POSITIONAL_OR_KEYWORD
KW = inspect.Parameter.KEYWORD_ONLY

# EstimatorBase.__init__'s parameters that a framework estimator passes on by **kwargs (those
# Framework.__init__ does not declare), in EstimatorBase's order.
_ESTIMATOR_BASE_REST = (
    "role", "instance_count", "instance_type", "keep_alive_period_in_seconds", "volume_size",
    "volume_kms_key", "max_run", "input_mode", "output_path", "output_kms_key",
    "base_job_name", "sagemaker_session", "tags", "subnets", "security_group_ids", "model_uri",
    "model_channel_name", "metric_definitions", "encrypt_inter_container_traffic",
    "use_spot_instances", "max_wait", "rules", "debugger_hook_config",
    "tensorboard_output_config", "profiler_config", "disable_profiler", "environment",
    "max_retry_attempts", "instance_groups", "training_repository_access_mode",
    "training_repository_credentials_provider_arn", "enable_infra_check",
    "container_entry_point", "container_arguments", "disable_output_compression",
    "enable_remote_debug", "enable_session_tag_chaining", "training_plan",
    "instance_placement_config")
# Framework.__init__'s parameters that PyTorch / SKLearn pass on by **kwargs.
_FRAMEWORK_REST = (
    "container_log_level", "code_location", "dependencies", "enable_network_isolation",
    "git_config", "checkpoint_s3_uri", "checkpoint_local_path", "enable_sagemaker_metrics")
# Model.__init__'s parameters that FrameworkModel passes on by **kwargs.
_MODEL_REST = ("vpc_config", "enable_network_isolation", "model_kms_key", "image_config",
               "resources", "additional_model_data_sources", "model_reference_arn")
# FrameworkModel.__init__'s that SKLearnModel / PyTorchModel pass on.
_FRAMEWORK_MODEL_REST = ("source_dir", "env", "name", "container_log_level", "code_location",
                         "sagemaker_session", "dependencies", "git_config")
_REMOTE = (
    "dependencies", "pre_execution_commands", "pre_execution_script", "environment_variables",
    "image_uri", "include_local_workdir", "custom_file_filter", "instance_count",
    "instance_type", "job_conda_env", "job_name_prefix", "keep_alive_period_in_seconds",
    "max_retry_attempts", "max_runtime_in_seconds", "role", "s3_kms_key", "s3_root_uri",
    "sagemaker_session", "security_group_ids", "subnets", "tags", "volume_kms_key",
    "volume_size", "encrypt_inter_container_traffic", "spark_config", "use_spot_instances",
    "max_wait_time_in_seconds", "disable_output_compression", "use_torchrun", "use_mpirun",
    "nproc_per_node")
_REMOTE_EXTRAS = ("enable_session_tag_chaining", "allow_cpu_fallback",
                  "stop_grace_period_in_seconds")


class Sig(NamedTuple):
    positional: tuple[str, ...]            # SageMaker declares them (positional-or-keyword)
    passed_on: tuple[str, ...] = ()        # SageMaker takes them through **kwargs
    shoal: tuple[str, ...] = ()            # shoal's own additions (keyword-only)
    var_keyword: bool = False              # **kwargs kept (SageMaker's Predictor has them)
    keyword_only: tuple[str, ...] = ()     # SageMaker declares them keyword-only


TABLE: dict[str, tuple[Callable[..., Any], Sig]] = {
    "Estimator.__init__": (Estimator.__init__, Sig((
        "image_uri", "role", "instance_count", "instance_type", "keep_alive_period_in_seconds",
        "volume_size", "volume_kms_key", "max_run", "input_mode", "output_path",
        "output_kms_key", "base_job_name", "sagemaker_session", "hyperparameters", "tags",
        "subnets", "security_group_ids", "model_uri", "model_channel_name",
        "metric_definitions", "encrypt_inter_container_traffic", "use_spot_instances",
        "max_wait", "checkpoint_s3_uri", "checkpoint_local_path", "enable_network_isolation",
        "rules", "debugger_hook_config", "tensorboard_output_config", "enable_sagemaker_metrics",
        "profiler_config", "disable_profiler", "environment", "max_retry_attempts",
        "source_dir", "git_config", "container_log_level", "code_location", "entry_point",
        "dependencies", "instance_groups", "training_repository_access_mode",
        "training_repository_credentials_provider_arn", "container_entry_point",
        "container_arguments", "disable_output_compression", "enable_infra_check",
        "enable_remote_debug", "enable_session_tag_chaining", "training_plan",
        "instance_placement_config"), shoal=("distribution", "allow_cpu_fallback"))),
    "Estimator.fit": (Estimator.fit, Sig(
        ("inputs", "wait", "logs", "job_name", "experiment_config"))),
    "Estimator.deploy": (Estimator.deploy, Sig((
        "initial_instance_count", "instance_type", "serializer", "deserializer",
        "accelerator_type", "endpoint_name", "use_compiled_model", "wait", "model_name",
        "kms_key", "data_capture_config", "tags", "serverless_inference_config",
        "async_inference_config", "volume_size", "model_data_download_timeout",
        "container_startup_health_check_timeout", "inference_recommendation_id",
        "explainer_config"),
        # to create_model() and on to Model()
        passed_on=("role", "image_uri", "predictor_cls", "vpc_config_override", "entry_point",
                   "source_dir", "dependencies", "env", "model_server_workers"),
        # Model.deploy's, which SageMaker's Estimator.deploy lacks; then shoal's
        shoal=("accept_eula", "endpoint_logging", "resources", "endpoint_type",
               "managed_instance_scaling", "inference_component_name", "routing_config",
               "model_reference_arn", "inference_ami_version", "batching", "port"))),
    "Estimator.create_model": (Estimator.create_model, Sig(
        ("role", "image_uri", "predictor_cls", "vpc_config_override"),
        passed_on=("entry_point", "source_dir", "dependencies", "env", "name",
                   "model_server_workers"))),
    "Estimator.attach": (Estimator.attach, Sig(
        ("training_job_name", "sagemaker_session", "model_channel_name"))),
    "Framework.__init__": (Framework.__init__, Sig((
        "entry_point", "source_dir", "hyperparameters", "container_log_level", "code_location",
        "image_uri", "dependencies", "enable_network_isolation", "git_config",
        "checkpoint_s3_uri", "checkpoint_local_path", "enable_sagemaker_metrics"),
        passed_on=_ESTIMATOR_BASE_REST,
        shoal=("framework_version", "py_version", "distribution", "allow_cpu_fallback",
               "strict_versions"))),
    "PyTorch.__init__": (PyTorch.__init__, Sig((
        "entry_point", "framework_version", "py_version", "source_dir", "hyperparameters",
        "image_uri", "distribution", "compiler_config", "training_recipe", "recipe_overrides"),
        passed_on=_FRAMEWORK_REST + _ESTIMATOR_BASE_REST,
        shoal=("allow_cpu_fallback", "strict_versions"))),
    "SKLearn.__init__": (SKLearn.__init__, Sig((
        "entry_point", "framework_version", "py_version", "source_dir", "hyperparameters",
        "image_uri", "image_uri_region"),
        passed_on=_FRAMEWORK_REST + _ESTIMATOR_BASE_REST,
        shoal=("allow_cpu_fallback", "strict_versions"))),
    "Model.__init__": (Model.__init__, Sig((
        "image_uri", "model_data", "role", "predictor_cls", "env", "name", "vpc_config",
        "sagemaker_session", "enable_network_isolation", "model_kms_key", "image_config",
        "source_dir", "code_location", "entry_point", "container_log_level", "dependencies",
        "git_config", "resources", "additional_model_data_sources", "model_reference_arn"),
        # JumpStartModel's and the framework models' (PyTorchModel, SKLearnModel)
        shoal=("inference_config_name", "framework_version", "py_version",
               "model_server_workers"))),
    "FrameworkModel.__init__": (FrameworkModel.__init__, Sig((
        "model_data", "image_uri", "role", "entry_point", "source_dir", "predictor_cls", "env",
        "name", "container_log_level", "code_location", "sagemaker_session", "dependencies",
        "git_config"), passed_on=_MODEL_REST,
        shoal=("framework_version", "py_version", "model_server_workers"))),
    "SKLearnModel.__init__": (SKLearnModel.__init__, Sig((
        "model_data", "role", "entry_point", "framework_version", "py_version", "image_uri",
        "predictor_cls", "model_server_workers"),
        passed_on=_FRAMEWORK_MODEL_REST + _MODEL_REST)),
    "PyTorchModel.__init__": (PyTorchModel.__init__, Sig((
        "model_data", "role", "entry_point", "framework_version", "py_version", "image_uri",
        "predictor_cls", "model_server_workers"),
        passed_on=_FRAMEWORK_MODEL_REST + _MODEL_REST)),
    "Model.deploy": (Model.deploy, Sig((
        "initial_instance_count", "instance_type", "serializer", "deserializer",
        "accelerator_type", "endpoint_name", "tags", "kms_key", "wait", "data_capture_config",
        "async_inference_config", "serverless_inference_config", "volume_size",
        "model_data_download_timeout", "container_startup_health_check_timeout",
        "inference_recommendation_id", "explainer_config", "accept_eula", "endpoint_logging",
        "resources", "endpoint_type", "managed_instance_scaling", "inference_component_name",
        "routing_config", "model_reference_arn", "inference_ami_version", "update_endpoint"),
        shoal=("batching", "port"))),
    "Predictor.__init__": (Predictor.__init__, Sig((
        "endpoint_name", "sagemaker_session", "serializer", "deserializer", "component_name"),
        shoal=("timeout", "connect_retry_seconds"), var_keyword=True)),
    "Predictor.predict": (Predictor.predict, Sig((
        "data", "initial_args", "target_model", "target_variant", "inference_id",
        "custom_attributes", "component_name"))),
    "Predictor.delete_endpoint": (Predictor.delete_endpoint, Sig(("delete_endpoint_config",))),
    "Run.__init__": (Run.__init__, Sig((
        "experiment_name", "run_name", "experiment_display_name", "run_display_name", "tags",
        "sagemaker_session", "artifact_bucket", "artifact_prefix"))),
    "Run.log_metric": (Run.log_metric, Sig(("name", "value", "timestamp", "step"))),
    "Run.log_parameter": (Run.log_parameter, Sig(("name", "value"))),
    "Run.log_parameters": (Run.log_parameters, Sig(("parameters",))),
    "Run.log_file": (Run.log_file, Sig(
        ("file_path", "name", "media_type", "is_output", "extra_args"))),
    "Run.log_artifact": (Run.log_artifact, Sig(("name", "value", "media_type", "is_output"))),
    "Run.log_confusion_matrix": (Run.log_confusion_matrix, Sig(
        ("y_true", "y_pred", "title", "is_output"))),
    "Run.log_roc_curve": (Run.log_roc_curve, Sig(("y_true", "y_score", "title", "is_output"))),
    "Run.log_precision_recall": (Run.log_precision_recall, Sig((
        "y_true", "predicted_probabilities", "positive_label", "title", "is_output",
        "no_skill"))),
    "load_run": (load_run, Sig((
        "run_name", "experiment_name", "sagemaker_session", "artifact_bucket",
        "artifact_prefix", "tags"))),
    "remote": (remote, Sig(("_func",), keyword_only=_REMOTE, shoal=_REMOTE_EXTRAS)),
    "RemoteExecutor.__init__": (RemoteExecutor.__init__, Sig((), keyword_only=(
        *_REMOTE[:12], "max_parallel_jobs", *_REMOTE[12:]), shoal=_REMOTE_EXTRAS)),
}


def _params(fn: Callable[..., Any]) -> list[inspect.Parameter]:
    return [p for p in inspect.signature(fn).parameters.values() if p.name not in ("self", "cls")]


@pytest.mark.parametrize("name", sorted(TABLE))
def test_signature_is_sagemakers_in_its_order(name: str) -> None:
    fn, sig = TABLE[name]
    expected = ([(n, POK) for n in sig.positional] +
                [(n, KW) for n in (*sig.keyword_only, *sig.passed_on, *sig.shoal)])
    got = [(p.name, p.kind) for p in _params(fn) if p.kind is not p.VAR_KEYWORD]
    assert got == expected, f"{name}: names and kinds differ from SageMaker v2's"
    has_var_keyword = any(p.kind is p.VAR_KEYWORD for p in _params(fn))
    assert has_var_keyword == sig.var_keyword, f"{name}: **kwargs only where SageMaker has them"


@pytest.mark.parametrize("fn", [remote, RemoteExecutor.__init__], ids=["remote", "executor"])
def test_remote_signatures_default_as_remote_options(fn: Callable[..., Any]) -> None:
    """@remote and RemoteExecutor declare the options RemoteOptions holds, with its defaults
    (UNSET: taken from the defaults config), so nothing is declared twice differently."""
    fields = {f.name: f.default for f in RemoteOptions.__dataclass_fields__.values()
              if f.name != "extra"}
    declared = {p.name: p.default for p in _params(fn)
                if p.name not in ("_func", "max_parallel_jobs")}
    assert declared == fields
    assert declared["dependencies"] is UNSET and declared["instance_count"] == 1


def test_framework_estimators_accept_every_estimator_parameter() -> None:
    """Whatever Estimator takes, PyTorch and SKLearn take too (SageMaker's **kwargs chain)."""
    est = {p.name for p in _params(Estimator.__init__)} - {"distribution"}
    for cls in (Framework, PyTorch, SKLearn):
        assert est <= {p.name for p in _params(cls.__init__)}, cls.__name__


def test_sagemaker_import_paths_are_the_same_objects() -> None:
    assert shoal.Estimator is Estimator and shoal.PyTorch is PyTorch
    assert shoal.SKLearn is SKLearn and shoal.Model is Model and shoal.Predictor is Predictor
    assert shoal.RemoteExecutor is RemoteExecutor and shoal.remote is remote
    assert shoal.Run is Run and shoal.load_run is load_run
