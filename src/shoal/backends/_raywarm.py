"""Warm supervisor actors on Ray: the local backend's warm workers, one per actor.

A warm actor reserves one resource shape (CPUs, GPUs, memory, custom resources) on some node
and starts there, once, a supervisor that serves a warm pool exactly as a local warm worker
does (``shoal.session:serve_warm_main``: a ``WarmEndpoint`` on a node-local socket, the
persistent executor, batches of calls each recorded as its own job). Each hand-over is one
actor call: the actor claims its supervisor on the node (``_warm.claim_worker``), passes the
job or batch, and returns what the supervisor reported (which jobs ended, their signed
results), so a job costs no worker start, no interpreter start and no imports. The
supervisor retires after its keep-alive period without work, and the actor ends with it;
the supervisor dies with the actor (``PR_SET_PDEATHSIG``), so a lost node leaves nothing.

Actors of one pool are named ``shoal-warm-<key>-<hex>`` (``key``: the jobs' pool, their
resource shape and shoal's code), so clients find and share them. A client hands an actor
one batch at a time; an actor busy with another client's batch says so and the client tries
another (or starts one).
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shoal.backends._warm import claim_worker, pool_dir
from shoal.backends.ray_node import node_env, start_supervisor
from shoal.core.ports import ExecContext, LaunchInfo
from shoal.core.secrets import JOB_SECRETS_VAR
from shoal.errors import LaunchError

__all__ = ["WarmHost", "WarmPools", "warm_key"]

logger = logging.getLogger(__name__)

SERVE_ENTRY = "shoal.session:serve_warm_main"
#: Threads of a warm actor: the hand-over, stop and describe calls, a busy answer to another
#: client.
_CONCURRENCY = 4
_START_TIMEOUT_S = 120.0
_PREFIX = "shoal-warm-"


def warm_key(ctx: ExecContext, demand: Mapping[str, float], code: str) -> str:
    """Jobs that may share a warm actor: same pool (environment, stores), same shape, same
    shoal code."""
    text = json.dumps([ctx.pool, sorted(demand.items()), code])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# --- on the node --------------------------------------------------------------------------


class WarmHost:
    """The warm actor (wrapped by ``ray.remote`` in the client; instantiated on a node)."""

    def __init__(self, name: str, namespace: str, address: str, env: dict[str, str],
                 keep_alive: float) -> None:
        import ray

        self._name = name
        self._node_id = ray.get_runtime_context().get_node_id()
        env = node_env(env, os.environ)
        home = Path(env["SHOAL_HOME"])
        self._dir = pool_dir(home / "run", "ray-" + hashlib.sha256(name.encode()).hexdigest())
        env.update({"SHOAL_RAY_NODE_ID": self._node_id, "SHOAL_WARM_POOL_DIR": str(self._dir),
                    "SHOAL_KEEP_ALIVE_SECONDS": str(keep_alive)})
        self._log = home / "run" / "supervisors" / f"{name}.log"
        self._handle = {"backend": "ray", "actor": name, "namespace": namespace,
                        "address": address, "host": socket.gethostname(),
                        "node_id": self._node_id,
                        "actor_id": ray.get_runtime_context().get_actor_id()}
        self._proc: Any = None
        self._error: BaseException | None = None
        self._started = threading.Event()
        self._ready = False
        self._env_cache: tuple[int, dict[str, str]] | None = None
        self._calls = threading.Condition()
        self._in_flight = 0
        self._exiting = False
        # The supervisor is started by, and dies with, this thread (PR_SET_PDEATHSIG follows
        # the thread that forked), which lives exactly as long as the supervisor.
        threading.Thread(target=self._supervise, args=(env,), daemon=True,
                         name="shoal-warm-supervisor").start()

    def _supervise(self, env: dict[str, str]) -> None:
        import ray

        try:
            self._proc = start_supervisor(SERVE_ENTRY, [], env, None, self._log)
            self._handle["pid"] = self._proc.pid
        except BaseException as e:  # reported to the next hand-over
            self._error = e
            return
        finally:
            self._started.set()
        code = self._proc.wait()
        with contextlib.suppress(OSError), open(self._log, "a") as log:
            log.write(f"[shoal] warm supervisor pid {self._proc.pid} exited with code {code}\n")
        # The supervisor retired (or died): free the node's resources, once the hand-overs
        # in flight have answered ("gone": their clients try another actor).
        with self._calls:
            self._exiting = True
            self._calls.wait_for(lambda: self._in_flight == 0, timeout=30)
        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)

    def info(self) -> dict[str, Any]:
        self._started.wait(_START_TIMEOUT_S)
        return {"node_id": self._node_id, "host": socket.gethostname(),
                "pid": self._proc.pid if self._proc is not None else 0, "log": str(self._log)}

    def poll(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def signal(self, signum: int) -> bool:
        """Signal the supervisor: a SIGTERM stops the jobs whose records ask for it, else
        it retires (after its job, if it has one)."""
        if self._proc is None or self._proc.poll() is not None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._proc.pid, signum)
        return True

    def retire_if_idle(self) -> bool:
        """Retire the supervisor now if no client holds it (its claim lock is free): a stop
        signal to an idle warm supervisor retires it; a client that claims it meanwhile is
        served."""
        if self._proc is None or self._proc.poll() is not None:
            return False
        try:
            lock = open(self._dir / f"{self._proc.pid}.claim")  # noqa: SIM115
        except FileNotFoundError:
            return False  # still starting, or retiring already
        with lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # busy with a client's job
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._proc.pid, signal.SIGTERM)
        return True

    def run(self, request: dict[str, Any]) -> list[tuple[dict[str, Any], bytes]]:
        """Hand *request* to the supervisor (``_run``), unless this actor is ending."""
        with self._calls:
            if self._exiting:
                return [({"gone": True}, b"")]
            self._in_flight += 1
        try:
            return self._run(request)
        finally:
            with self._calls:
                self._in_flight -= 1
                self._calls.notify_all()

    def _run(self, request: dict[str, Any]) -> list[tuple[dict[str, Any], bytes]]:
        """Hand *request* (``{"job", "env", "batch"?}``) to the supervisor; return what it
        reported, ending with ``{"done": true}`` (or ``{"lost": true}`` if it died). A
        supervisor busy with another client answers ``{"busy": true}``, one that retired
        ``{"gone": true}``."""
        if not self._started.wait(_START_TIMEOUT_S) or self._proc is None:
            return [({"gone": True, "error": repr(self._error)}, b"")]
        request = {**request, "env": self._node_env(request.get("env") or {})}
        claim = self._claim(request)
        if isinstance(claim, dict):
            return [(claim, b"")]
        if not request.get("batch"):
            while not claim.wait(3600.0):
                pass
            return [({"done": True}, b"")]
        messages = []
        while True:
            got = claim.read(3600.0)
            if got is None:
                continue
            messages.append(got)
            if got[0].get("done") or got[0].get("lost"):
                return messages

    def _node_env(self, client_env: dict[str, str]) -> dict[str, str]:
        """The job's supervisor environment on this node (one client's is the same for all
        its jobs: worked out once)."""
        # The job's secrets (one job's or one batch's) differ from job to job: not cached.
        handed = {k: v for k, v in client_env.items() if k == JOB_SECRETS_VAR}
        client_env = {k: v for k, v in client_env.items() if k != JOB_SECRETS_VAR}
        key = hash(frozenset(client_env.items()))
        cached = self._env_cache
        if cached is None or cached[0] != key:
            env = node_env(client_env, os.environ)
            env.update({"SHOAL_RAY_NODE_ID": self._node_id,
                        "SHOAL_SUPERVISOR_HANDLE": json.dumps(self._handle)})
            cached = self._env_cache = (key, env)
        return {**cached[1], **handed}

    def _claim(self, request: Mapping[str, Any]) -> Any:
        own = self._dir / f"{self._proc.pid}.claim"
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            # Looked at before the claim: a new supervisor that starts listening during the
            # claim is tried again, not taken for busy (its client would start another actor).
            listening = own.exists()
            claim = claim_worker(self._dir, request)
            if claim is not None:
                self._ready = True
                return claim
            if self._proc.poll() is not None or (self._ready and not own.exists()):
                return {"gone": True}  # it retired: this actor is on its way out
            if listening:
                self._ready = True
                return {"busy": True}  # another client's batch holds it
            if time.monotonic() >= deadline:
                return {"gone": True, "error": "the warm supervisor did not start listening"}
            time.sleep(0.005)  # bounded wait for the new supervisor to listen


# --- in the client ------------------------------------------------------------------------


@dataclass(slots=True)
class _Slot:
    name: str
    actor: Any
    pid: int = 0
    host: str = ""
    busy: bool = False
    dead: bool = False
    answered: bool = False  # it answered a hand-over: placed and running


class WarmPools:
    """The client's warm actors, by key; hands each job or batch to an idle one."""

    def __init__(self, ray: Any, namespace: str, address: str) -> None:
        self._ray = ray
        self._namespace = namespace
        self._address = address
        self._cls = ray.remote(WarmHost)
        self._slots: dict[str, list[_Slot]] = {}
        self._demands: dict[str, dict[str, float]] = {}
        self._lock = threading.RLock()  # take() makes room while it holds it

    def launch(self, ctx: ExecContext, key: str, options: Mapping[str, Any],
               demand: Mapping[str, float]) -> LaunchInfo:
        self._demands[key] = dict(demand)
        request: dict[str, Any] = {"job": ctx.job, "env": dict(ctx.env)}
        if ctx.batch:
            request["batch"] = list(ctx.batch)
        claim = RayClaim(self, key, ctx, options, request)
        slot = claim.slot
        # The mapping is the claim's own: if the actor turns out busy, the claim moves to
        # another one and updates it, so the handle always names the actor with the jobs.
        return LaunchInfo("ray", slot.pid, slot.host, waiter=claim, extra=claim.where)

    def take(self, key: str, ctx: ExecContext, options: Mapping[str, Any],
             skip: frozenset[str] = frozenset()) -> _Slot:
        """An idle actor of *key* (marked busy), found or started; never one named in *skip*
        (it answered busy to this hand-over)."""
        with self._lock:
            slots = self._slots.get(key)
            if slots is None:
                slots = self._slots[key] = self._discover(key)
            slots[:] = [s for s in slots if not s.dead]
            for slot in slots:
                if not slot.busy and slot.name not in skip:
                    slot.busy = True
                    return slot
            slot = self._start(key, ctx, options, self._demands[key])
            slot.busy = True
            slots.append(slot)
            return slot

    def release(self, slot: _Slot, *, dead: bool = False) -> None:
        with self._lock:
            slot.busy = False
            slot.dead = slot.dead or dead

    def _discover(self, key: str) -> list[_Slot]:
        """Warm actors of this key that other clients started (a few ms, once per key)."""
        prefix = f"{_PREFIX}{key}-"
        found = []
        with contextlib.suppress(Exception):  # listing is an optimisation only
            for entry in self._ray.util.list_named_actors(all_namespaces=True):
                if entry.get("namespace") == self._namespace and \
                        str(entry.get("name", "")).startswith(prefix):
                    with contextlib.suppress(ValueError):
                        actor = self._ray.get_actor(entry["name"], namespace=self._namespace)
                        found.append(_Slot(entry["name"], actor))
        return found

    def _start(self, key: str, ctx: ExecContext, options: Mapping[str, Any],
               demand: Mapping[str, float]) -> _Slot:
        name = f"{_PREFIX}{key}-{secrets.token_hex(3)}"
        self.make_room(demand, keep=key)
        try:
            actor = self._cls.options(
                name=name, namespace=self._namespace, lifetime="detached", max_restarts=0,
                max_concurrency=_CONCURRENCY, **options,
            ).remote(name, self._namespace, self._address, dict(ctx.env),
                     float(ctx.keep_alive_seconds))
        except (ValueError, TypeError) as e:
            raise LaunchError(f"Ray refused a warm supervisor for job {ctx.job!r}: {e}",
                              job=ctx.job) from e
        except self._ray.exceptions.RayError as e:
            raise LaunchError(f"cannot start a warm supervisor for job {ctx.job!r} on Ray: "
                              f"{e}", job=ctx.job) from e
        logger.debug("started warm supervisor actor %s", name)
        return _Slot(name, actor)

    def make_room(self, demand: Mapping[str, float], keep: str = "") -> int:
        """When no node has *demand* free, retire the idle warm actors (of any pool but
        *keep*) so the resources they hold go to the job; return how many retired. An idle
        warm actor is a cache: it never makes a job wait."""
        ray = self._ray
        free = _free_per_node(ray)
        with self._lock:
            # Never this client's own busy actors, nor its own of *keep* (it is about to hand
            # them work); its own idle ones of other pools retire like anyone's: else the
            # only slot a job pinned to one node needs may be held by its own client's cache.
            mine = {s.name for k, group in self._slots.items() for s in group
                    if s.busy or (keep and k == keep)}
            idle = {s.name: s for k, group in self._slots.items() for s in group
                    if s.name not in mine}
            # Actors this client started that have not answered yet may not be placed yet:
            # count their demand as taken.
            waiting = [self._demands.get(k, {}) for k, group in self._slots.items()
                       for s in group if not s.answered and not s.dead]
        for want in waiting:
            for node in free:
                if all(node.get(k, 0.0) >= v for k, v in want.items()):
                    for k, v in want.items():
                        node[k] = node.get(k, 0.0) - v
                    break
        if any(all(node.get(k, 0.0) >= v for k, v in demand.items()) for node in free):
            return 0
        refs = []
        with contextlib.suppress(Exception):
            for entry in ray.util.list_named_actors(all_namespaces=True):
                name = str(entry.get("name", ""))
                if entry.get("namespace") != self._namespace or not name.startswith(_PREFIX) \
                        or name in mine or (keep and name.startswith(f"{_PREFIX}{keep}-")):
                    continue
                with contextlib.suppress(ValueError):
                    actor = ray.get_actor(name, namespace=self._namespace)
                    refs.append((name, actor.retire_if_idle.remote()))
        retired = 0
        for name, ref in refs:
            with contextlib.suppress(Exception):
                if ray.get(ref, timeout=5):
                    retired += 1
                    if name in idle:  # one of ours: never handed anything again
                        self.release(idle[name], dead=True)
        if retired:
            logger.info("retired %d idle warm supervisor actor(s) to make room for %s",
                        retired, dict(demand))
        return retired

    def retire_all(self) -> None:
        """Ask this client's idle warm supervisors to retire now (benchmarks, tests)."""
        with self._lock:
            slots = [s for group in self._slots.values() for s in group if not s.dead]
        for slot in slots:
            with contextlib.suppress(Exception):
                self._ray.get(slot.actor.signal.remote(int(signal.SIGTERM)), timeout=5)
            slot.dead = True


def _over_client(ray: Any) -> bool:
    """Connected through Ray Client (``ray://host:port``) rather than as a driver on a node."""
    with contextlib.suppress(ImportError, AttributeError):
        from ray.util.client import ray as client

        return bool(client.is_connected())
    return False


def _free_per_node(ray: Any) -> list[dict[str, float]]:
    """What each alive node has free. Ray Client serves no per-node view (Ray's state API
    needs a driver on a node): there the cluster's total counts as one node."""
    if not _over_client(ray):
        with contextlib.suppress(ImportError, AttributeError):
            from ray._private.state import available_resources_per_node

            return [dict(n) for n in available_resources_per_node().values()]
    return [dict(ray.available_resources())]


class RayClaim:
    """The client's hold on a warm actor for one job or batch: ``read``/``wait`` as a local
    ``WarmClaim`` (``_warm.py``)."""

    _ATTEMPTS = 8

    def __init__(self, pools: WarmPools, key: str, ctx: ExecContext,
                 options: Mapping[str, Any], request: dict[str, Any]) -> None:
        self._pools, self._key, self._ctx, self._options = pools, key, ctx, options
        self._request = request
        self._ray = pools._ray
        self._queue: collections.deque[tuple[dict[str, Any], bytes]] = collections.deque()
        self.done = False
        self._lost = False
        self.where: dict[str, Any] = {}
        self._attempts = 0
        self._tried: set[str] = set()
        self._hand_over()

    @property
    def pid(self) -> int:
        return int(self.where.get("pid") or self.slot.pid)

    def _hand_over(self) -> None:
        self._attempts += 1
        self.slot = self._pools.take(self._key, self._ctx, self._options,
                                     frozenset(self._tried))
        self._tried.add(self.slot.name)
        self.where.clear()
        self.where.update({"actor": self.slot.name, "namespace": self._pools._namespace,
                           "address": self._pools._address})
        self._ref = self.slot.actor.run.remote(self._request)

    def read(self, timeout: float) -> tuple[dict[str, Any], bytes] | None:
        """The next message about the batch, or None on timeout; ``{"lost": true}`` when the
        actor died with the jobs."""
        deadline = time.monotonic() + max(timeout, 0.0)
        while not self._queue:
            if self.done:
                return {"lost": True} if self._lost else {"done": True}, b""
            ray = self._ray
            try:
                messages = ray.get(self._ref, timeout=max(deadline - time.monotonic(), 0.0))
            except ray.exceptions.GetTimeoutError:
                return None
            except ray.exceptions.RayError as e:  # the actor (or its node) died
                logger.warning("warm actor %s failed a hand-over: %s", self.slot.name, e)
                self._finish(dead=True)
                continue
            self.slot.answered = True
            first = messages[0][0] if messages else {"lost": True}
            if first.get("busy") or first.get("gone") or messages[-1][0].get("lost"):
                logger.debug("warm actor %s answered %s (attempt %d)", self.slot.name,
                             [m for m, _ in messages], self._attempts)
            if (first.get("busy") or first.get("gone")) and self._attempts < self._ATTEMPTS:
                self._pools.release(self.slot, dead=bool(first.get("gone")))
                try:
                    self._hand_over()
                except LaunchError:
                    self._finish(dead=False)
                    self._lost = True
                continue
            if first.get("busy") or first.get("gone"):
                self._finish(dead=False)
                self._lost = True
                continue
            self._queue.extend(messages)
            last = messages[-1][0]
            if last.get("done") or last.get("lost"):  # the actor is free again already
                self._finish(dead=bool(last.get("lost")))
        return self._queue.popleft()

    def wait(self, timeout: float) -> bool:
        """True once the job ended (or the actor is gone); False on timeout."""
        deadline = time.monotonic() + max(timeout, 0.0)
        while not self.done:
            if self.read(deadline - time.monotonic()) is None:
                return False
        return True

    def _finish(self, *, dead: bool) -> None:
        if not self.done:
            self.done = True
            self._lost = dead
            self._pools.release(self.slot, dead=dead)

    def close(self) -> None:
        """Give the actor back. Its answer follows the job's recorded end at once; an actor
        that does not answer is not handed anything else by this client."""
        if not self.done:
            with contextlib.suppress(Exception):
                self.wait(5.0)
        if not self.done:
            self._finish(dead=True)
