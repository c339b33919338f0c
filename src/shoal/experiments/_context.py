"""Which run is open in this process, and flushing every open run's buffered metrics when the
process or the job ends.

Standard library only: ``shoal.remote_function`` imports this on its hot path.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import logging
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shoal.experiments.run import Run

__all__ = ["current_run", "current_run_context", "enter", "exit_", "hold", "release", "track"]

logger = logging.getLogger("shoal.experiments")

_CURRENT: contextvars.ContextVar[Run | None] = contextvars.ContextVar("shoal_run", default=None)
# Runs with metrics not yet written, held strongly: a run from load_run() in a job is often
# a local variable, gone before the job ends, and its last points with it.
_PENDING: set[Run] = set()
_LOCK = threading.Lock()
_ATEXIT = False


def current_run() -> Run | None:
    """The run entered last (``with Run(...)``) in this thread or task, if any."""
    return _CURRENT.get()


def current_run_context() -> dict[str, str] | None:
    """``{"experiment_name", "run_name"}`` of the run open here, for code that submits jobs:
    the job's ``load_run()`` finds the run through it. None when no run is open."""
    run = _CURRENT.get()
    if run is None:
        return None
    return {"experiment_name": run.experiment_name, "run_name": run.run_name}


def enter(run: Run) -> contextvars.Token[Run | None]:
    return _CURRENT.set(run)


def exit_(token: contextvars.Token[Run | None]) -> None:
    # A context left from another thread or task cannot be reset; nothing is left to undo.
    with contextlib.suppress(ValueError):
        _CURRENT.reset(token)


def track() -> None:
    """Flush the runs' pending metrics when the job's function ends, inside a job (a forked
    job leaves with os._exit, so atexit never runs there), else at interpreter exit. Called
    when a run starts."""
    global _ATEXIT
    from shoal.config import job_name
    from shoal.jobs.hooks import job_end_hooks

    hooks = job_end_hooks() if job_name() else None
    if hooks is not None:
        # Not atexit as well: a warm worker runs many jobs and would pile up handlers.
        if flush_open_runs not in hooks:
            hooks.append(flush_open_runs)
        return
    with _LOCK:
        if not _ATEXIT:
            atexit.register(flush_open_runs)
            _ATEXIT = True


def hold(run: Run) -> None:
    """*run* has metrics waiting to be written."""
    with _LOCK:
        _PENDING.add(run)


def release(run: Run) -> None:
    """*run* has written all its metrics."""
    with _LOCK:
        _PENDING.discard(run)


def flush_open_runs() -> None:
    with _LOCK:
        runs = list(_PENDING)
    for run in runs:
        try:
            run.flush()
        except Exception as e:  # at exit: report, and go on with the other runs
            logger.error("could not store the last metrics of run %s/%s: %s",
                         run.experiment_name, run.run_name, e)
