"""Running the LLM server: read ``serving.properties`` (a bad value fails here, before the
port is bound), bind, and serve with uvicorn in this process until SIGTERM/SIGINT.

``python -m shoal.serving`` comes here for a model with ``serving.properties``; one process
serves (the engine batches, so ``--workers`` above 1 would only split the batch).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from shoal._internal.extras import LLM_SERVER_MODULES, require
from shoal.errors import ModelLoadError
from shoal.llm.serving._properties import find_properties, load_serving_options
from shoal.serving import ServerOptions
from shoal.serving.runner import Stop, StopSignals, bind, run_app, url_host, write_port_file

__all__ = ["serve"]

log = logging.getLogger(__name__)

#: GIL switch interval of the server process (Python's default: 5 ms)
_SWITCH_INTERVAL_S = 0.0005


def serve(model: str | os.PathLike[str], *, options: ServerOptions,
          port_file: str | os.PathLike[str] | None = None) -> int:
    """Serve the LLM of *model* (a directory with ``serving.properties``, or that file) until
    SIGTERM or SIGINT; 0, or 1 when the model fails to load.

    Raises ``ModelLoadError`` before listening when ``serving.properties`` is missing or has
    a bad value (naming the key and the value) or ``option.entryPoint`` names a missing file
    or one without a handler, ``ServingError`` when the port is taken.
    """
    from shoal.config import djl_environ

    properties = find_properties(model)
    if properties is None:
        raise ModelLoadError(f"{model} holds no serving.properties", path=os.fspath(model))
    llm = load_serving_options(properties, djl_environ())
    # A missing extra fails here, before the port is bound, naming it.
    require("llm", "the LLM server", *LLM_SERVER_MODULES)
    if llm.entry_point:
        from shoal.llm.serving._custom import check_entry_point

        check_entry_point(llm)  # a missing or handler-less file fails before the port is bound
    else:
        require("llm", "the LLM server's engine", "torch", "transformers")
    if options.workers is not None and options.workers > 1:
        log.warning("an LLM is served by one process (its engine batches requests); ignoring "
                    "workers=%d", options.workers)
    sock = bind(options.host, options.port)
    port = sock.getsockname()[1]
    if port_file is not None:
        write_port_file(port_file, port)
    sys.stdout.write(f"shoal LLM server listening on http://{url_host(options.host)}:{port} "
                     f"(serving.properties {properties})\n")
    for note in llm.notes:  # which engine serves it; keys kept with no effect; unknown keys
        sys.stdout.write(f"  {note}\n")
    sys.stdout.flush()
    with StopSignals():
        try:
            return _run(sock, llm, options)
        except Stop:
            return 0
        finally:
            sock.close()


def _run(sock: Any, llm: Any, options: ServerOptions) -> int:
    def make_app(failed: Callable[[BaseException], None]) -> Any:
        if llm.entry_point:
            from shoal.llm.serving._custom import entry_point_app

            return entry_point_app(llm, options, failed)
        from shoal.llm.serving._app import LlmServerApp

        return LlmServerApp(llm, options, on_load_error=failed)

    # The engine's thread and the event loop share the GIL; with Python's default 5 ms switch
    # interval a request arriving while the engine computes waits up to 5 ms per hand-over
    # (the time to first token of a burst of requests is several of them).
    sys.setswitchinterval(_SWITCH_INTERVAL_S)
    return run_app(make_app, sock, options)
