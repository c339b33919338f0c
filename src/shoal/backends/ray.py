"""The Ray backend: each job's supervisor runs on a node of a Ray cluster.

A detached actor per job reserves the job's resources (CPUs, GPUs and memory of its instance
type, plus the session's custom resources) on some node and starts there the same supervisor
the local backend starts (``shoal.session:supervisor_main``), as a subprocess in a session of
its own. The supervisor dies with the actor (``PR_SET_PDEATHSIG``), so a lost node never leaves
a job running, and the actor ends itself when the supervisor exits. Detached, so a job
outlives the client that submitted it, as on the local backend. Everything the job reports
goes through the stores, which every node must reach.

A job with a keep-alive period (``keep_alive_period_in_seconds``, or the session's
``ray_keep_alive_seconds`` for ``@remote`` and ``RemoteExecutor`` jobs) goes instead to a warm
supervisor actor of its pool and shape, started on first use and reused until it idles out
(``_raywarm.py``): the local backend's warm worker, on a node, one actor call per job or batch.

``ray`` is imported lazily, inside the functions that need it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal._internal.extras import require
from shoal.backends._raybound import bounded, outlive_head, probe_address
from shoal.backends._rayhost import PLACEMENT_VAR, placement_group_by_id
from shoal.backends.ray_node import node_env, start_supervisor
from shoal.core.ports import (
    RANK_HOST_LAUNCHER,
    RANK_MASTER_ADDR,
    ExecContext,
    LaunchInfo,
    SupervisorLoss,
)
from shoal.errors import (
    BackendUnavailableError,
    ConfigError,
    LaunchError,
    ResourceUnavailableError,
)

if TYPE_CHECKING:
    from shoal.backends._raywarm import WarmPools

__all__ = ["RayBackend", "check_feasible", "check_placeable", "check_server_reachable",
           "check_shared_stores", "node_env"]

logger = logging.getLogger(__name__)

_STOP_CALL_TIMEOUT_S = 5.0
#: how long a job's supervisor actor waits for its placement group's removal before it ends
#: itself (whoever next finds it gone removes the group: ``is_alive``)
_GROUP_REMOVAL_TIMEOUT_S = 60.0
#: Ray's proxier's message when the server it starts for a Ray Client connection dies.
_CLIENT_SERVER_DIED = "Starting Ray client server failed"
_CLIENT_SERVER_TRIES = 3
_NODES_TTL_S = 1.0


def _is_node_local(url: str) -> bool:
    """A store only this machine reaches: SQLite, a file:// root or a plain path."""
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    return scheme in ("", "file", "local") or scheme.startswith("sqlite")


def check_shared_stores(env: Mapping[str, str], alive_nodes: int,
                        node_addresses: Sequence[str] = ()) -> None:
    """Refuse node-local stores on a cluster of several nodes: a job on another node would
    write its state and results where the client never looks. A supervisor of a team server
    (``SHOAL_SERVER_URL``) reaches its stores through the server: then the server's address
    must be one the nodes (at *node_addresses*) can reach."""
    server = env.get("SHOAL_SERVER_URL")
    if server:
        check_server_reachable(server, node_addresses)
        return
    if alive_nodes <= 1:
        return
    problems = []
    metadata = env.get("SHOAL_METADATA_URL", "")
    artifacts = env.get("SHOAL_ARTIFACT_URL", "")
    if _is_node_local(metadata):
        problems.append(f"the metadata store {metadata} (set SHOAL_METADATA_URL="
                        "postgresql://user@host/db, or metadata_url=)")
    if _is_node_local(artifacts):
        problems.append(f"the artifact store {artifacts} (set SHOAL_ARTIFACT_URL="
                        "s3://bucket/prefix, or artifact_url=)")
    if problems:
        raise ConfigError(
            f"the Ray cluster has {alive_nodes} nodes, and jobs on the other nodes cannot reach "
            f"{' or '.join(problems)}. Use stores every node reaches, or a one-node cluster",
            nodes=alive_nodes)


def check_server_reachable(url: str, node_addresses: Sequence[str], *,
                           on_this_host: Callable[[str], bool] | None = None) -> None:
    """Refuse a loopback server URL when a node is on another host (its address is neither
    a loopback one nor one of this host's: *on_this_host*, by default whether a socket binds
    it): that node's supervisors would connect to their own host. Called in the server's
    process, on the server's host."""
    from urllib.parse import urlsplit

    host = urlsplit(url).hostname or ""
    if not _is_loopback(host):
        return
    here = on_this_host or _binds
    elsewhere = sorted({a for a in node_addresses
                        if a and not _is_loopback(a) and not here(a)})
    if elsewhere:
        raise ConfigError(
            f"the shoal server's jobs reach it at {url}, a loopback address, but the Ray "
            f"cluster has nodes at {', '.join(elsewhere[:8])}, whose supervisors could not "
            "connect to it. Start the server with --public-url http://<an address of the "
            "server's host those nodes reach>:<port> (or SHOAL_SERVER_PUBLIC_URL), binding "
            "that address or 0.0.0.0", url=url)


def _binds(address: str) -> bool:
    """Whether *address* is one of this host's (a socket can bind it)."""
    import ipaddress

    try:
        family = socket.AF_INET6 if ipaddress.ip_address(address).version == 6 \
            else socket.AF_INET
    except ValueError:  # a host name: resolved as the node's raylet would be reached
        try:
            address = socket.gethostbyname(address)
        except OSError:
            return False
        family = socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((address, 0))
    except OSError:
        return False
    return True


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_feasible(job: str, demand: Mapping[str, float],
                   nodes: list[Mapping[str, float]]) -> None:
    """Refuse a job no alive node could ever hold (Ray would queue it forever)."""
    if any(all(node.get(k, 0.0) >= v for k, v in demand.items()) for node in nodes):
        return
    asked = ", ".join(f"{k}={v:g}" for k, v in sorted(demand.items()))
    largest = "; ".join(", ".join(f"{k}={node.get(k, 0.0):g}" for k in sorted(demand))
                        for node in nodes[:8]) or "no alive node"
    raise ResourceUnavailableError(
        f"no node of the Ray cluster can hold job {job!r} ({asked}); its nodes have: "
        f"{largest}. Choose a smaller instance_type, drop SHOAL_RAY_RESOURCES, or add a node "
        "that has them", job=job)


def check_placeable(job: str, demand: Mapping[str, float], hosts: int,
                    nodes: list[Mapping[str, float]]) -> None:
    """Refuse a job of *hosts* hosts the alive nodes could never hold together (one *demand*
    each; several may share a node)."""
    check_feasible(job, demand, nodes)
    room = sum(int(min(node.get(k, 0.0) / v for k, v in demand.items() if v > 0))
               for node in nodes)
    if room >= hosts:
        return
    asked = ", ".join(f"{k}={v:g}" for k, v in sorted(demand.items()))
    raise ResourceUnavailableError(
        f"job {job!r} asks for {hosts} hosts of {asked} each, and the Ray cluster's "
        f"{len(nodes)} alive node(s) hold at most {room} of them together. Lower "
        "instance_count, choose a smaller instance_type, or add nodes", job=job)


class RayBackend:
    """Launches each job's supervisor on a Ray cluster (``SHOAL_BACKEND=ray``).

    Args:
        address: ``auto``, ``host:6379`` or ``ray://host:10001`` (Ray client).
        resources: custom Ray resources every job asks for (``{"gpu-pool": 1}``).
        namespace: the Ray namespace of the jobs' actors.
        auth_token_file: the cluster's token (Ray's token authentication), if it has one.
    """

    name = "ray"

    def __init__(self, address: str = "auto", *, resources: Mapping[str, float] | None = None,
                 namespace: str = "shoal", auth_token_file: str | None = None) -> None:
        self._address = address or "auto"
        self._token_file = auth_token_file
        self._resources = dict(resources or {})
        self._namespace = namespace
        self._lock = threading.Lock()
        self._actor_cls: Any = None
        self._warm: WarmPools | None = None  # on first use
        self._code: str | None = None
        self._nodes_cache: tuple[float, list[dict[str, Any]]] | None = None

    # --- connecting -------------------------------------------------------------------

    def _ray(self) -> Any:
        require("ray", "the ray backend (SHOAL_BACKEND=ray)", "ray")
        import ray

        with self._lock:
            if not ray.is_initialized():
                if self._token_file:
                    _use_token(self._token_file)
                probe_address(self._address)  # a head that is down: say so in seconds
                outlive_head()
                try:
                    self._connect(ray)
                except (ConnectionError, RuntimeError, ValueError) as e:
                    raise BackendUnavailableError(
                        f"cannot connect to the Ray cluster at {self._address!r}: {e}. "
                        f"{_connect_hint(self._address, self._token_file)}",
                        address=self._address) from e
            if self._actor_cls is None:
                self._actor_cls = ray.remote(_SupervisorHost)
        return ray

    def _connect(self, ray: Any) -> None:
        """``ray.init`` on the session's address: never start a cluster here (the address is
        always given), never take over the client's logging, and keep the nodes' output out
        of the notebook. Over Ray Client, the head's per-client server sometimes dies as it
        forks (a gRPC race in Ray's proxier, ray-project/ray#63202: ~7% of connections, more
        under load); that connection is tried again, a few times."""
        for attempt in range(1, _CLIENT_SERVER_TRIES + 1):
            try:
                ray.init(address=self._address, log_to_driver=False,
                         configure_logging=False, logging_level=logging.WARNING)
                return
            except ConnectionError as e:
                if attempt == _CLIENT_SERVER_TRIES or _CLIENT_SERVER_DIED not in str(e):
                    raise
                logger.warning("Ray Client at %s: its server for this connection died as it "
                               "started (ray-project/ray#63202); connecting again (%d/%d)",
                               self._address, attempt + 1, _CLIENT_SERVER_TRIES)
                with contextlib.suppress(Exception):
                    ray.shutdown()

    def alive_nodes(self) -> int:
        return len(self._nodes())

    def check_submission(self, env: Mapping[str, str]) -> None:
        """Before a job is recorded: its stores must be reachable from every node."""
        nodes = self._nodes()
        check_shared_stores(env, len(nodes), _addresses(nodes))

    # --- launching --------------------------------------------------------------------

    def launch(self, ctx: ExecContext) -> LaunchInfo:
        ray = self._ray()
        nodes = self._nodes()
        check_shared_stores(ctx.env, len(nodes), _addresses(nodes))
        demand = self._demand(ctx)
        check_feasible(ctx.job, demand, [n.get("Resources") or {} for n in nodes])
        if ctx.hosts > 1:
            return self._launch_placed(ctx, demand, nodes)
        if ctx.pool and ctx.keep_alive_seconds > 0:
            return self._launch_warm(ctx, demand)
        self._warm_pools().make_room(demand)  # idle warm actors never make a job wait
        actor = _actor_name(ctx.job)
        options: dict[str, Any] = {
            "name": actor, "namespace": self._namespace, "lifetime": "detached",
            "max_restarts": 0, **_actor_resources(demand)}
        try:
            started = self._actor_cls.options(**options).remote(
                ctx.job, ctx.entrypoint, list(ctx.args), dict(ctx.env), ctx.cwd)
        except (ValueError, TypeError) as e:  # a duplicate name, or invalid resources
            raise LaunchError(f"Ray refused the supervisor of job {ctx.job!r}: {e}",
                              job=ctx.job) from e
        except ray.exceptions.RayError as e:
            raise LaunchError(f"cannot start the supervisor of job {ctx.job!r} on Ray: {e}",
                              job=ctx.job) from e
        # The actor may wait for resources: the pid and node are known only once it runs.
        return LaunchInfo("ray", 0, "", extra={"actor": actor, "namespace": self._namespace,
                                              "address": self._address,
                                              **_actor_id_of(started)})

    def _launch_placed(self, ctx: ExecContext, demand: dict[str, float],
                       nodes: list[dict[str, Any]]) -> LaunchInfo:
        """A job on several hosts: a placement group of one bundle per host, on as many nodes
        (``STRICT_SPREAD``) when the cluster has them, else spread as far as it goes. The
        supervisor runs in bundle 0; the other hosts' ranks start in theirs
        (``_rayhost.py``). The group ends with the supervisor's actor."""
        ray = self._ray()
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        shapes = [n.get("Resources") or {} for n in nodes]
        check_placeable(ctx.job, demand, ctx.hosts, shapes)
        holding = sum(1 for n in shapes if all(n.get(k, 0.0) >= v for k, v in demand.items()))
        strategy = "STRICT_SPREAD" if holding >= ctx.hosts else "SPREAD"
        self._warm_pools().make_room({k: v * ctx.hosts for k, v in demand.items()})
        actor = _actor_name(ctx.job)
        try:
            group = placement_group([dict(demand) for _ in range(ctx.hosts)],
                                    strategy=strategy, name=actor, lifetime="detached")
        except (ValueError, TypeError) as e:
            raise LaunchError(f"Ray refused the placement group of job {ctx.job!r}: {e}",
                              job=ctx.job) from e
        placement = {"group": group.id.hex(), "namespace": self._namespace,
                     "bundle": _actor_resources(dict(demand))}
        options: dict[str, Any] = {
            "name": actor, "namespace": self._namespace, "lifetime": "detached",
            "max_restarts": 0, **_actor_resources(dict(demand)),
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=0)}
        try:
            started = self._actor_cls.options(**options).remote(
                ctx.job, ctx.entrypoint, list(ctx.args), dict(ctx.env), ctx.cwd, placement)
        except (ValueError, TypeError, ray.exceptions.RayError) as e:
            ray.util.remove_placement_group(group)
            raise LaunchError(f"cannot start the supervisor of job {ctx.job!r} on Ray: {e}",
                              job=ctx.job) from e
        return LaunchInfo("ray", 0, "", extra={"actor": actor, "namespace": self._namespace,
                                              "address": self._address,
                                              "placement_group": group.id.hex(),
                                              **_actor_id_of(started)})

    def _launch_warm(self, ctx: ExecContext, demand: dict[str, float]) -> LaunchInfo:
        """Hand the job (or batch) to a warm supervisor actor of its pool and shape
        (``_raywarm.py``), started on first use."""
        from shoal.backends._raywarm import warm_key

        pools = self._warm_pools()
        with self._lock:
            if self._code is None:
                from shoal.backends.local import _code_fingerprint

                self._code = _code_fingerprint()
        key = warm_key(ctx, demand, self._code)
        return pools.launch(ctx, key, _actor_resources(dict(demand)), demand)

    def _warm_pools(self) -> WarmPools:
        from shoal.backends._raywarm import WarmPools

        ray = self._ray()
        with self._lock:
            if self._warm is None:
                self._warm = WarmPools(ray, self._namespace, self._address)
            return self._warm

    def retire_warm(self) -> None:
        """Retire this client's idle warm supervisor actors now, freeing their resources
        (otherwise they retire after their keep-alive period)."""
        if self._warm is not None:
            self._warm.retire_all()

    def _nodes(self) -> list[dict[str, Any]]:
        """The alive nodes, listed at most once a second (a GCS round trip each time)."""
        now = time.monotonic()
        if self._nodes_cache is None or now - self._nodes_cache[0] > _NODES_TTL_S:
            nodes = [n for n in self._ray().nodes() if n.get("Alive")]
            self._nodes_cache = (now, nodes)
        return self._nodes_cache[1]

    def _demand(self, ctx: ExecContext) -> dict[str, float]:
        """What the job's actor reserves, in Ray's resource names."""
        demand: dict[str, float] = {"CPU": max(float(ctx.cpus), 1.0)}
        if ctx.gpus:
            demand["GPU"] = float(ctx.gpus)
        if ctx.memory_mib:
            demand["memory"] = float(int(ctx.memory_mib) * 1024 * 1024)
        demand.update(self._resources)
        return demand

    # --- observing and stopping -------------------------------------------------------

    def _actor(self, handle: Mapping[str, Any]) -> Any:
        """The job's actor while it is pending or alive; None once it has ended.
        BackendUnavailableError within seconds when the cluster does not answer."""
        ray = self._ray()

        def find() -> Any:
            try:
                return ray.get_actor(handle["actor"], namespace=handle.get("namespace"))
            except ValueError:  # a dead actor's name is released
                return None

        return bounded(self._address, f"whether supervisor {handle['actor']} lives", find)

    def is_alive(self, handle: Mapping[str, Any]) -> bool | None:
        if handle.get("backend") != "ray" or not handle.get("actor"):
            return None
        alive = self._actor(handle) is not None
        if not alive and handle.get("placement_group"):
            # A supervisor that never started, or died with its node, did not free its
            # hosts' reservation (a detached group outlives it): whoever finds it gone does.
            _remove_group(str(handle["placement_group"]))
        return alive

    def supervisor_loss(self, handle: Mapping[str, Any]) -> SupervisorLoss | None:
        """How a supervisor actor that is gone was lost, from Ray's actor table (its node
        and death cause) and node table: with its node (declared dead), or alone (its worker
        killed; the node lives). None when Ray cannot say (an actor recorded without its id
        and node, or Ray Client, which serves no actor table). BackendUnavailableError
        within seconds while the cluster does not answer."""
        if handle.get("backend") != "ray" or not handle.get("actor"):
            return None
        ray = self._ray()
        return bounded(self._address, f"how supervisor {handle['actor']} was lost",
                       lambda: _loss_of(ray, handle))

    def describe(self, handle: Mapping[str, Any], timeout: float = 5.0) -> dict[str, Any] | None:
        """Where the supervisor runs (``node_id``, ``host``, ``pid``), once it has started."""
        actor = self._actor(handle)
        if actor is None:
            return None
        ray = self._ray()
        try:
            return dict(ray.get(actor.info.remote(), timeout=timeout))
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError):
            return None

    def signal_stop(self, handle: Mapping[str, Any]) -> None:
        """SIGTERM to the supervisor on its node (it stops the job within its grace period);
        an actor that does not answer (still waiting for resources) is killed instead."""
        actor = self._actor(handle)
        if actor is None:
            return
        ray = self._ray()
        try:
            ray.get(actor.signal.remote(int(signal.SIGTERM)), timeout=_STOP_CALL_TIMEOUT_S)
        except ray.exceptions.RayActorError:
            return  # it ended meanwhile
        except ray.exceptions.GetTimeoutError:
            logger.warning("the supervisor actor %s did not answer within %.0f s; killing it",
                           handle["actor"], _STOP_CALL_TIMEOUT_S)
            ray.kill(actor, no_restart=True)
            if handle.get("placement_group"):
                _remove_group(handle["placement_group"])

    def close(self) -> None:
        """Nothing to release: the jobs' actors are detached on purpose, and the Ray
        connection may be shared with the caller's own Ray code."""


def _connect_hint(address: str, token_file: str | None) -> str:
    if not address.startswith("ray://"):
        return "Start one with 'shoal ray up', or set SHOAL_RAY_ADDRESS to its address"
    token = f"the token in {token_file}" if token_file else "no token (none was found)"
    return ("A ray:// address needs the head's Ray Client server listening there ('shoal ray "
            "up' prints its address; 'ray start --head --ray-client-server-port PORT') and, "
            "on a cluster with token authentication, its token in SHOAL_RAY_AUTH_TOKEN_FILE "
            f"(this client used {token})")


def _use_token(path: str) -> None:
    """Token authentication for this process's connection: Ray reads it from the environment
    only (as its own ``ray.init`` does when it finds a token)."""
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN_PATH"] = path
    with contextlib.suppress(ImportError, AttributeError):
        # Re-read the environment if ray was imported already, and drop the token Ray
        # cached: a process that connected to another cluster before (then ray.shutdown)
        # would send that cluster's token ("InvalidAuthToken"). In this order, as Ray's own
        # reset_auth_token_state does. Neither name is in ray's stubs:
        from ray._raylet import (  # type: ignore[attr-defined]
            AuthenticationTokenLoader,
            Config,
        )

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()


def _actor_id_of(actor: Any) -> dict[str, str]:
    """``{"actor_id": HEX}`` of a just-created actor (what Ray's actor table is read by once
    the actor is gone and its name released); empty where Ray does not say (Ray Client)."""
    actor_id = getattr(actor, "_actor_id", None)
    return {"actor_id": actor_id.hex()} if actor_id is not None else {}


def _loss_of(ray: Any, handle: Mapping[str, Any]) -> SupervisorLoss | None:
    """See ``RayBackend.supervisor_loss``."""
    from shoal.backends._raywarm import _over_client

    info: dict[str, Any] = {}
    if handle.get("actor_id") and not _over_client(ray):
        with contextlib.suppress(ImportError, AttributeError, ValueError):
            from ray._private.state import actors

            info = dict(actors(actor_id=str(handle["actor_id"])) or {})
    node = str((info.get("Address") or {}).get("NodeID") or handle.get("node_id") or "")
    if not node.strip("0"):  # never placed (Ray's nil id), or not known
        return None
    died = None
    cause = info.get("DeathCause")
    if cause is not None and cause.WhichOneof("context") == "actor_died_error_context":
        died = cause.actor_died_error_context
    entry: dict[str, Any] = next((n for n in ray.nodes() if n.get("NodeID") == node), {})
    ip = entry.get("NodeManagerAddress") or (died.node_ip_address if died else "")
    where = f"node {node}" + (f" ({ip})" if ip else "")
    node_died = died is not None and died.reason == died.NODE_DIED
    node_lost = node_died or not entry.get("Alive", False)
    detail = ""
    if died is not None:
        detail = (died.node_death_info.reason_message if node_died else "") \
            or died.error_message.split("\n", 1)[0]
    return SupervisorLoss(node_lost=node_lost, where=where, detail=detail.strip().rstrip("."))


def _remove_group(hex_id: str) -> None:
    """Free a job's placement group (and whatever still runs in it)."""
    import ray

    with contextlib.suppress(Exception):  # removed already
        ray.util.remove_placement_group(placement_group_by_id(hex_id))


def _actor_resources(demand: dict[str, float]) -> dict[str, Any]:
    """Ray's actor options for a demand in Ray's resource names."""
    options: dict[str, Any] = {"num_cpus": demand.pop("CPU"), "num_gpus": demand.pop("GPU", 0)}
    if "memory" in demand:
        options["memory"] = demand.pop("memory")
    if demand:
        options["resources"] = demand
    return options


def _addresses(nodes: list[dict[str, Any]]) -> list[str]:
    return [str(n.get("NodeManagerAddress") or "") for n in nodes]


def _actor_name(job: str) -> str:
    return f"shoal-{job}"


# --- on the node ------------------------------------------------------------------------


class _SupervisorHost:
    """The actor that holds a job's resources and runs its supervisor (wrapped by
    ``ray.remote`` in the client; instantiated on the node)."""

    def __init__(self, job: str, entrypoint: str, args: list[str], env: dict[str, str],
                 cwd: str | None, placement: dict[str, Any] | None = None) -> None:
        import ray

        context = ray.get_runtime_context()
        self._node_id = context.get_node_id()
        self._group = placement["group"] if placement else None
        env = node_env(env, os.environ)
        env["SHOAL_RAY_NODE_ID"] = self._node_id  # the job can tell where it ran
        if placement:  # the other hosts' ranks start in the group's other bundles
            env[PLACEMENT_VAR] = json.dumps({**placement, "gcs": context.gcs_address})
            env[RANK_HOST_LAUNCHER] = "shoal.backends._rayhost"
            env[RANK_MASTER_ADDR] = ray.util.get_node_ip_address()
            # The hosts' launchers connect to the cluster as this worker does.
            env.update({k: v for k, v in os.environ.items() if k.startswith("RAY_AUTH")})
        log_path = Path(env["SHOAL_HOME"]) / "run" / "supervisors" / f"{job}.log"
        # Started from this (the worker's main) thread: PR_SET_PDEATHSIG follows it.
        self._proc = start_supervisor(entrypoint, args, env, cwd, log_path)
        self._log = str(log_path)
        threading.Thread(target=self._end_with_supervisor, daemon=True,
                         name="shoal-supervisor-watch").start()

    def _end_with_supervisor(self) -> None:
        import ray

        self._proc.wait()
        # The job is over (its end state is in the store): free the node's resources.
        if self._group:
            # Not from here: this actor holds a bundle of the group, and a removal asked for
            # by one of the group's own actors, which the removal kills, was seen to take
            # ~30 s now and then under load (the group and this actor outliving the job). A
            # zero-CPU task outside the group asks; the removal ends this actor meanwhile.
            remover = ray.remote(_remove_group).options(
                num_cpus=0, max_retries=1, scheduling_strategy="DEFAULT").remote(self._group)
            with contextlib.suppress(Exception):  # gone with the group, or the cluster away
                ray.get(remover, timeout=_GROUP_REMOVAL_TIMEOUT_S)
        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)

    def info(self) -> dict[str, Any]:
        return {"node_id": self._node_id, "host": socket.gethostname(),
                "pid": self._proc.pid, "log": self._log}

    def poll(self) -> int | None:
        return self._proc.poll()

    def signal(self, signum: int) -> bool:
        if self._proc.poll() is not None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._proc.pid, signum)
        return True
