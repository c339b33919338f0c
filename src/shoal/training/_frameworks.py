"""The framework estimators: ``Framework``, ``PyTorch``, ``SKLearn``.

Each pins its framework in the job's environment (``framework_version``) and takes SageMaker
v2's parameters in SageMaker's order: its own, then, keyword-only, those SageMaker passes on
through ``**kwargs`` to ``Framework`` and ``EstimatorBase``, then shoal's own.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from shoal.core.inert import given
from shoal.errors import InvalidArgumentError
from shoal.training._estimator import _INERT, Estimator, _passed
from shoal.training._framework_env import (
    check_py_version,
    framework_requirements,
    installed_version,
    requirement_bounds,
)
from shoal.training.models import FrameworkModelMaker

if TYPE_CHECKING:
    from shoal.session import Session

__all__ = ["Framework", "PyTorch", "SKLearn"]


class Framework(Estimator):
    """An estimator whose job environment resolves as SageMaker's container for
    ``framework_version`` would, on the client's Python (``training/_framework_env.py``).

    Its parameters are SageMaker's ``Framework``'s in its order, then, keyword-only, those that
    SageMaker passes on to ``EstimatorBase`` (``role``, ``instance_count``...), then shoal's.
    """

    _dist = ""
    _framework_name = ""

    def __init__(
            self, entry_point: str | None = None, source_dir: str | None = None,
            hyperparameters: Mapping[str, Any] | None = None,
            container_log_level: int = logging.INFO, code_location: str | None = None,
            image_uri: str | None = None, dependencies: Any = None,
            enable_network_isolation: bool | None = None,
            git_config: Mapping[str, str] | None = None, checkpoint_s3_uri: str | None = None,
            checkpoint_local_path: str | None = None,
            enable_sagemaker_metrics: bool | None = None, *,
            role: str | None = None, instance_count: int | None = 1,
            instance_type: str | None = None, keep_alive_period_in_seconds: float | None = None,
            volume_size: int = 30, volume_kms_key: str | None = None,
            max_run: int = 24 * 60 * 60, input_mode: str = "File",
            output_path: str | None = None, output_kms_key: str | None = None,
            base_job_name: str | None = None, sagemaker_session: Session | None = None, tags: Any = None,
            subnets: list[str] | None = None, security_group_ids: list[str] | None = None,
            model_uri: str | None = None, model_channel_name: str = "model",
            metric_definitions: list[Mapping[str, str]] | None = None,
            encrypt_inter_container_traffic: bool | None = None,
            use_spot_instances: bool = False, max_wait: int | None = None, rules: Any = None,
            debugger_hook_config: Any = None, tensorboard_output_config: Any = None,
            profiler_config: Any = None, disable_profiler: bool = False,
            environment: Mapping[str, str] | None = None,
            max_retry_attempts: int | None = None, instance_groups: Any = None,
            training_repository_access_mode: str | None = None,
            training_repository_credentials_provider_arn: str | None = None,
            enable_infra_check: bool | None = None,
            container_entry_point: list[str] | None = None,
            container_arguments: list[str] | None = None,
            disable_output_compression: bool = False, enable_remote_debug: bool | None = None,
            enable_session_tag_chaining: bool | None = None, training_plan: str | None = None,
            instance_placement_config: Any = None,
            framework_version: str | None = None, py_version: str | None = None,
            distribution: Mapping[str, Any] | None = None, allow_cpu_fallback: bool = False,
            strict_versions: bool | None = None) -> None:
        args = _passed(locals(), "framework_version", "py_version", "strict_versions")
        installed = installed_version(self._dist)
        version = framework_version or (installed.split("+")[0] if installed else None)
        if version is None:
            raise InvalidArgumentError(
                f"{type(self).__name__} needs framework_version= ({self._dist} is not installed "
                "here to default to)", argument="framework_version")
        self.framework_version: str = version
        Estimator.__init__(self, **args)
        settings = self.sagemaker_session.settings
        self.strict_versions = bool(getattr(settings, "strict_versions", False)
                                    if strict_versions is None else strict_versions)
        py_note = check_py_version(py_version, framework=self._framework_name,
                                   version=self.framework_version, strict=self.strict_versions)
        self._py_notice: tuple[str, ...] = (py_note,) if py_note else ()
        self._framework_notices: tuple[str, ...] = self._py_notice
        self.py_version = py_version or f"py{sys.version_info.major}{sys.version_info.minor}"
        _, release, _ = requirement_bounds(self._framework_name, self._dist,
                                           self.framework_version)
        self._framework = (self._dist, release)

    def _framework_requirements(self, user: str | None) -> tuple[list[str], bool]:
        lines, build, notices = framework_requirements(
            self._framework_name, self._dist, self.framework_version, user,
            strict=self.strict_versions,
            cache_dir=self.sagemaker_session.settings.home / "envs" / "framework-releases")
        self._framework_notices = (*self._py_notice, *notices)
        return lines, build


# create_model(): SageMaker's framework estimators take other positional arguments than
# its Estimator, so the two bases' signatures differ (as in sagemaker.pytorch).
class PyTorch(FrameworkModelMaker, Framework):  # type: ignore[misc]
    """``sagemaker.pytorch.PyTorch``: the job's environment has ``torch==framework_version``;
    ``create_model()`` returns a ``PyTorchModel``.

    ``compiler_config`` (Training Compiler), ``training_recipe`` and ``recipe_overrides``
    (HyperPod recipes) are kept on the job record and reported once: the script runs as given.
    """

    _dist = "torch"
    _framework_name = "pytorch"

    def _model_class(self) -> type[Any]:
        from shoal.endpoints.framework_models import PyTorchModel

        return PyTorchModel

    def __init__(
            self, entry_point: str | None = None, framework_version: str | None = None,
            py_version: str | None = None, source_dir: str | None = None,
            hyperparameters: Mapping[str, Any] | None = None, image_uri: str | None = None,
            distribution: Mapping[str, Any] | None = None, compiler_config: Any = None,
            training_recipe: str | None = None, recipe_overrides: Mapping[str, Any] | None = None,
            *,
            container_log_level: int = logging.INFO, code_location: str | None = None,
            dependencies: Any = None, enable_network_isolation: bool | None = None,
            git_config: Mapping[str, str] | None = None, checkpoint_s3_uri: str | None = None,
            checkpoint_local_path: str | None = None,
            enable_sagemaker_metrics: bool | None = None,
            role: str | None = None, instance_count: int | None = 1,
            instance_type: str | None = None, keep_alive_period_in_seconds: float | None = None,
            volume_size: int = 30, volume_kms_key: str | None = None,
            max_run: int = 24 * 60 * 60, input_mode: str = "File",
            output_path: str | None = None, output_kms_key: str | None = None,
            base_job_name: str | None = None, sagemaker_session: Session | None = None, tags: Any = None,
            subnets: list[str] | None = None, security_group_ids: list[str] | None = None,
            model_uri: str | None = None, model_channel_name: str = "model",
            metric_definitions: list[Mapping[str, str]] | None = None,
            encrypt_inter_container_traffic: bool | None = None,
            use_spot_instances: bool = False, max_wait: int | None = None, rules: Any = None,
            debugger_hook_config: Any = None, tensorboard_output_config: Any = None,
            profiler_config: Any = None, disable_profiler: bool = False,
            environment: Mapping[str, str] | None = None,
            max_retry_attempts: int | None = None, instance_groups: Any = None,
            training_repository_access_mode: str | None = None,
            training_repository_credentials_provider_arn: str | None = None,
            enable_infra_check: bool | None = None,
            container_entry_point: list[str] | None = None,
            container_arguments: list[str] | None = None,
            disable_output_compression: bool = False, enable_remote_debug: bool | None = None,
            enable_session_tag_chaining: bool | None = None, training_plan: str | None = None,
            instance_placement_config: Any = None,
            allow_cpu_fallback: bool = False, strict_versions: bool | None = None) -> None:
        args = _passed(locals(), "compiler_config", "training_recipe", "recipe_overrides")
        if training_recipe and not entry_point:
            raise InvalidArgumentError(
                "training_recipe runs SageMaker HyperPod's recipe launcher, which shoal does not "
                "provide; give the training script as entry_point=", argument="training_recipe")
        Framework.__init__(self, **args)
        self.inert.update(given({"compiler_config": compiler_config,
                                 "training_recipe": training_recipe,
                                 "recipe_overrides": recipe_overrides}, _INERT))

    def _framework_module(self) -> str:
        return "sagemaker_pytorch_container.training:main"


# create_model(): SageMaker's framework estimators take other positional arguments than
# its Estimator, so the two bases' signatures differ (as in sagemaker.pytorch).
class SKLearn(FrameworkModelMaker, Framework):  # type: ignore[misc]
    """``sagemaker.sklearn.SKLearn``; ``framework_version`` "1.2-1" pins scikit-learn 1.2.*;
    ``create_model()`` returns an ``SKLearnModel``."""

    _dist = "scikit-learn"
    _framework_name = "sklearn"

    def _model_class(self) -> type[Any]:
        from shoal.endpoints.framework_models import SKLearnModel

        return SKLearnModel

    def __init__(
            self, entry_point: str | None = None, framework_version: str | None = None,
            py_version: str | None = "py3", source_dir: str | None = None,
            hyperparameters: Mapping[str, Any] | None = None, image_uri: str | None = None,
            image_uri_region: str | None = None, *,
            container_log_level: int = logging.INFO, code_location: str | None = None,
            dependencies: Any = None, enable_network_isolation: bool | None = None,
            git_config: Mapping[str, str] | None = None, checkpoint_s3_uri: str | None = None,
            checkpoint_local_path: str | None = None,
            enable_sagemaker_metrics: bool | None = None,
            role: str | None = None, instance_count: int | None = 1,
            instance_type: str | None = None, keep_alive_period_in_seconds: float | None = None,
            volume_size: int = 30, volume_kms_key: str | None = None,
            max_run: int = 24 * 60 * 60, input_mode: str = "File",
            output_path: str | None = None, output_kms_key: str | None = None,
            base_job_name: str | None = None, sagemaker_session: Session | None = None, tags: Any = None,
            subnets: list[str] | None = None, security_group_ids: list[str] | None = None,
            model_uri: str | None = None, model_channel_name: str = "model",
            metric_definitions: list[Mapping[str, str]] | None = None,
            encrypt_inter_container_traffic: bool | None = None,
            use_spot_instances: bool = False, max_wait: int | None = None, rules: Any = None,
            debugger_hook_config: Any = None, tensorboard_output_config: Any = None,
            profiler_config: Any = None, disable_profiler: bool = False,
            environment: Mapping[str, str] | None = None,
            max_retry_attempts: int | None = None, instance_groups: Any = None,
            training_repository_access_mode: str | None = None,
            training_repository_credentials_provider_arn: str | None = None,
            enable_infra_check: bool | None = None,
            container_entry_point: list[str] | None = None,
            container_arguments: list[str] | None = None,
            disable_output_compression: bool = False, enable_remote_debug: bool | None = None,
            enable_session_tag_chaining: bool | None = None, training_plan: str | None = None,
            instance_placement_config: Any = None,
            allow_cpu_fallback: bool = False, strict_versions: bool | None = None) -> None:
        if instance_count not in (1, None):
            raise InvalidArgumentError("SKLearn trains on one instance (as on SageMaker); use "
                                       "instance_count=1", argument="instance_count")
        Framework.__init__(self, **_passed(locals(), "image_uri_region"))
        self.inert.update(given({"image_uri_region": image_uri_region}, _INERT))

    def _framework_module(self) -> str:
        return "sagemaker_sklearn_container.training:main"
