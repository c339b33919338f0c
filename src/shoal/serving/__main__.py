"""``python -m shoal.serving --model PATH_OR_URI``: run a model server.

Flags override the environment (``SHOAL_MODEL_SERVER_WORKERS``, ``SHOAL_MODEL_SERVER_TIMEOUT``,
``SHOAL_MAX_BATCH_SIZE``, ``SHOAL_MAX_BATCH_DELAY_MS``, ``SHOAL_API_KEY``, ...), which overrides
the defaults. It listens on 127.0.0.1 unless ``--host`` says otherwise.
Exit status: 0 after SIGTERM/SIGINT, 1 when the model cannot be loaded or the port cannot be
bound, 2 for malformed options.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from shoal.errors import ConfigError, ShoalError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m shoal.serving",
        description="Serve a model over SageMaker's /ping + /invocations contract.")
    p.add_argument("--model", required=True, metavar="PATH_OR_URI",
                   help="model directory, model.tar.gz, or an fsspec URL of either")
    p.add_argument("--host", help="interface to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 8080; 0 picks a free one)")
    p.add_argument("--port-file", metavar="PATH",
                   help="write the bound port here once the server listens")
    p.add_argument("--workers", type=int,
                   help="worker processes, each with its own copy of the model "
                        "(default 1; env SHOAL_MODEL_SERVER_WORKERS)")
    p.add_argument("--max-batch-size", type=int, metavar="N",
                   help="requests run together by a model that can batch (default 16; 1 turns "
                        "batching off; env SHOAL_MAX_BATCH_SIZE)")
    p.add_argument("--max-batch-delay-ms", type=float, metavar="MS",
                   help="longest wait for a batch to fill; needs --max-batch-size "
                        "(env SHOAL_MAX_BATCH_DELAY_MS)")
    p.add_argument("--max-payload-mb", type=float, metavar="MB",
                   help="largest request body (default 6)")
    p.add_argument("--timeout-s", type=float, metavar="S",
                   help="answer 504 when an invocation takes longer (default 60; env "
                        "SHOAL_MODEL_SERVER_TIMEOUT)")
    p.add_argument("--max-queue", type=int, metavar="N",
                   help="answer 503 when more requests wait for the model (default 1024)")
    p.add_argument("--read-timeout-s", type=float, metavar="S",
                   help="longest a client may take to send a whole request; slower ones get "
                        "408 and are closed (default 60; env SHOAL_MODEL_SERVER_READ_TIMEOUT)")
    p.add_argument("--max-connections", type=int, metavar="N",
                   help="open connections kept; past it a new one closes the longest-waiting "
                        "idle or half-sent one, or, when all are busy, gets 503 except for "
                        "/ping (default 4096; env SHOAL_MODEL_SERVER_MAX_CONNECTIONS)")
    p.add_argument("--api-key", metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on every request but /ping "
                        "(default: none; env SHOAL_API_KEY, which, unlike the flag, other "
                        "users cannot read from the process list)")
    p.add_argument("--log-level", default="INFO",
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from shoal._internal import logconfig
    from shoal.config import shoal_environ
    from shoal.serving._options import API_KEY_VAR, ServerOptions

    logconfig.configure(getattr(logging, args.log_level))
    environ = shoal_environ()
    try:
        api_key = args.api_key
        if api_key is None and API_KEY_VAR in environ:
            api_key = environ[API_KEY_VAR]
            if not api_key.strip():
                raise ConfigError(f"{API_KEY_VAR} is blank; set it to the key, or unset it "
                                  f"to serve without one")
        options = ServerOptions.from_env(
            environ, host=args.host, port=args.port, workers=args.workers,
            max_batch_size=args.max_batch_size, max_batch_delay_ms=args.max_batch_delay_ms,
            max_payload_mb=args.max_payload_mb, timeout_s=args.timeout_s,
            max_queue=args.max_queue, read_timeout_s=args.read_timeout_s,
            max_connections=args.max_connections, api_key=api_key)
    except ConfigError as e:
        sys.stderr.write(f"python -m shoal.serving: {e}\n")
        return 2
    from shoal.serving._run import serve

    try:
        return serve(args.model, options=options, port_file=args.port_file)
    except ShoalError as e:
        sys.stderr.write(f"python -m shoal.serving: {e}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
