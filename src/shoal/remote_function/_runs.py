"""The one way a call becomes a job and comes back (``@remote`` and ``RemoteExecutor``):
submit, link to the caller's run (``with Run(...)``), follow to the end, return the outcome."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from shoal.core.jobs import JobRecord, JobSpec
from shoal.core.ports import RunStore
from shoal.errors import ShoalError

if TYPE_CHECKING:
    from shoal.jobs.batchclient import JobBatch
    from shoal.jobs.service import JobService

__all__ = ["link_to_run", "run_call", "submit_calls"]

logger = logging.getLogger(__name__)

Call = tuple[tuple[Any, ...], dict[str, Any]]


def link_to_run(metadata: RunStore, spec: JobSpec, job_name: str) -> None:
    """Record that *job_name* ran for the run its spec names (``spec.run``), if any."""
    run = spec.run
    if run is None:
        return
    try:
        metadata.link_run_job(run.experiment_name, run.run_name, job_name)
    except ShoalError as e:  # the job runs regardless; only the link is missing
        logger.warning("job %s was not linked to run %s/%s: %s", job_name,
                       run.experiment_name, run.run_name, e)


def run_call(service: JobService, runs: RunStore, spec: JobSpec, func: Callable[..., Any], call: Call, *,
             files: dict[str, bytes], submitted: Callable[[str], None] | None = None,
             on_output: Callable[[bytes], None] | None = None,
             on_status: Callable[[JobRecord], None] | None = None) -> Any:
    """Run one call as its own job: the function's value, or its exception raised here;
    the job is linked to the caller's run in *runs*. *submitted* hears the job's name once it is recorded."""
    args, kwargs = call
    record = service.submit_function(spec, func, args, kwargs, files=files)
    if submitted is not None:
        submitted(record.name)
    link_to_run(runs, spec, record.name)
    record = service.wait(record.name, on_output=on_output, on_status=on_status)
    return service.outcome(record)


def submit_calls(service: JobService, runs: RunStore, specs: Sequence[JobSpec],
                 func: Callable[..., Any], calls: Sequence[Call]) -> JobBatch:
    """Hand several calls of *func* to one warm worker (each its own job, linked to the
    caller's run); the batch's ``outcomes()`` bring them back as they end."""
    batch = service.submit_batch(list(specs), func, list(calls))
    for spec, name in zip(specs, batch.names, strict=True):
        link_to_run(runs, spec, name)
    return batch
