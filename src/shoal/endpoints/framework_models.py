"""Framework models under SageMaker's names: ``SKLearnModel``, ``PyTorchModel`` and their
predictors. They are ``Model``s whose extra arguments mean what they mean on SageMaker:
``model_server_workers`` sets the model server's worker processes; ``framework_version`` and
``py_version`` are recorded (the server is chosen from the artifact: ``model.joblib``,
``model.pt``, ``model.onnx`` or ``code/inference.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from shoal.deserializers import NumpyDeserializer
from shoal.endpoints._predictor import Predictor
from shoal.endpoints.model import Model
from shoal.errors import InvalidArgumentError
from shoal.serializers import NumpySerializer

if TYPE_CHECKING:
    from shoal.session import Session

__all__ = ["FrameworkModel", "PyTorchModel", "PyTorchPredictor", "SKLearnModel",
           "SKLearnPredictor"]


class SKLearnPredictor(Predictor):
    """A ``Predictor`` that sends and receives ``.npy`` (SageMaker's defaults for scikit-learn)."""

    def __init__(self, endpoint_name: str, sagemaker_session: Session | None = None,
                 serializer: Any = None, deserializer: Any = None, **kwargs: Any) -> None:
        super().__init__(endpoint_name, sagemaker_session=sagemaker_session,
                         serializer=serializer or NumpySerializer(),
                         deserializer=deserializer or NumpyDeserializer(), **kwargs)


class PyTorchPredictor(SKLearnPredictor):
    """A ``Predictor`` that sends and receives ``.npy`` (SageMaker's defaults for PyTorch)."""


def _passed(args: dict[str, Any]) -> dict[str, Any]:
    """A subclass's ``locals()`` as keyword arguments for its base's ``__init__``."""
    return {k: v for k, v in args.items() if k not in ("self", "__class__")}


class FrameworkModel(Model):
    """A ``Model`` with a framework's version and a model-server worker count.

    SageMaker's ``FrameworkModel`` parameters in its order, then, keyword-only, the ``Model``
    ones it passes on and shoal's ``framework_version``, ``py_version``,
    ``model_server_workers`` (which SageMaker's framework models declare)."""

    def __init__(
            self, model_data: Any = None, image_uri: str | None = None,
            role: str | None = None, entry_point: str | None = None,
            source_dir: str | None = None, predictor_cls: Any = None,
            env: Mapping[str, str] | None = None, name: str | None = None,
            container_log_level: int = logging.INFO, code_location: str | None = None,
            sagemaker_session: Session | None = None, dependencies: Any = None,
            git_config: Mapping[str, str] | None = None, *,
            vpc_config: Mapping[str, Any] | None = None,
            enable_network_isolation: bool | None = None, model_kms_key: str | None = None,
            image_config: Mapping[str, Any] | None = None, resources: Any = None,
            additional_model_data_sources: Any = None, model_reference_arn: str | None = None,
            framework_version: str | None = None, py_version: str | None = None,
            model_server_workers: int | None = None) -> None:
        args = _passed(locals())
        env = dict(env or {})
        if model_server_workers is not None:
            if isinstance(model_server_workers, bool) or not isinstance(
                    model_server_workers, int) or model_server_workers < 1:
                raise InvalidArgumentError(f"model_server_workers must be a positive integer, "
                                           f"got {model_server_workers!r}",
                                           argument="model_server_workers")
            env.setdefault("SHOAL_MODEL_SERVER_WORKERS", str(model_server_workers))
        for own in ("framework_version", "py_version", "model_server_workers"):
            del args[own]
        Model.__init__(self, **{**args, "env": env})
        self.framework_version = framework_version
        self.py_version = py_version
        self.model_server_workers = model_server_workers


class SKLearnModel(FrameworkModel):
    """``sagemaker.sklearn.SKLearnModel``: a scikit-learn model (``model.joblib``, or your
    ``model_fn`` in *entry_point*) served by shoal's model server. SageMaker's parameters in
    its order; keyword-only, those it passes on to ``FrameworkModel`` and ``Model``."""

    def __init__(
            self, model_data: Any = None, role: str | None = None,
            entry_point: str | None = None, framework_version: str | None = None,
            py_version: str | None = "py3", image_uri: str | None = None,
            predictor_cls: Any = SKLearnPredictor, model_server_workers: int | None = None, *,
            source_dir: str | None = None, env: Mapping[str, str] | None = None,
            name: str | None = None, container_log_level: int = logging.INFO,
            code_location: str | None = None, sagemaker_session: Session | None = None,
            dependencies: Any = None, git_config: Mapping[str, str] | None = None,
            vpc_config: Mapping[str, Any] | None = None,
            enable_network_isolation: bool | None = None, model_kms_key: str | None = None,
            image_config: Mapping[str, Any] | None = None, resources: Any = None,
            additional_model_data_sources: Any = None,
            model_reference_arn: str | None = None) -> None:
        FrameworkModel.__init__(self, **_passed(locals()))


class PyTorchModel(FrameworkModel):
    """``sagemaker.pytorch.PyTorchModel``: a TorchScript ``model.pt`` or your ``model_fn`` in
    *entry_point*, served by shoal's model server. SageMaker's parameters in its order;
    keyword-only, those it passes on to ``FrameworkModel`` and ``Model``."""

    def __init__(
            self, model_data: Any = None, role: str | None = None,
            entry_point: str | None = None, framework_version: str | None = None,
            py_version: str | None = None, image_uri: str | None = None,
            predictor_cls: Any = PyTorchPredictor, model_server_workers: int | None = None, *,
            source_dir: str | None = None, env: Mapping[str, str] | None = None,
            name: str | None = None, container_log_level: int = logging.INFO,
            code_location: str | None = None, sagemaker_session: Session | None = None,
            dependencies: Any = None, git_config: Mapping[str, str] | None = None,
            vpc_config: Mapping[str, Any] | None = None,
            enable_network_isolation: bool | None = None, model_kms_key: str | None = None,
            image_config: Mapping[str, Any] | None = None, resources: Any = None,
            additional_model_data_sources: Any = None,
            model_reference_arn: str | None = None) -> None:
        FrameworkModel.__init__(self, **_passed(locals()))
