"""Jobs submitted inside ``with Run(...)``: linked to that run once their record exists."""

from __future__ import annotations

import logging

from shoal.core.jobs import JobSpec
from shoal.core.ports import RunStore
from shoal.errors import ShoalError

__all__ = ["link_to_run"]

logger = logging.getLogger(__name__)


def link_to_run(metadata: RunStore, spec: JobSpec, job_name: str) -> None:
    """Record that *job_name* ran for the run its spec names (``extra["run"]``), if any."""
    run = spec.extra.get("run")
    if not run:
        return
    try:
        metadata.link_run_job(run["experiment_name"], run["run_name"], job_name)
    except ShoalError as e:  # the job runs regardless; only the link is missing
        logger.warning("job %s was not linked to run %s/%s: %s", job_name,
                       run["experiment_name"], run["run_name"], e)
