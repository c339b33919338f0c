"""shoal: run notebook code as tracked jobs, locally or on Ray — SageMaker's shape, offline.

Heavy names load on first use (PEP 562), so ``import shoal`` stays fast and imports none of
SQLAlchemy, fsspec, torch, ray, fastapi or uvicorn. ``import shoal as sagemaker`` works the
way SageMaker code uses its package: ``sagemaker.Session()``, ``sagemaker.get_execution_role()``
and the submodules (``sagemaker.image_uris``, ``.utils``, ``.s3``, ``.session``...), each
imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shoal._internal.lazy import lazy_exports
from shoal.errors import (
    InvalidArgumentError,
    JobCancelledError,
    JobError,
    JobFailedError,
    JobTimeoutError,
    NotFoundError,
    ShoalError,
)

if TYPE_CHECKING:
    from shoal.analytics import ExperimentAnalytics
    from shoal.deserializers import (
        BytesDeserializer,
        CSVDeserializer,
        JSONDeserializer,
        NumpyDeserializer,
        StringDeserializer,
    )
    from shoal.endpoints import Model, Predictor
    from shoal.experiments import Run, load_run
    from shoal.remote_function import RemoteExecutor, get_future, list_futures, remote
    from shoal.serializers import CSVSerializer, IdentitySerializer, JSONSerializer, NumpySerializer
    from shoal.session import Session, get_execution_role, use
    from shoal.training import Estimator, PyTorch, SKLearn, TrainingInput

__version__ = "0.1.0"

__all__ = [
    "BytesDeserializer",
    "CSVDeserializer",
    "CSVSerializer",
    "Estimator",
    "ExperimentAnalytics",
    "IdentitySerializer",
    "InvalidArgumentError",
    "JSONDeserializer",
    "JSONSerializer",
    "JobCancelledError",
    "JobError",
    "JobFailedError",
    "JobTimeoutError",
    "Model",
    "NotFoundError",
    "NumpyDeserializer",
    "NumpySerializer",
    "Predictor",
    "PyTorch",
    "RemoteExecutor",
    "Run",
    "SKLearn",
    "Session",
    "ShoalError",
    "StringDeserializer",
    "TrainingInput",
    "__version__",
    "get_execution_role",
    "get_future",
    "list_futures",
    "load_run",
    "remote",
    "use",
]

_LAZY = {
    "remote": "shoal.remote_function",
    "RemoteExecutor": "shoal.remote_function",
    "get_future": "shoal.remote_function",
    "list_futures": "shoal.remote_function",
    "Session": "shoal.session",
    "use": "shoal.session",
    "get_execution_role": "shoal.session",
    "Estimator": "shoal.training",
    "PyTorch": "shoal.training",
    "SKLearn": "shoal.training",
    "TrainingInput": "shoal.training",
    "Run": "shoal.experiments",
    "load_run": "shoal.experiments",
    "ExperimentAnalytics": "shoal.analytics",
    "Model": "shoal.endpoints",
    "Predictor": "shoal.endpoints",
    **{name: "shoal.serializers" for name in ("CSVSerializer", "IdentitySerializer",
                                              "JSONSerializer", "NumpySerializer")},
    **{name: "shoal.deserializers" for name in ("BytesDeserializer", "CSVDeserializer",
                                                "JSONDeserializer", "NumpyDeserializer",
                                                "StringDeserializer")},
}


#: SageMaker's submodules that ``import sagemaker`` makes reachable as attributes.
_SUBMODULES = ("analytics", "config", "deserializers", "djl_inference", "estimator",
               "experiments", "huggingface", "image_uris", "inputs", "model", "predictor",
               "pytorch", "remote_function", "s3", "serializers", "session", "sklearn", "utils")

__getattr__, __dir__ = lazy_exports("shoal", _LAZY, globals(), __all__, _SUBMODULES)
