"""Endpoints on Ray Serve (``RayServeEndpoints``, the ``EndpointBackend`` that ``Session``
chooses when its backend is Ray).

The client ships the model through the artifact store (a local directory or file is uploaded
under ``endpoints/<name>/model/``; a URL is used as it is), then runs one Serve application
per endpoint (``shoal-<name>``, route prefix ``/endpoints/<name>``) whose deployment has
``initial_instance_count`` replicas (or Serve's autoscaling between the
``managed_instance_scaling`` bounds). Each replica (``EndpointReplica``) stages the model on
its node and hosts the model server's own ASGI app (``shoal.serving.create_app``, or the LLM
server's for a ``serving.properties`` directory): same handlers, batching and routes. It
starts the app's lifespan and waits for the model in its constructor, so a model that cannot
load fails the replica with the reason, and Serve fails the application with it.

The Serve controller keeps the replicas running, so no shoal supervisor is needed; the
endpoint's record follows the application: ``refresh`` (on every read of the record, as for
supervised endpoints) tells the endpoint service that it runs (Creating -> InService, with
the proxies' addresses), failed (with Serve's message) or is gone. ``delete`` deletes the
application.

A team server's endpoints (``replica_access``, from ``server/_endpoint_runtime.py``) give their
replicas no store settings or credentials: they fetch the model, code and requirements, and
upload their logs, through the server with a replica token (``_replica_store.py``), and the
deploy checks that the nodes can reach the server instead of the stores.

``ray`` is imported inside the functions only.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import traceback
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any, Protocol

from shoal.core.endpoints import (
    EndpointConfig,
    EndpointRecord,
    ReplicaAccessFor,
    RuntimeState,
    RuntimeView,
    endpoint_key,
)
from shoal.core.ports import ArtifactStore
from shoal.core.resources import resolve_instance_type
from shoal.endpoints._staging import ship_model
from shoal.errors import BackendUnavailableError, InvalidArgumentError, ModelLoadError

__all__ = ["BACKEND", "EndpointReplica", "RayServeEndpoints", "deployment_options",
           "is_serve", "replica_env"]

BACKEND = "ray-serve"
#: The deployment's name inside each endpoint's application.
DEPLOYMENT = "model"
#: Client variables that mean nothing on a node (the node's own win), as for Ray jobs.
_MACHINE_VARS = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "TMPDIR", "VIRTUAL_ENV",
                           "PYTHONHOME", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "PWD",
                           "PYTHONPATH"})
#: Requests a replica accepts at once: the model server queues and batches them itself.
_MAX_ONGOING = 256
#: Serve loads it by this path, in the proxy.
_ROUTER = "shoal.endpoints._ray_router:SpreadRouter"
#: A replica whose constructor fails this many times fails the application.
_CONSTRUCTOR_RETRIES = 3

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def app_name(endpoint: str) -> str:
    return f"shoal-{endpoint}"


def route_prefix(endpoint: str) -> str:
    return f"/endpoints/{endpoint}"


def is_serve(record: EndpointRecord) -> bool:
    return record.supervisor.get("backend") == BACKEND


# --- the client's side -------------------------------------------------------------------


class RayJobs(Protocol):
    """What Ray Serve endpoints need of the session's Ray backend."""

    def alive_nodes(self) -> int: ...
    def check_submission(self, env: Mapping[str, str]) -> None: ...


def _serve() -> Any:
    """``ray.serve``, imported without its import-time deprecation warnings (pydantic's, from
    Ray's own schemas: nothing a shoal user can act on)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from ray import serve
        from ray.serve import api, context  # noqa: F401 - loaded here, under the filter

    return serve


def replica_env(client_env: Mapping[str, str], config: EndpointConfig) -> dict[str, str]:
    """The replicas' environment: the client's (cloud credentials, store endpoints), less
    shoal's settings, Ray's own and machine-specific variables (``XDG_*`` too: the client's
    config directory is not the node's; and, for a team server's
    endpoints, less every credential: the nodes' own then read the model), plus the model's
    ``env``."""
    env = {k: v for k, v in client_env.items()
           if k not in _MACHINE_VARS and not k.startswith(("SHOAL_", "RAY_", "XDG_"))}
    if client_env.get("SHOAL_ENDPOINT_CREDENTIALS") == "withhold":  # a team server's
        from shoal.core.secrets import without_credentials

        env = without_credentials(env)
    env.update(config.env)
    if config.entry_point:
        env.setdefault("SAGEMAKER_PROGRAM", "inference.py")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def deployment_options(config: EndpointConfig, env: Mapping[str, str], *,
                       spread: bool = True) -> dict[str, Any]:
    """Serve deployment options for *config*: replicas (or autoscaling bounds) and what each
    replica reserves (its instance type, as for jobs: ``local`` reserves one CPU). *spread*
    (one proxy, on the head) routes over every replica rather than the proxy's node's first
    (``_ray_router.SpreadRouter``)."""
    itype = resolve_instance_type(config.instance_type)
    actor: dict[str, Any] = {"num_cpus": float(itype.cpus or 1),
                             "runtime_env": {"env_vars": dict(env)}}
    if itype.gpus:
        actor["num_gpus"] = float(itype.gpus)
    if itype.memory_gib:
        actor["memory"] = int(itype.memory_gib * 1024 ** 3)
    options: dict[str, Any] = {"name": DEPLOYMENT, "ray_actor_options": actor,
                               "max_ongoing_requests": _MAX_ONGOING,
                               "max_constructor_retry_count": _CONSTRUCTOR_RETRIES}
    if spread:
        options["request_router_config"] = {"request_router_class": _ROUTER}
    if config.min_instances is not None:
        options["autoscaling_config"] = {"min_replicas": config.min_instances,
                                         "max_replicas": config.max_instances,
                                         "initial_replicas": config.instance_count}
    else:
        options["num_replicas"] = config.instance_count
    return options


def check_config(config: EndpointConfig) -> None:
    """Refuse, before anything is recorded, what Ray Serve endpoints cannot do yet."""
    if config.port is not None:
        raise InvalidArgumentError(
            "port= fixes a local model server's port; on Ray Serve every endpoint answers on "
            "Serve's HTTP proxy (SHOAL_RAY_SERVE_PORT) under /endpoints/<name>",
            argument="port")


def _serve_details(ray: Any) -> dict[str, Any]:
    """Serve's own view of the cluster (HTTP options, proxies, applications); {} when Serve
    is not running. ``serve.status()`` omits the HTTP address, hence the controller's
    details (what Serve's dashboard shows)."""
    _serve()
    from ray.serve.context import _get_global_client

    client = _get_global_client(raise_if_no_controller_running=False)
    return dict(client.get_serve_details()) if client is not None else {}


def _text(value: Any) -> str:
    """A status from Serve's details: an enum member or its value."""
    return str(getattr(value, "value", value))


def _addresses(ray: Any, details: Mapping[str, Any]) -> list[tuple[str, int]]:
    http = details.get("http_options") or {}
    host, port = str(http.get("host") or "127.0.0.1"), int(http.get("port") or 8000)
    proxies = details.get("proxies") or {}
    hosts = []
    for proxy in proxies.values():
        if _text(proxy.get("status")) != "HEALTHY":
            continue
        node_ip = str(proxy.get("node_ip") or host)
        hosts.append(node_ip if host in ("0.0.0.0", "::") else host)
    return [(h, port) for h in sorted(set(hosts))] or [(host, port)]


def _app_message(app: Mapping[str, Any]) -> str:
    """Serve's reason, shortened to what a person acts on: its first line and the replica's
    own traceback (the innermost one; the outer ones are Ray's plumbing)."""
    import re

    texts = [str(app.get("message") or "")]
    texts += [str(d.get("message") or "") for d in (app.get("deployments") or {}).values()]
    text = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(t for t in texts if t.strip()))
    marker = "Traceback (most recent call last):"
    head = [line for line in text.splitlines()[:3] if line.strip() and marker not in line]
    reason = "Ray Serve could not start the endpoint's replicas"
    if marker not in text:
        return f"{reason}: {text.strip() or 'no reason given'}"
    summary = " ".join(line.strip() for line in head if "failed to start" in line)
    trace = text[text.rindex(marker):].strip()
    return f"{reason}{f' ({summary})' if summary else ''}:\n{trace}"


class RayServeEndpoints:
    """The ``EndpointBackend`` of endpoints on Ray Serve: one application per endpoint, on
    the cluster of the session's Ray backend (*backend*); *env* is the client's environment
    (the replicas get it, less what is machine-specific) and *home* its shoal home. Serve's
    HTTP proxies run where *proxy_location* says and listen on *host*:*port*
    (``SHOAL_RAY_SERVE_*``); a replica re-resolves a model's requirements after
    *resolve_ttl_s* (``SHOAL_ENV_RESOLVE_TTL_SECONDS``). *replica_access* (a team server's):
    the replicas reach their endpoint's files through the server (see module)."""

    def __init__(self, backend: RayJobs, artifacts: ArtifactStore, *, env: Mapping[str, str],
                 home: Path | str, proxy_location: str, host: str, port: int,
                 resolve_ttl_s: float, replica_access: ReplicaAccessFor | None = None) -> None:
        self._backend = backend
        self._artifacts = artifacts
        self._env = dict(env)
        self._home = Path(home)
        self._proxy_location = proxy_location
        self._http = {"host": host, "port": port}
        self._resolve_ttl_s = resolve_ttl_s
        self._access = replica_access

    def _ray(self) -> Any:
        """The ray module, connected to the session's cluster (through its backend)."""
        self._backend.alive_nodes()  # connects (token auth included) or says why it cannot
        import ray

        return ray

    def owns(self, handle: Mapping[str, Any]) -> bool:
        return handle.get("backend") == BACKEND

    def check(self, config: EndpointConfig) -> None:
        check_config(config)

    def deploy(self, name: str, *, model_data: str, config: EndpointConfig,
               code_key: str | None, requirements_key: str | None) -> Mapping[str, Any]:
        """Run the endpoint's Serve application (without waiting for it)."""
        env = self._env
        ray = self._ray()
        files = self._files(name, model_data, code_key, requirements_key)
        serve = _serve()
        from ray.serve.api import RunTarget

        spec = {"endpoint": name, **files,
                "batching": config.batching.to_json() if config.batching else None,
                "startup_timeout_s": config.startup_timeout_s,
                "home": str(self._home),
                "resolve_ttl_s": self._resolve_ttl_s}
        try:
            serve.start(proxy_location=self._proxy_location, http_options=dict(self._http))
            ingress = serve.ingress()(EndpointReplica)
            options = deployment_options(
                config, replica_env(env, config),
                spread=self._proxy_location == "HeadOnly")
            deployment = serve.deployment(**options)(ingress)
            serve.run_many([RunTarget(deployment.bind(spec), name=app_name(name),
                                      route_prefix=route_prefix(name))],
                           wait_for_ingress_deployment_creation=False,
                           wait_for_applications_running=False)
        except (ray.exceptions.RayError, RuntimeError, ValueError) as e:
            raise BackendUnavailableError(f"Ray Serve refused endpoint {name!r}: {e}",
                                          endpoint=name) from e
        return {"backend": BACKEND, "application": app_name(name),
                "route_prefix": route_prefix(name), "pid": 0}

    def _files(self, name: str, model_data: str, code_key: str | None,
               requirements_key: str | None) -> dict[str, Any]:
        """Where the replicas find the endpoint's files: the artifact store's URLs (after a
        check that every node reaches the store), or, for a team server's endpoint, the
        server and the keys (after a check that every node reaches the server)."""
        if self._access is not None:
            access = self._access(name, model_data)
            self._backend.check_submission({"SHOAL_SERVER_URL": access.url})
            return {"server": {"url": access.url, "token": access.token},
                    "model_key": access.model_key, "code_key": code_key,
                    "requirements_key": requirements_key,
                    "logs_key": endpoint_key(name, "logs")}
        artifacts = self._artifacts
        self._backend.check_submission(self._env)  # the replicas read the model from the store
        return {"model_uri": ship_model(artifacts, name, model_data),
                "code_uri": artifacts.uri(code_key) if code_key else None,
                "requirements_uri": artifacts.uri(requirements_key) if requirements_key
                else None,
                "logs_uri": artifacts.uri(endpoint_key(name, "logs"))}

    def refresh(self, record: EndpointRecord) -> RuntimeView:
        """What the endpoint's Serve application says: running (with the proxies'
        addresses), failed (with Serve's message) or gone."""
        try:
            ray = self._ray()
        except BackendUnavailableError:
            return RuntimeView(RuntimeState.UNCHANGED)  # the cluster is out of reach
        details = _serve_details(ray)
        application = record.supervisor.get("application")
        app = (details.get("applications") or {}).get(application)
        if app is None:
            return RuntimeView(RuntimeState.GONE, reason=(
                f"its Ray Serve application {application!r} is gone (the cluster restarted, "
                "or it was deleted outside shoal)"))
        status = _text(app.get("status"))
        if status == "DEPLOY_FAILED":
            return RuntimeView(RuntimeState.FAILED, reason=_app_message(app))
        if status == "RUNNING":
            return RuntimeView(RuntimeState.READY, addresses=tuple(_addresses(ray, details)))
        return RuntimeView(RuntimeState.UNCHANGED)

    def delete(self, record: EndpointRecord, *, timeout: float) -> None:
        """Delete the endpoint's Serve application (waits until its replicas are gone)."""
        ray = self._ray()
        serve = _serve()
        try:
            serve.delete(str(record.supervisor.get("application")), _blocking=True)
        except ray.exceptions.RayError as e:
            raise BackendUnavailableError(f"cannot delete the Ray Serve application of "
                                          f"endpoint {record.name!r}: {e}",
                                          endpoint=record.name) from e


# --- on the replica ----------------------------------------------------------------------


class _Lifespan:
    """Drives an ASGI app's lifespan (startup now, shutdown later) on the current loop."""

    def __init__(self, app: Any) -> None:
        self._app = app
        self._inbox: asyncio.Queue[Message] = asyncio.Queue()
        self._outbox: asyncio.Queue[Message] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def _send(self, message: Message) -> None:
        await self._outbox.put(message)

    async def startup(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"},
                 "state": {}}
        self._task = asyncio.ensure_future(self._app(scope, self._inbox.get, self._send))
        await self._inbox.put({"type": "lifespan.startup"})
        answer = await self._outbox.get()
        if answer["type"] != "lifespan.startup.complete":
            raise ModelLoadError(f"the model server did not start: {answer.get('message')}")

    async def shutdown(self) -> None:
        if self._task is None or self._task.done():
            return
        await self._inbox.put({"type": "lifespan.shutdown"})
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._outbox.get(), 30)


class _ReplicaLog:
    """The replica's own log (shoal's loggers, from its start), kept as the local backend
    keeps an instance's: uploaded to ``endpoints/<name>/logs/replica-<id>.log`` when the
    replica stops or fails to start, with the output of the model server in the model's own
    environment appended."""

    def __init__(self, root: Path, spec: Mapping[str, Any]) -> None:
        import logging

        from shoal.endpoints._replica_store import log_writer

        self._path = root / "replica.log"
        self._write = log_writer(spec)
        self._handler = logging.FileHandler(self._path)
        self._handler.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self._logger = logging.getLogger("shoal")
        self._logger.addHandler(self._handler)
        if self._logger.level == logging.NOTSET or self._logger.level > logging.INFO:
            self._logger.setLevel(logging.INFO)
        self._logger.info("replica %s started on node %s", _replica_id(), _node_id())

    def note(self, text: str) -> None:
        self._logger.error("%s", text)

    def upload(self, server: Any) -> None:
        """Write the log to the store (once; a store failure is only noted in Ray's log)."""
        import logging

        self._logger.removeHandler(self._handler)
        self._handler.close()
        if self._write is None:
            return
        try:
            data = self._path.read_bytes() if self._path.exists() else b""
            if server is not None and server.log.exists():
                data += b"\n--- the model server in the model's own environment ---\n"
                data += server.log.read_bytes()
            self._write(f"replica-{_replica_id()}.log", data)
        except Exception as e:  # the replica's end must not fail on its log
            logging.getLogger(__name__).warning("could not upload the replica's log: %s", e)


def _replica_id() -> str:
    with contextlib.suppress(Exception):
        from ray import serve

        return str(serve.get_replica_context().replica_id.unique_id)
    return "unknown"


def _node_id() -> str:
    with contextlib.suppress(Exception):
        import ray

        return str(ray.get_runtime_context().get_node_id())
    return "unknown"


class _ServerLifespan:
    """Serve's shutdown of a replica that forwards to a model server process: stop it."""

    def __init__(self, server: Any, forward: Any) -> None:
        self._server = server
        self._forward = forward

    async def shutdown(self) -> None:
        await self._forward.aclose()
        await asyncio.to_thread(self._server.stop)


def _fetch(uri: str, target: Path) -> None:
    import fsspec.core

    fs, path = fsspec.core.url_to_fs(uri)
    fs.get(path, str(target))


def _stage(spec: Mapping[str, Any], root: Path) -> Path:
    from shoal.endpoints._staging import stage_model

    code = None
    if spec.get("code_uri"):
        code = root / "code.tar.gz"
        _fetch(str(spec["code_uri"]), code)
    return stage_model(str(spec["model_uri"]), root / "model", code_archive=code)


def _build_app(model_dir: Path, spec: Mapping[str, Any]) -> Any:
    """The model server's ASGI app for *model_dir* (the LLM server's for an LLM)."""
    from shoal.config import shoal_environ
    from shoal.serving import ServerOptions, create_app

    batching = spec.get("batching") or {}
    options = ServerOptions.from_env(shoal_environ(),
                                     max_batch_size=batching.get("max_batch_size"),
                                     max_batch_delay_ms=batching.get("max_batch_delay_ms"))
    if (model_dir / "serving.properties").is_file():
        return _llm_app(model_dir, options)
    return create_app(model_dir, options=options)


def _llm_app(model_dir: Path, options: Any) -> Any:
    """The LLM server's app for a ``serving.properties`` directory, as ``python -m
    shoal.serving`` builds it. shoal.llm sits above the endpoints: its modules are found by
    dotted path, as the model server finds them."""
    import importlib

    from shoal.config import djl_environ

    llm_serving = importlib.import_module("shoal.llm.serving")
    llm = llm_serving.load_serving_options(llm_serving.find_properties(model_dir),
                                           djl_environ())
    if not llm.entry_point:
        return llm_serving.LlmServerApp(llm, options)
    llm_serving.check_entry_point(llm)  # a missing or handler-less file fails here, as in serve()
    return llm_serving.entry_point_app(llm, options, None)


class EndpointReplica:
    """One Serve replica of an endpoint (wrapped by ``serve.ingress()`` in the client): stage
    the model, build the model server's app, start it and wait for the model; then Serve
    sends it the HTTP requests under the endpoint's route prefix."""

    async def __init__(self, spec: Mapping[str, Any]) -> None:  # type: ignore[misc]  # Serve awaits an async __init__
        from shoal.endpoints._replica_env import wanted_requirements
        from shoal.endpoints._replica_store import fetch_through_server, through_server

        self._root = Path(tempfile.mkdtemp(prefix="shoal-replica-"))
        self._server: Any = None  # the model server in the model's own environment
        self._lifespan: _Lifespan | _ServerLifespan  # set by the start that succeeds
        self._logs = _ReplicaLog(self._root, spec)
        timeout = float(spec.get("startup_timeout_s") or 600)
        try:
            if through_server(spec):  # a team server's: its files come through the server
                spec = await asyncio.to_thread(fetch_through_server, spec, self._root)
            model_dir = await asyncio.to_thread(_stage, spec, self._root)
            wanted = await asyncio.to_thread(wanted_requirements, spec, model_dir)
            if wanted:
                await self._start_server(spec, model_dir, wanted, timeout)
                return
            self._app = await asyncio.to_thread(_build_app, model_dir, spec)
            self._lifespan = lifespan = _Lifespan(self._app)
            await lifespan.startup()
            await self._wait_loaded(timeout)
        except BaseException as e:
            if self._server is not None:
                self._server.stop()
            self._logs.note(f"the replica failed to start: {type(e).__name__}: {e}")
            self._logs.upload(self._server)
            shutil.rmtree(self._root, ignore_errors=True)
            raise

    async def _start_server(self, spec: Mapping[str, Any], model_dir: Path,
                            wanted: list[str], timeout: float) -> None:
        """The model has its own environment: serve it from a model server in it, and
        forward to that (``_replica_env``)."""
        from shoal.endpoints._replica_env import Forward, ServerProcess

        # The build runs on a thread; the server starts from this (the replica's loop)
        # thread, which lives as long as the replica (PR_SET_PDEATHSIG follows it).
        self._server = await asyncio.to_thread(ServerProcess.build, spec, model_dir,
                                               self._root, wanted)
        self._server.start()
        await self._server.wait_ready(timeout)
        forward = Forward(self._server.port, str(spec.get("endpoint") or ""))
        self._app = forward
        self._lifespan = _ServerLifespan(self._server, forward)

    async def _wait_loaded(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        delay = 0.01
        while str(self._app.state) == "loading":
            if loop.time() >= deadline:
                await self._lifespan.shutdown()
                raise ModelLoadError(f"the model did not load within {timeout:g} s "
                                     "(container_startup_health_check_timeout)")
            await asyncio.sleep(delay)  # the app loads on its own thread
            delay = min(delay * 2, 0.1)
        if str(self._app.state) != "ready":
            error = self._app.load_error
            await self._lifespan.shutdown()
            cause = error.__cause__ or error if error is not None else None
            trace = "".join(traceback.format_exception(cause)) if cause is not None else ""
            raise ModelLoadError(f"{error}\n{trace}".rstrip())

    def __serve_build_asgi_app__(self) -> Any:
        return _Mounted(self._app, self._lifespan, self._root,
                        lambda: self._logs.upload(self._server))

    async def check_health(self) -> None:
        if self._server is not None:
            if not self._server.alive():
                raise ModelLoadError(f"the model server exited with code "
                                     f"{self._server.proc.poll()}; its output ends with:\n"
                                     f"{self._server.tail()}")
            return
        if str(self._app.state) != "ready":
            raise ModelLoadError(f"the model is {self._app.state}: {self._app.load_error}")


class _Mounted:
    """The started app as Serve hosts it: requests arrive under the route prefix (stripped
    here, so the app sees ``/invocations``); Serve's own lifespan stops the app."""

    def __init__(self, app: Any, lifespan: Any, root: Path,
                 upload_logs: Callable[[], None] = lambda: None) -> None:
        self._app = app
        self._lifespan = lifespan
        self._root = root
        self._upload_logs = upload_logs

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._serve_lifespan(receive, send)
            return
        root = scope.get("root_path") or ""
        path = scope.get("path") or "/"
        if root and path.startswith(root):
            scope = dict(scope, path=path[len(root):] or "/", root_path="")
            raw, raw_root = scope.get("raw_path"), root.encode()
            if raw is not None:
                scope["raw_path"] = (raw[len(raw_root):] or b"/") if raw.startswith(
                    raw_root) else None
        await self._app(scope, receive, send)

    async def _serve_lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})  # started in __init__
            elif message["type"] == "lifespan.shutdown":
                await self._lifespan.shutdown()
                await asyncio.to_thread(self._upload_logs)
                shutil.rmtree(self._root, ignore_errors=True)
                await send({"type": "lifespan.shutdown.complete"})
                return
