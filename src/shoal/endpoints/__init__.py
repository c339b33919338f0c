"""Endpoints: deploy and manage models as endpoints (``Model``, ``Predictor``,
``EndpointService``), served by supervised model-server processes or Ray Serve replicas.

``Model.deploy()`` stores an endpoint record and starts its supervisor (``_supervisor.py``),
which runs the model server (``python -m shoal.serving``) on 127.0.0.1, restarts instances
that die and keeps the record current; ``Predictor`` sends requests to the instances in
service. The model server runtime itself lives in ``shoal.serving`` (the LLM server in
``shoal.llm.serving``) and knows nothing of sessions; ``shoal.model`` and ``shoal.predictor``
are only SageMaker's paths to these classes.
"""

from typing import Any

from shoal.endpoints._predictor import Predictor
from shoal.endpoints._service import EndpointService
from shoal.endpoints.model import Model

__all__ = ["EndpointService", "Model", "Predictor", "RayServeEndpoints", "SupervisedEndpoints"]

#: The two ``EndpointBackend`` implementations, which ``Session.endpoint_backends`` loads by
#: these names (the session layer sits below this package); loaded on first use.
_BACKENDS = {"SupervisedEndpoints": "shoal.endpoints._supervisor",
             "RayServeEndpoints": "shoal.endpoints._ray_serve"}


def __getattr__(name: str) -> Any:
    if name in _BACKENDS:
        import importlib

        return getattr(importlib.import_module(_BACKENDS[name]), name)
    raise AttributeError(f"module 'shoal.endpoints' has no attribute {name!r}")
