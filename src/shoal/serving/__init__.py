"""The model server runtime (one process, one model directory): SageMaker's serving contract (``/ping``, ``/invocations``, ``/metrics``,
``/execution-parameters``) over an ASGI app run by uvicorn, with ``code/inference.py``
handlers or ones chosen from the artifact (ONNX, scikit-learn, TorchScript), and adaptive
batching.

Run one with ``python -m shoal.serving --model PATH_OR_URI``, or in Python::

    from shoal.serving import ServerOptions, serve
    serve("model.tar.gz", options=ServerOptions(port=8080))   # blocks until SIGTERM

``create_app`` gives the ASGI app alone. Importing this package loads neither uvicorn nor
onnxruntime; those load when a server starts.

It imports no session, job, store or backend: it often runs in a model's own environment.
Deploying and managing servers is ``shoal.endpoints``; a directory holding
``serving.properties`` is handed to the LLM server runtime, ``shoal.llm.serving``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shoal._internal.lazy import lazy_exports
from shoal.serving._options import ServerOptions

if TYPE_CHECKING:
    from shoal.serving._app import ModelServerApp, create_app
    from shoal.serving._run import serve
    from shoal.serving.script import InferenceContext

__all__ = ["InferenceContext", "ModelServerApp", "ServerOptions", "create_app", "serve"]

_LAZY = {
    "create_app": "shoal.serving._app",
    "ModelServerApp": "shoal.serving._app",
    "serve": "shoal.serving._run",
    "InferenceContext": "shoal.serving.script",
}


__getattr__, __dir__ = lazy_exports("shoal.serving", _LAZY, globals(), __all__)
