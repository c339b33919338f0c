"""An in-memory backend: a real implementation of the ``Backend`` port that starts nothing.

It is a test double, as httpx's ``MockTransport`` is a transport: ``JobService`` (and
anything else written against ``Backend``) runs on it unchanged, with real stores, while the
test plays the supervisor. ``launch`` records the ``ExecContext`` it was given and returns a
``LaunchInfo`` for a supervisor that exists only here; the test then runs that supervisor's
entry point itself (in-process, with ``context(job).env``), says that it exited
(``exit(job)``) or was lost with its node (``lose_node(job)``), refuses submissions or launches, and reads which stops were asked for.

It is not registered in ``shoal.backends.BACKENDS``: a session on it would run no job.

Example:
    >>> from shoal.backends.memory import MemoryBackend
    >>> from shoal.core import ExecContext, JobName
    >>> backend = MemoryBackend()
    >>> info = backend.launch(ExecContext(job=JobName("j-1"), entrypoint="m:main"))
    >>> backend.is_alive(info.to_json())
    True
    >>> backend.exit("j-1")
    >>> backend.is_alive(info.to_json())
    False
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from shoal.core.ports import ExecContext, Handle, LaunchInfo, SupervisorLoss
from shoal.errors import LaunchError, ShoalError

__all__ = ["MemoryBackend"]

#: The host of every handle this backend gives out (no machine runs its supervisors).
HOST = "memory"


class MemoryBackend:
    """Keeps what it is asked to launch; its supervisors live as long as the test says.

    Args:
        refuse_submissions: raised by ``check_submission`` (a backend that finds, before a
            job is recorded, that its supervisor could not work), until changed.
        refuse_launches: raised by ``launch`` (a backend that cannot start a supervisor).
    """

    name = "memory"

    def __init__(self, *, refuse_submissions: ShoalError | None = None,
                 refuse_launches: ShoalError | None = None) -> None:
        self.refuse_submissions = refuse_submissions
        self.refuse_launches = refuse_launches
        #: Every context launched, in order (a job handed over again appears again).
        self.launched: list[ExecContext] = []
        #: The environments ``check_submission`` was called with, in order.
        self.checked: list[dict[str, str]] = []
        #: The supervisors asked to stop, by the job (or batch) each was launched for, in order.
        self.stop_requests: list[str] = []
        self.closed = False
        self._lock = threading.Lock()
        self._pids: dict[str, int] = {}  # the latest supervisor of each job (and batch)
        self._launched_for: dict[int, str] = {}  # each supervisor's ExecContext.job
        self._alive: dict[int, bool] = {}
        self._lost_nodes: dict[int, str] = {}  # supervisors lost with their node, the node
        self._next_pid = 1

    # --- the Backend port -------------------------------------------------------------

    def check_submission(self, env: Mapping[str, str]) -> None:
        self.checked.append(dict(env))
        if self.refuse_submissions is not None:
            raise self.refuse_submissions

    def launch(self, ctx: ExecContext) -> LaunchInfo:
        if self.closed:
            raise LaunchError(f"the memory backend is closed; cannot start job {ctx.job!r}",
                              job=ctx.job)
        if self.refuse_launches is not None:
            raise self.refuse_launches
        with self._lock:
            pid = self._next_pid
            self._next_pid += 1
            self.launched.append(ctx)
            self._pids[ctx.job] = pid
            self._launched_for[pid] = ctx.job
            for name in ctx.batch:
                self._pids[name] = pid
            self._alive[pid] = True
        return LaunchInfo(self.name, pid, HOST)

    def is_alive(self, handle: Handle) -> bool | None:
        """Known for a handle of this backend; None for any other (or none)."""
        if handle.get("backend") != self.name or handle.get("host") != HOST:
            return None
        return self._alive.get(int(handle.get("pid") or 0))

    def signal_stop(self, handle: Handle) -> None:
        """Note the request (``stop_requests``); the supervisor, played by the test, records
        the job's end as a real one would."""
        if self.is_alive(handle):
            self.stop_requests.append(self._launched_for[int(handle["pid"])])

    def supervisor_loss(self, handle: Handle) -> SupervisorLoss | None:
        """For a gone supervisor of this backend: lost with its node (``lose_node``) or its
        process alone (``exit``); None for a live one or another backend's."""
        if self.is_alive(handle) is not False:
            return None
        node = self._lost_nodes.get(int(handle["pid"]))
        return SupervisorLoss(node_lost=node is not None, where=f"node {node or HOST}",
                              detail="the test lost it" if node else "")

    def close(self) -> None:
        self.closed = True

    # --- what a test drives -----------------------------------------------------------

    def context(self, job: str) -> ExecContext:
        """The latest context launched for *job* (or for a batch holding it)."""
        for ctx in reversed(self.launched):
            if ctx.job == job or job in ctx.batch:
                return ctx
        raise KeyError(f"no supervisor was launched for job {job!r} "
                       f"(launched: {[c.job for c in self.launched]})")

    def handle(self, job: str) -> dict[str, Any]:
        """The handle of *job*'s latest supervisor, as stored on its record."""
        return LaunchInfo(self.name, self._pid(job), HOST).to_json()

    def exit(self, job: str) -> None:
        """*job*'s supervisor exited (or was killed): ``is_alive`` says False from now on."""
        self._alive[self._pid(job)] = False

    def lose_node(self, job: str, node: str = "node-1") -> None:
        """*job*'s supervisor was lost with its node *node* (as a cluster's would be)."""
        pid = self._pid(job)
        self._alive[pid] = False
        self._lost_nodes[pid] = node

    def _pid(self, job: str) -> int:
        try:
            return self._pids[job]
        except KeyError:
            raise KeyError(f"no supervisor was launched for job {job!r}") from None
