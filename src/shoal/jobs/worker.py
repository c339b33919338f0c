"""The processes that supervise jobs: a job's (or batch's) supervisor, a warm worker that
starts without a job (a Ray warm actor's), and another host of a job placed on several nodes.

Backends start them by the dotted names ``shoal.session:supervisor_main``,
``shoal.session:serve_warm_main`` and ``shoal.session:rank_host_main``: those build a
``WorkerContext`` from a session (its job service, stores, environment builder, settings and
the backend's warm endpoint) and call the functions here, so the job layer never imports the
session.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from shoal.errors import ConfigError, PermissionDeniedError
from shoal.jobs._training import CHECKPOINT_SYNC_SECONDS
from shoal.jobs.driver import Supervisor
from shoal.jobs.service import JobService
from shoal.jobs.slots import SlotPool

if TYPE_CHECKING:
    from shoal.core.ports import WarmWorkerEndpoint
    from shoal.envs import UvEnvBuilder

__all__ = ["WorkerContext", "rank_host_main", "serve_warm", "serve_warm_main",
           "supervisor_main"]

#: Opens the worker's side of a warm pool: ``(pool directory, busy)`` (``WarmPoolHost``).
OpenEndpoint = Callable[[str, bool], "WarmWorkerEndpoint"]


@dataclass(frozen=True, slots=True)
class WorkerContext:
    """What a supervisor process needs from its session."""

    jobs: JobService
    home: Path
    max_slots: int
    #: Fork each job from the supervisor (``job_process="fork"``) rather than exec it.
    fork: bool
    envs: UvEnvBuilder | None
    warm_endpoint: OpenEndpoint
    #: Closes the session's stores (when the process is done).
    close: Callable[[], None]
    zygote_idle_seconds: float = 300.0
    checkpoint_sync_seconds: float = CHECKPOINT_SYNC_SECONDS

    def supervisor(self, *, warm: bool) -> Supervisor:
        """A supervisor of this home's jobs (a warm one serves one job after another)."""
        # A supervisor derives no keys: it knows only the secrets of the jobs handed to it.
        self.jobs.hand_over({})
        return Supervisor(self.jobs, work_root=self.home / "work",
                          slots=SlotPool(self.home / "slots", self.max_slots), fork=self.fork,
                          envs=self.envs, warm=warm, run_dir=self.home / "run",
                          zygote_idle_seconds=self.zygote_idle_seconds,
                          checkpoint_sync_seconds=self.checkpoint_sync_seconds)


def _warm_settings() -> tuple[str | None, float]:
    """The warm pool this supervisor serves (its launcher's environment) and how long it
    stays idle before it retires."""
    pool = os.environ.get("SHOAL_WARM_POOL_DIR") or None
    return pool, float(os.environ.get("SHOAL_KEEP_ALIVE_SECONDS") or 0)


def supervisor_main(ctx: WorkerContext, job: str, *batch: str) -> int:
    """A job's supervisor (forked by the launcher or spawned); with *batch*, *job* names a
    batch and *batch* its jobs (``JobService.submit_batch``). In a warm pool it then stays
    to serve the pool's next jobs."""
    pool, keep_alive = _warm_settings()
    endpoint = None
    supervisor = None
    try:
        supervisor = ctx.supervisor(warm=bool(pool))
        if pool and keep_alive > 0:
            # Listen (busy) before the first job ends, and become claimable just before its
            # end is recorded: a client that sees it end and calls again finds this worker.
            endpoint = ctx.warm_endpoint(pool, True)
            supervisor.before_finish = endpoint.release
        code = supervisor.run_batch(job, batch) if batch else supervisor.run(job)
        if endpoint is not None and pool:
            serving, endpoint = endpoint, None  # serve_warm closes it
            serve_warm(supervisor, serving, pool, keep_alive)
        return code
    finally:
        if endpoint is not None:
            endpoint.close()
        if supervisor is not None:
            supervisor.close()
        ctx.close()
        sys.stdout.flush()


def serve_warm(supervisor: Supervisor, endpoint: WarmWorkerEndpoint, pool: str,
               keep_alive: float) -> None:
    """Stay alive for *keep_alive* seconds after each job and take the next one handed over
    on *endpoint*; retire when idle that long, or on a stop signal while idle."""
    from shoal._internal.proctitle import set_title
    from shoal.jobs._child import replace_environ

    short = os.path.basename(pool.rstrip("/"))
    try:
        endpoint.release()  # claimable from now on (if the first job did not release it)
        set_title("warm-worker", f"{short} idle")
        while (request := endpoint.next_job(keep_alive, supervisor.stop_requested)) is not None:
            set_title("warm-worker", f"{short} {request.job}")
            replace_environ(request.env)  # each job runs with its own client's environment
            try:
                if request.batch:
                    supervisor.run_batch(request.job, request.batch, notify=endpoint.notify,
                                         take=request.take, claimer=endpoint)
                else:
                    supervisor.run(request.job)
            finally:
                endpoint.job_done()
                set_title("warm-worker", f"{short} idle")
        if supervisor.stop_requested():
            sys.stderr.write(f"[shoal] warm supervisor pid {os.getpid()} retires: a stop "
                             "signal came\n")
    finally:
        endpoint.close()


def rank_host_main(ctx: WorkerContext, job: str, attempt: str, host_index: str,
                   master_addr: str, master_port: str) -> int:
    """Another host of a job placed on several nodes (a Ray placement group's bundle):
    prepares the job on this node and becomes that host's rank launcher."""
    supervisor = ctx.supervisor(warm=False)
    try:
        return supervisor.run_host(job, int(attempt), int(host_index), master_addr,
                                   int(master_port))
    finally:
        ctx.close()
        sys.stdout.flush()


def serve_warm_main(ctx: WorkerContext) -> int:
    """A warm supervisor that starts without a job (a Ray backend's warm actor starts one
    per node and shape): open the stores and load the supervisor's modules now, then serve
    the pool in ``SHOAL_WARM_POOL_DIR`` until idle for ``SHOAL_KEEP_ALIVE_SECONDS``."""
    pool, keep_alive = _warm_settings()
    if pool is None:
        raise ConfigError("a warm supervisor started without SHOAL_WARM_POOL_DIR: set it to "
                          "the directory of the pool it is to serve")
    try:
        for module in ("shoal.jobs._batchrun", "shoal.jobs._batchfiles"):
            importlib.import_module(module)
        from shoal.serialization import warm_up

        warm_up()
        # Through a team server the job token it started with reaches that job alone: the
        # warm-up's 403 still opened the connection (and checked the server and the token).
        with contextlib.suppress(PermissionDeniedError):
            ctx.jobs.metadata.find_job("shoal-warm-up")
        _ = ctx.jobs.artifacts
        supervisor = ctx.supervisor(warm=True)
        # Stop signals from the start (another supervisor installs them with its first job),
        # so an idle one asked to retire retires cleanly; it dies with its actor in any case
        # (PR_SET_PDEATHSIG). SIGTERM is a stop signal here as in every supervisor: a job is
        # stopped only if its record asks for it, else the worker retires after its job (and
        # says so in its log). It once took only SIGUSR2 and ignored SIGTERM as "sent by no
        # shoal call": those SIGTERMs were make_room's retire_if_idle to the client's own
        # idle actors (it spares them since), then no signal at all (keep-alive retirements
        # behind the claim bug of performance.md). Who sends one: its actor (stop, retire),
        # a cancel or 'shoal workers stop' from a local session on the same home and host,
        # 'shoal ray down' (test_a_warm_supervisor_started_without_a_job_takes_stop_signals).
        supervisor.install_signals()
        try:
            serve_warm(supervisor, ctx.warm_endpoint(pool, False), pool, keep_alive)
        finally:
            supervisor.close()
        return 0
    finally:
        ctx.close()
        sys.stdout.flush()
