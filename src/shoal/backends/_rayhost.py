"""The other hosts of a job placed on several Ray nodes (``instance_count`` > 1).

The Ray backend reserves one placement-group bundle per host (``ray.py``); the job's
supervisor runs in bundle 0 and starts host ``algo-1``'s ranks itself. For every other host its
rank launcher (``shoal.jobs._ranks``) runs this module as one more "rank"::

    python -m shoal.backends._rayhost '{"job": ..., "attempt": 1, "host_index": 1,
                                       "master_addr": ..., "master_port": ...}'

which starts a ``RankHost`` actor in that host's bundle, on its node. The actor prepares the
job there as for the first host (environment, code, channels: ``shoal.session:rank_host_main``)
and runs that host's ranks; this process streams their output into the job's log (each line
already prefixed with its host and rank), passes a stop on, and exits with the host's exit
code. The actor is owned by this process and its processes die with the actor
(``PR_SET_PDEATHSIG``): whichever side goes first, nothing is left running. A node lost
mid-job ends this process with an error, which stops the job's other ranks and fails it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from shoal.backends.ray_node import node_env, start_supervisor
from shoal.core.ports import LOST_HOSTS

__all__ = ["PLACEMENT_VAR", "RankHost", "main", "placement_group_by_id"]

#: The supervisor's environment on a job placed on several nodes: JSON with the placement
#: group's name, the namespace, the GCS address and each bundle's actor options.
PLACEMENT_VAR = "SHOAL_RAY_PLACEMENT"

HOST_ENTRY = "shoal.session:rank_host_main"
_POLL_S = 0.2
_CHUNK = 1 << 20
#: How long the host's actor may take to start in its (already reserved) bundle.
_START_TIMEOUT_S = 300.0
#: After a stop, how long past the job's grace period to wait for the host before killing it.
_KILL_AFTER_S = 5.0
#: How long a host's launcher waits for Ray to declare its lost node dead.
_DEAD_TIMEOUT_S = 120.0


def placement_group_by_id(hex_id: str) -> Any:
    """The placement group of that id (a job's record and supervisor carry it as hex)."""
    from ray import PlacementGroupID
    from ray.util.placement_group import PlacementGroup

    return PlacementGroup(PlacementGroupID(bytes.fromhex(hex_id)))


class RankHost:
    """The actor of one other host (wrapped by ``ray.remote`` in ``main``; instantiated on the
    node of its bundle)."""

    def __init__(self, env: dict[str, str], spec: dict[str, Any]) -> None:
        import ray

        self._node_id = ray.get_runtime_context().get_node_id()
        env = node_env(env, os.environ)
        env["SHOAL_RAY_NODE_ID"] = self._node_id
        host = f"algo-{int(spec['host_index']) + 1}"
        self._log = (Path(env["SHOAL_HOME"]) / "run" / "supervisors" /
                     f"{spec['job']}.{spec['attempt']}.{host}.log")
        self._log.parent.mkdir(parents=True, exist_ok=True)
        self._log.write_bytes(b"")
        args = [str(spec[k]) for k in ("job", "attempt", "host_index", "master_addr",
                                       "master_port")]
        # Started from this (the worker's main) thread: PR_SET_PDEATHSIG follows it.
        self._proc = start_supervisor(HOST_ENTRY, args, env, None, self._log)

    def node_id(self) -> str:
        return self._node_id

    def close(self) -> None:
        """Drop the host's output file (its lines are in the job's log by now)."""
        self._log.unlink(missing_ok=True)

    def read(self, offset: int) -> tuple[bytes, int | None]:
        """Output from *offset* on, and the exit code once the host has ended (and every
        byte of its output is in this answer)."""
        rc = self._proc.poll()
        with open(self._log, "rb") as f:
            f.seek(offset)
            data = f.read(_CHUNK)
            more = bool(f.read(1))
        return data, (None if rc is None or more else rc)

    def signal(self, signum: int) -> None:
        """Signal the host's rank launcher (SIGTERM: it stops its ranks within the grace
        period); SIGKILL goes to its whole process group."""
        if self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                if signum == signal.SIGKILL:
                    os.killpg(self._proc.pid, signum)
                else:
                    os.kill(self._proc.pid, signum)


def wait_declared_dead(ray: Any, node: str, timeout: float = _DEAD_TIMEOUT_S) -> str:
    """Wait until Ray no longer counts *node* alive (its raylet missed its health checks),
    at most *timeout* seconds; say how it went."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = [n for n in ray.nodes() if n.get("NodeID") == node and n.get("Alive")]
        except Exception:  # the cluster does not answer either: retrying is all we can do
            found = [{}]
        if found and _raylet_answers(found[0]):
            return f"node {node} still runs: only the host's actor was lost"
        if not found:
            return f"node {node} is declared dead: the next attempt is placed on live nodes"
        if time.monotonic() >= deadline:
            return (f"node {node} still counts as alive after {timeout:g} s; the next "
                    "attempt may wait for its bundle to be placed")
        time.sleep(_POLL_S * 5)  # Ray's health checks take seconds: a bounded poll


def _raylet_answers(entry: dict[str, Any]) -> bool:
    """Whether the node's raylet still accepts connections (a node that is going away
    counts as alive in Ray for a while after its raylet died)."""
    import socket

    host, port = entry.get("NodeManagerAddress"), entry.get("NodeManagerPort")
    if not host or not port:
        return False
    try:
        with socket.create_connection((str(host), int(port)), timeout=2.0):
            return True
    except OSError:
        return False


def _exit_code(rc: int) -> int:
    return 128 - rc if rc < 0 else rc


def main(argv: list[str] | None = None) -> int:
    spec = json.loads((sys.argv[1:] if argv is None else argv)[0])
    placement = json.loads(os.environ[PLACEMENT_VAR])
    host = f"algo-{int(spec['host_index']) + 1}"
    out = sys.stdout.buffer

    def say(text: str) -> None:
        out.write(f"[shoal] {host}: {text}\n".encode())
        out.flush()

    node: str | None = None

    def lost(text: str) -> int:
        where = f" (node {node})" if node else ""
        say(f"{text}{where}")
        if node:
            # The next attempt must not land on that node again: wait (bounded) until Ray
            # has declared it dead, so that the group's bundle there is placed elsewhere.
            say(wait_declared_dead(ray, node))
        # The supervisor reads this (the job's directory is our working directory): an
        # infrastructure failure, retried up to max_retry_attempts.
        with open(LOST_HOSTS, "a") as f:
            f.write(f"{host}{where}: {text.splitlines()[0]}\n")
        return 1

    # Signals that arrive while connecting wait: ray.init installs its own SIGTERM handler
    # (sys.exit), which ours replace right after it.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    ray.init(address=placement["gcs"], namespace=placement["namespace"], log_to_driver=False,
             configure_logging=False, logging_level=logging.WARNING)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    signal.signal(signal.SIGINT, lambda signum, frame: stop.set())
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    group = placement_group_by_id(placement["group"])
    strategy = PlacementGroupSchedulingStrategy(
        group, placement_group_bundle_index=int(spec["host_index"]))
    # What the supervisor runs with (the stores, their credentials), never the job's own
    # variables: the actor's arguments are kept in Ray's control store. Not the cluster's
    # token setting either: only this launcher connects to Ray, not the host it starts.
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "SHOAL_RAY_NODE_ID", PLACEMENT_VAR)
           and not k.startswith("RAY_AUTH")}
    actor: Any = ray.remote(RankHost).options(
        scheduling_strategy=strategy, max_restarts=0, max_concurrency=2,
        **placement["bundle"]).remote(env, spec)
    offset, stop_sent = 0, None
    grace = float(spec.get("grace_seconds", 10.0))
    try:
        try:
            node = ray.get(actor.node_id.remote(), timeout=_START_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            return lost(f"its bundle of the placement group could not be placed within "
                        f"{_START_TIMEOUT_S:g} s (its node lost?)")
        say(f"starting on node {node}")
        while True:
            if stop.is_set() and stop_sent is None:
                say("stop requested: stopping its ranks")
                actor.signal.remote(int(signal.SIGTERM))
                stop_sent = time.monotonic()
            if stop_sent is not None and time.monotonic() > stop_sent + grace + _KILL_AFTER_S:
                say("its ranks did not stop in time: killing them")
                with contextlib.suppress(ray.exceptions.RayError):
                    ray.get(actor.signal.remote(int(signal.SIGKILL)), timeout=5)
                return 128 + signal.SIGKILL
            data, rc = ray.get(actor.read.remote(offset))
            if data:
                out.write(data)
                out.flush()
                offset += len(data)
            if rc is not None:
                return _exit_code(rc)
            if not data:
                stop.wait(_POLL_S)
    except ray.exceptions.RayActorError as e:
        if getattr(e, "actor_init_failed", False):  # a bug or a broken node setup: no retry
            say(f"its actor could not start: {e}")
            return 1
        return lost(f"its node or actor was lost: {type(e).__name__}: {e}")
    finally:
        with contextlib.suppress(Exception):
            ray.get(actor.close.remote(), timeout=5)
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)


if __name__ == "__main__":
    sys.exit(main())
