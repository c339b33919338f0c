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
    from shoal.serving.flags import add_to_parser

    p = argparse.ArgumentParser(
        prog="python -m shoal.serving",
        description="Serve a model over SageMaker's /ping + /invocations contract.")
    p.add_argument("--model", required=True, metavar="PATH_OR_URI",
                   help="model directory, model.tar.gz, or an fsspec URL of either")
    add_to_parser(p)  # the same flags as 'shoal serve' (serving/flags.py)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from shoal._internal import logconfig
    from shoal.config import shoal_environ
    from shoal.serving._options import API_KEY_VAR, ServerOptions
    from shoal.serving.flags import option_values

    logconfig.configure(getattr(logging, args.log_level))
    environ = shoal_environ()
    try:
        api_key = args.api_key
        if api_key is None and API_KEY_VAR in environ:
            api_key = environ[API_KEY_VAR]
            if not api_key.strip():
                raise ConfigError(f"{API_KEY_VAR} is blank; set it to the key, or unset it "
                                  f"to serve without one")
        options = ServerOptions.from_env(environ, **{**option_values(vars(args)),
                                                     "api_key": api_key})
    except ConfigError as e:
        sys.stderr.write(f"python -m shoal.serving: {e}\n")
        return 2
    from shoal.serving._run import serve

    try:
        return serve(args.model, options=options, port_file=args.port_file,
                     shared=args.reuse_port)
    except ShoalError as e:
        sys.stderr.write(f"python -m shoal.serving: {e}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
