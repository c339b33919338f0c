"""One model server on a chosen HTTP front end, for bench/serving_frontends.py:

    python bench/_frontend_server.py FRONTEND MODEL_DIR PORT WORKERS

FRONTEND: ``shoal`` (``python -m shoal.serving`` as it ships: uvicorn, its guarded httptools
protocol, uvloop when installed), ``uvicorn-asyncio`` (the same on the stdlib loop: what runs
where uvloop is not installed), ``uvicorn-h11`` (uvicorn's pure-Python HTTP protocol on the
stdlib loop, in place of shoal's guarded protocol, so without its TCP_NODELAY either),
``granian-asgi`` (granian's Rust HTTP server driving shoal's ASGI app, on uvloop).
The app is shoal's own (``shoal.serving._app.create_app``) in every case.
"""

from __future__ import annotations

import os
import sys

FRONTEND = os.environ.get("SHOAL_BENCH_FRONTEND", "shoal")

if FRONTEND in ("uvicorn-asyncio", "uvicorn-h11"):
    # top level, so that spawned worker processes (which import this file as __mp_main__)
    # get the same settings
    import shoal.serving.runner as _runner

    _config = _runner.uvicorn_config

    def _patched(app, options):  # type: ignore[no-untyped-def]
        cfg = _config(app, options)
        cfg.loop = "asyncio"
        if FRONTEND == "uvicorn-h11":
            cfg.http = "h11"
        return cfg

    _runner.uvicorn_config = _patched  # type: ignore[assignment]


def granian_app():  # type: ignore[no-untyped-def]
    """The granian target (a factory): shoal's app for the model the environment names."""
    from shoal.serving._app import create_app
    from shoal.serving._options import ServerOptions

    options = ServerOptions(workers=int(os.environ["SHOAL_BENCH_WORKERS"]))
    return create_app(os.environ["SHOAL_BENCH_MODEL"], options=options)


def main() -> None:
    frontend, model_dir, port, workers = sys.argv[1:5]
    if frontend != FRONTEND:
        raise SystemExit("set SHOAL_BENCH_FRONTEND to the front end (the workers read it)")
    if frontend.startswith("granian"):
        from granian import Granian
        from granian.constants import Interfaces, Loops

        os.environ.update(SHOAL_BENCH_MODEL=model_dir, SHOAL_BENCH_WORKERS=workers)
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        Granian("_frontend_server:granian_app", address="127.0.0.1", port=int(port),
                interface=Interfaces.ASGI, workers=int(workers), loop=Loops.uvloop,
                factory=True, log_enabled=False, backlog=2048).serve()
        return
    from shoal.serving.__main__ import main as serve_main

    sys.exit(serve_main(["--model", model_dir, "--port", port, "--workers", workers,
                         "--log-level", "WARNING"]))


if __name__ == "__main__":
    main()
