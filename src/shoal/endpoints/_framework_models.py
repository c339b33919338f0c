"""Framework models under SageMaker's names: ``SKLearnModel``, ``PyTorchModel`` and their
predictors. They are ``Model``s whose extra arguments mean what they mean on SageMaker:
``model_server_workers`` sets the model server's worker processes; ``framework_version`` and
``py_version`` are recorded (the server is chosen from the artifact: ``model.joblib``,
``model.pt``, ``model.onnx`` or ``code/inference.py``).
"""

from __future__ import annotations

from typing import Any

from shoal.deserializers import NumpyDeserializer
from shoal.endpoints._model import Model
from shoal.endpoints._predictor import Predictor
from shoal.errors import InvalidArgumentError
from shoal.serializers import NumpySerializer

__all__ = ["FrameworkModel", "PyTorchModel", "PyTorchPredictor", "SKLearnModel",
           "SKLearnPredictor"]


class SKLearnPredictor(Predictor):
    """A ``Predictor`` that sends and receives ``.npy`` (SageMaker's defaults for scikit-learn)."""

    def __init__(self, endpoint_name: str, sagemaker_session: Any = None,
                 serializer: Any = None, deserializer: Any = None, **kwargs: Any) -> None:
        super().__init__(endpoint_name, sagemaker_session=sagemaker_session,
                         serializer=serializer or NumpySerializer(),
                         deserializer=deserializer or NumpyDeserializer(), **kwargs)


class PyTorchPredictor(SKLearnPredictor):
    """A ``Predictor`` that sends and receives ``.npy`` (SageMaker's defaults for PyTorch)."""


class FrameworkModel(Model):
    """A ``Model`` with a framework's version and a model-server worker count."""

    def __init__(self, model_data: Any = None, role: str | None = None,
                 entry_point: str | None = None, framework_version: str | None = None,
                 py_version: str | None = None, image_uri: str | None = None,
                 predictor_cls: Any = None, model_server_workers: int | None = None,
                 **kwargs: Any) -> None:
        env = dict(kwargs.pop("env", None) or {})
        if model_server_workers is not None:
            if isinstance(model_server_workers, bool) or not isinstance(
                    model_server_workers, int) or model_server_workers < 1:
                raise InvalidArgumentError(f"model_server_workers must be a positive integer, "
                                           f"got {model_server_workers!r}",
                                           argument="model_server_workers")
            env.setdefault("SHOAL_MODEL_SERVER_WORKERS", str(model_server_workers))
        super().__init__(model_data=model_data, image_uri=image_uri, role=role,
                         entry_point=entry_point, env=env, predictor_cls=predictor_cls,
                         **kwargs)
        self.framework_version = framework_version
        self.py_version = py_version
        self.model_server_workers = model_server_workers


class SKLearnModel(FrameworkModel):
    """``sagemaker.sklearn.SKLearnModel``: a scikit-learn model (``model.joblib``, or your
    ``model_fn`` in *entry_point*) served by shoal's model server."""

    def __init__(self, model_data: Any, role: str | None = None,
                 entry_point: str | None = None, framework_version: str | None = None,
                 py_version: str = "py3", image_uri: str | None = None,
                 predictor_cls: Any = SKLearnPredictor, model_server_workers: int | None = None,
                 **kwargs: Any) -> None:
        super().__init__(model_data=model_data, role=role, entry_point=entry_point,
                         framework_version=framework_version, py_version=py_version,
                         image_uri=image_uri, predictor_cls=predictor_cls,
                         model_server_workers=model_server_workers, **kwargs)


class PyTorchModel(FrameworkModel):
    """``sagemaker.pytorch.PyTorchModel``: a TorchScript ``model.pt`` or your ``model_fn`` in
    *entry_point*, served by shoal's model server."""

    def __init__(self, model_data: Any, role: str | None = None,
                 entry_point: str | None = None, framework_version: str | None = None,
                 py_version: str | None = None, image_uri: str | None = None,
                 predictor_cls: Any = PyTorchPredictor, model_server_workers: int | None = None,
                 **kwargs: Any) -> None:
        super().__init__(model_data=model_data, role=role, entry_point=entry_point,
                         framework_version=framework_version, py_version=py_version,
                         image_uri=image_uri, predictor_cls=predictor_cls,
                         model_server_workers=model_server_workers, **kwargs)
