"""Endpoints: deploy a model as supervised server processes and call them.

``Model.deploy()`` stores an endpoint record and starts its supervisor (``_supervisor.py``),
which runs the model server (``python -m shoal.serving``) on 127.0.0.1, restarts instances
that die and keeps the record current; ``Predictor`` sends requests to the instances in
service. The model server itself lives in ``shoal.serving`` and knows nothing of sessions.
"""

from shoal.endpoints._model import Model
from shoal.endpoints._predictor import Predictor
from shoal.endpoints._service import EndpointService

__all__ = ["EndpointService", "Model", "Predictor"]
