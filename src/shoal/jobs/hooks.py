"""The running job's end hooks, for code inside a job that must act when its function ends.

``JOB_END_HOOKS`` (``jobs/_entrypoint.py``) are called once when the job's function has
returned or raised, before its outcome is reported: a forked job leaves with ``os._exit``, so
atexit handlers never run there. Experiment runs flush their metrics and checkpoint locations
upload from here. Standard library only: this is imported inside jobs and on the client's
hot path.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

__all__ = ["job_end_hooks"]


def job_end_hooks() -> list[Callable[[], None]] | None:
    """The running job's hook list to append to, or ``None`` outside a job's entry point."""
    # A job started as 'python -m shoal.jobs._entrypoint' runs it as __main__; it is looked up,
    # never imported, so a second copy of the entry point (with its own list) is never made.
    for name in ("__main__", "shoal.jobs._entrypoint"):
        hooks = getattr(sys.modules.get(name), "JOB_END_HOOKS", None)
        if isinstance(hooks, list):
            return hooks
    return None
