"""Endpoints: deploy and manage models as endpoints (``Model``, ``Predictor``,
``EndpointService``), served by supervised model-server processes or Ray Serve replicas.

``Model.deploy()`` stores an endpoint record and starts its supervisor (``_supervisor.py``),
which runs the model server (``python -m shoal.serving``) on 127.0.0.1, restarts instances
that die and keeps the record current; ``Predictor`` sends requests to the instances in
service. The model server runtime itself lives in ``shoal.serving`` (the LLM server in
``shoal.llm.serving``) and knows nothing of sessions; ``shoal.model`` and ``shoal.predictor``
are only SageMaker's paths to these classes.
"""

from shoal.endpoints._predictor import Predictor
from shoal.endpoints._service import EndpointService
from shoal.endpoints.model import Model

__all__ = ["EndpointService", "Model", "Predictor"]
