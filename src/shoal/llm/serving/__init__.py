"""The LLM server runtime: DJL's ``serving.properties``, a transformers engine with continuous
batching (vLLM when asked), and the LMI (``/invocations``), TGI (``/generate``,
``/generate_stream``) and OpenAI (``/v1/completions``, ``/v1/chat/completions``,
``/v1/models``) APIs, beside ``/ping`` and ``/metrics``.

``python -m shoal.serving --model DIR`` (and ``shoal serve DIR``, ``Model(...).deploy()``)
comes here when ``DIR`` holds ``serving.properties``. In Python::

    from shoal.llm.serving import serve
    serve("model/", options=ServerOptions(port=8080))     # blocks until SIGTERM

Importing this package loads neither torch nor transformers; the model loads when a server
starts. Like the model server (``shoal.serving``, whose pieces it uses) it imports no session,
job or store; ``Model.deploy()`` (``shoal.endpoints``) runs it as an endpoint.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shoal._internal.lazy import lazy_exports

if TYPE_CHECKING:
    from shoal.llm.serving._app import LlmServerApp
    from shoal.llm.serving._custom import check_entry_point, entry_point_app
    from shoal.llm.serving._params import GenerationParams
    from shoal.llm.serving._properties import (
        LlmServingOptions,
        find_properties,
        load_serving_options,
    )
    from shoal.llm.serving._run import serve

__all__ = ["GenerationParams", "LlmServerApp", "LlmServingOptions", "check_entry_point",
           "entry_point_app", "find_properties", "load_serving_options", "serve"]

_LAZY = {
    "LlmServerApp": "shoal.llm.serving._app",
    "GenerationParams": "shoal.llm.serving._params",
    "LlmServingOptions": "shoal.llm.serving._properties",
    "load_serving_options": "shoal.llm.serving._properties",
    "find_properties": "shoal.llm.serving._properties",
    "check_entry_point": "shoal.llm.serving._custom",
    "entry_point_app": "shoal.llm.serving._custom",
    "serve": "shoal.llm.serving._run",
}


__getattr__, __dir__ = lazy_exports("shoal.llm.serving", _LAZY, globals(), __all__)
