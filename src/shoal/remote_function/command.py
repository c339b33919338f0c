"""A command line as a job (``shoal jobs submit -- python train.py ...``).

``run_command`` is the job's function: it runs the command in the job's working directory
(the shipped copy of the directory it was submitted from), its output joining the job's log,
and ends the job with the command's exit code, as ``ray job submit`` does. ``python`` and
``python3`` mean the job's own interpreter (with the job's ``--dependencies`` installed).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence

from shoal.errors import InvalidArgumentError

__all__ = ["run_command"]

_PYTHONS = ("python", "python3", f"python{sys.version_info.major}.{sys.version_info.minor}")


def run_command(argv: Sequence[str]) -> int:
    """Run *argv*; return 0 when it succeeds, else end this process with its exit code (a
    command killed by signal N exits 128 + N, as in a shell)."""
    args = list(argv)
    if not args:
        raise InvalidArgumentError("the job has no command to run")
    if args[0] in _PYTHONS:
        args[0] = sys.executable
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        code = subprocess.call(args)
    except FileNotFoundError:
        raise InvalidArgumentError(f"command not found in the job: {args[0]!r} (working "
                                   f"directory {os.getcwd()})", command=args[0]) from None
    except PermissionError:
        raise InvalidArgumentError(f"cannot execute {args[0]!r} in the job (not executable)",
                                   command=args[0]) from None
    if code == 0:
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if code > 0 else 128 - code)
