"""Session: the one place where settings become stores, a backend and services.

Everything below receives its collaborators as arguments. ``current()`` is the default
session, created lazily; ``with shoal.use(session):`` overrides it for a block.

Example:
    >>> import shoal
    >>> s = shoal.Session(home="/tmp/shoal-doc")   # doctest: +SKIP
    >>> s.jobs.get("divide-241130-120000-ab12cd")  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal.errors import ConfigError

if TYPE_CHECKING:
    from shoal.client import ServerConnection
    from shoal.config import DefaultsConfig
    from shoal.core.endpoints import EndpointBackend, ReplicaAccessFor
    from shoal.core.ports import (
        ArtifactStore,
        Backend,
        EndpointStore,
        MetadataStore,
        RunStore,
        WarmWorkerEndpoint,
    )
    from shoal.envs import UvEnvBuilder
    from shoal.jobs.service import JobService
    from shoal.jobs.worker import WorkerContext

__all__ = ["PLACEHOLDER_ROLE", "Session", "current", "get_execution_role", "rank_host_main",
           "serve_warm_main", "supervisor_main", "use"]

logger = logging.getLogger(__name__)
_SUPERVISOR_ENTRY = "shoal.session:supervisor_main"
_SUPERVISOR_PREPARE = "shoal.session:warm_supervisor"
#: shoal.endpoints sits above the session: its endpoint backends are found by dotted path.
_SUPERVISED_ENDPOINTS = "shoal.endpoints:SupervisedEndpoints"
_RAY_SERVE_ENDPOINTS = "shoal.endpoints:RayServeEndpoints"
_PRELOAD = ("shoal.session", "shoal.jobs.driver", "shoal.jobs.worker", "shoal.storage.sql",
            "fsspec.implementations.local", "shoal.config:_settings_class",
            "shoal.serialization:warm_up")


class Session:
    """Settings, stores, backend and job service for one shoal installation; also what
    SageMaker code passes as ``sagemaker_session=`` (``sagemaker.Session``'s arguments and
    methods).

    Args:
        boto_session, sagemaker_client, sagemaker_runtime_client,
        sagemaker_featurestore_runtime_client, settings, sagemaker_metrics_client: SageMaker's
            AWS clients and session settings; kept, and reported once as having no effect
            (shoal calls no AWS API).
        default_bucket: the root ``default_bucket()`` returns and uploads use: an S3 bucket
            name or any fsspec URL (default: the config file's ``DefaultS3Bucket``, else the
            artifact store's root).
        sagemaker_config: a config dict (``shoal.config.load_sagemaker_config()``'s), used
            instead of reading the config files.
        default_bucket_prefix: a key prefix for uploads to the default bucket (default: the
            config file's ``DefaultS3ObjectKeyPrefix``).
        config_files: extra SageMaker-schema defaults files, highest precedence last.
        **options: any ``Settings`` field (``home``, ``metadata_url``, ``artifact_url``...).
    """

    def __init__(self, boto_session: object = None, sagemaker_client: object = None,
                 sagemaker_runtime_client: object = None,
                 sagemaker_featurestore_runtime_client: object = None,
                 default_bucket: str | None = None, settings: object = None,
                 sagemaker_metrics_client: object = None,
                 sagemaker_config: Mapping[str, Any] | None = None,
                 default_bucket_prefix: str | None = None, *,
                 config_files: Sequence[str | os.PathLike[str]] = (), **options: Any) -> None:
        from shoal.config import Settings

        self.settings = Settings(**options)
        self._config_files = tuple(Path(p) for p in config_files)
        self._default_bucket = default_bucket
        self._default_bucket_prefix = default_bucket_prefix
        self._sagemaker_config = sagemaker_config
        self._lock = threading.RLock()
        self._defaults: DefaultsConfig | None = None
        self._metadata: MetadataStore | None = None
        self._runs: RunStore | None = None
        self._server: ServerConnection | None = None
        #: A supervisor's session reads SHOAL_TOKEN per request: a warm supervisor's changes
        #: with each job handed to it (each job's own job token).
        self.token_from_environ = False
        self._artifacts: ArtifactStore | None = None
        self._backend: Backend | None = None
        self._jobs: JobService | None = None
        self._endpoint_backends: tuple[EndpointBackend, ...] | None = None
        self._endpoint_store: EndpointStore | None = None
        self._reported: set[str] = set()
        self.aws_clients = {k: v for k, v in (
            ("boto_session", boto_session), ("sagemaker_client", sagemaker_client),
            ("sagemaker_runtime_client", sagemaker_runtime_client),
            ("sagemaker_featurestore_runtime_client", sagemaker_featurestore_runtime_client),
            ("settings", settings), ("sagemaker_metrics_client", sagemaker_metrics_client))
            if v is not None}
        for name in self.aws_clients:
            _report_once(f"Session.{name}", f"Session({name}=...) has no effect here: shoal "
                         "calls no AWS API; it is kept as Session.aws_clients")
        self._home_checked = False

    # --- configuration ----------------------------------------------------------------

    @property
    def home(self) -> Path:
        return Path(self.settings.home)

    def _private_home(self) -> None:
        """Create the home 0700 (or warn once that an existing one is open to others)."""
        if not self._home_checked:
            from shoal._internal.private import private_home

            private_home(self.home)
            self._home_checked = True

    @property
    def defaults(self) -> DefaultsConfig:
        """The SageMaker-schema defaults (admin file < user file < extra files), or those of
        the ``sagemaker_config`` dict. Files are read again when one of them is created,
        changed or removed (as SageMaker reads them per session)."""
        with self._lock:
            if self._sagemaker_config is not None:
                if self._defaults is None:
                    from shoal.config import defaults_from_dict

                    self._defaults = defaults_from_dict(self._sagemaker_config,
                                                        "sagemaker_config")
                return self._defaults
            from shoal.config import load_defaults_cached

            files = [("admin", self.settings.admin_config_path()),
                     ("user", self.settings.user_config_path())]
            files += [("extra", p) for p in self._config_files]
            return load_defaults_cached(files)

    def report_inert(self, key: str, message: str) -> None:
        """Warn once per session about a setting that has no effect on this backend."""
        if key not in self._reported:
            self._reported.add(key)
            logger.warning(message)

    # --- collaborators ------------------------------------------------------------------

    @property
    def metadata(self) -> MetadataStore:
        self._refuse_through_server("the whole metadata store (users and tokens, 'shoal db')")
        with self._lock:
            if self._metadata is None:
                from shoal.storage.sql import SqlMetadataStore

                self._private_home()

                url = self.settings.resolved_metadata_url()
                # The embedded default creates its own database; a configured one is upgraded
                # explicitly with 'shoal db upgrade'.
                create = self.settings.metadata_url is None
                self._metadata = _tolerant(lambda: SqlMetadataStore.open(url, create=create),
                                           url, self.settings.store_outage_seconds)
            return self._metadata

    @property
    def runs(self) -> RunStore:
        """Experiments, runs and metrics: through the team server when ``SHOAL_SERVER_URL``
        is set (``SHOAL_TOKEN`` its token), else the metadata store."""
        if self.settings.server_url is None:
            return self.metadata
        with self._lock:
            if self._runs is None:
                from shoal.client import HttpRunStore

                self._runs = self._through_server(HttpRunStore(self.server_connection()))
            return self._runs

    def server_connection(self) -> ServerConnection:
        """The one pooled connection to ``SHOAL_SERVER_URL`` the session's HTTP stores share."""
        url = self.settings.server_url
        if url is None:
            raise ConfigError("SHOAL_SERVER_URL is not set: this session uses its own stores",
                              setting="SHOAL_SERVER_URL")
        with self._lock:
            if self._server is None:
                from shoal.client import ServerConnection

                if self.token_from_environ:
                    self._server = ServerConnection(url, lambda: os.environ.get("SHOAL_TOKEN"))
                else:
                    token = self.settings.token
                    self._server = ServerConnection(
                        url, None if token is None else token.get_secret_value())
            return self._server

    def _through_server(self, store: Any) -> Any:
        """*store* waiting out a server that does not answer (a restart) as it would a
        database outage, up to ``store_outage_seconds``."""
        from shoal.storage.outage import tolerant

        return tolerant(store, seconds=self.settings.store_outage_seconds,
                        shown=f"the shoal server at {self.settings.server_url}")

    def _refuse_through_server(self, what: str) -> None:
        if self.settings.server_url is not None:
            raise ConfigError(
                f"SHOAL_SERVER_URL is set ({self.settings.server_url}): through a team server "
                f"jobs, artifacts, experiments, runs, metrics and endpoints work; {what} "
                "through a server "
                "is not available yet (issue #20). Unset SHOAL_SERVER_URL to use this "
                "machine's own stores", setting="SHOAL_SERVER_URL",
                value=self.settings.server_url)

    @property
    def artifacts(self) -> ArtifactStore:
        with self._lock:
            if self._artifacts is None and self.settings.server_url is not None:
                from shoal.client import HttpArtifactStore

                self._artifacts = self._through_server(
                    HttpArtifactStore(self.server_connection()))
            if self._artifacts is None:
                from shoal.storage.artifacts import FsspecArtifactStore

                self._private_home()

                url = self.settings.resolved_artifact_url()
                store: ArtifactStore = FsspecArtifactStore.open(url)
                if store.local_path("probe") is None:  # an object store may be away a while
                    from shoal.storage.outage import tolerant

                    store = tolerant(store, seconds=self.settings.store_outage_seconds,
                                     shown=url)
                self._artifacts = store
            return self._artifacts

    @property
    def backend(self) -> Backend:
        with self._lock:
            if self._backend is None:
                self._private_home()
                self._backend = self._make_backend()
            return self._backend

    @property
    def backend_name(self) -> str:
        """The backend that runs this session's jobs (``local``, ``ray``): through a team
        server (``SHOAL_SERVER_URL``) the server's, asked once; else ``SHOAL_BACKEND``'s."""
        if self.settings.server_url is not None:
            return self.jobs.backend.name
        backend = self.settings.backend
        return "ray" if backend.startswith("ray://") else backend

    def _make_backend(self) -> Backend:
        import importlib

        from shoal.backends import backend_path

        backend = self.settings.backend
        module, _, cls = backend_path(backend).partition(":")
        impl: Callable[..., Backend] = getattr(importlib.import_module(module), cls)
        if backend == "local":
            return impl(self.home / "run", mode=self.settings.launch_mode,
                        idle_seconds=self.settings.launcher_idle_seconds, preload=_PRELOAD)
        if backend == "ray" or backend.startswith("ray://"):
            # SHOAL_BACKEND=ray://host:10001 names the cluster too; else SHOAL_RAY_ADDRESS.
            address = backend if backend.startswith("ray://") else self.settings.ray_address
            token = self.settings.ray_auth_token_file or self.home / "ray" / "auth_token"
            return impl(address, resources=self.settings.ray_resources,
                        namespace=self.settings.ray_namespace,
                        auth_token_file=str(token) if Path(token).exists() else None)
        raise ConfigError(f"backend {backend!r} has no wiring in Session", backend=backend)

    @property
    def jobs(self) -> JobService:
        """The JobService of this session."""
        with self._lock:
            if self._jobs is None and self.settings.server_url is not None:
                self._jobs = self._server_jobs()
            if self._jobs is None:
                from shoal.jobs.keys import UserKeys
                from shoal.jobs.service import JobService

                self._jobs = JobService(self.metadata, self.artifacts, self.backend,
                                        metrics=self.metadata,
                                        supervisor_entrypoint=_SUPERVISOR_ENTRY,
                                        supervisor_prepare=_SUPERVISOR_PREPARE,
                                        supervisor_env=self.supervisor_env(),
                                        keys=UserKeys(self.settings.user_secret_path()),
                                        wake_dir=Path(self.home) / "run" / "wake")
            return self._jobs

    def _server_jobs(self) -> JobService:
        """Jobs through the team server: its stores, backend, keys and wake-ups over HTTP."""
        from shoal.client import HttpBackend, HttpJobEnds, HttpJobKeys, HttpJobStore
        from shoal.jobs.service import JobService

        connection = self.server_connection()
        return JobService(self._through_server(HttpJobStore(connection)), self.artifacts,
                          HttpBackend(connection), metrics=self.runs,
                          supervisor_entrypoint=_SUPERVISOR_ENTRY,
                          supervisor_prepare=_SUPERVISOR_PREPARE,
                          supervisor_env=self.supervisor_env(), keys=HttpJobKeys(connection),
                          ends=HttpJobEnds(connection))

    @property
    def endpoint_store(self) -> EndpointStore:
        """Endpoint records: through the team server when ``SHOAL_SERVER_URL`` is set, else
        the metadata store."""
        if self.settings.server_url is None:
            return self.metadata
        with self._lock:
            if self._endpoint_store is None:
                from shoal.client import HttpEndpointStore

                self._endpoint_store = self._through_server(
                    HttpEndpointStore(self.server_connection()))
            return self._endpoint_store

    @property
    def endpoint_backends(self) -> tuple[EndpointBackend, ...]:
        """What runs endpoints, the first deploying new ones: the team server's own (over
        HTTP) when ``SHOAL_SERVER_URL`` is set; else Ray Serve when the backend is Ray, else a
        detached supervisor per endpoint launched through the backend (which also still
        manages the supervised endpoints of a Ray session)."""
        with self._lock:
            if self._endpoint_backends is None and self.settings.server_url is not None:
                from shoal.client import HttpEndpointBackend

                self._endpoint_backends = (self._through_server(
                    HttpEndpointBackend(self.server_connection())),)
            if self._endpoint_backends is None:
                self._endpoint_backends = self.make_endpoint_backends(self.supervisor_env())
            return self._endpoint_backends

    def make_endpoint_backends(self, env: Mapping[str, str], *,
                               replica_access: ReplicaAccessFor | None = None
                               ) -> tuple[EndpointBackend, ...]:
        """This session's endpoint backends (``endpoint_backends``), their supervisors and
        replicas started with *env* (a team server passes its own, withholding credentials
        from the model servers, and *replica_access*: Ray Serve replicas then reach their
        endpoint's files through the server, not its stores)."""
        import importlib

        def impl(path: str) -> Any:
            module, _, name = path.partition(":")
            return getattr(importlib.import_module(module), name)

        supervised = impl(_SUPERVISED_ENDPOINTS)(self.backend, env=env, home=self.home)
        if self.backend.name != "ray":
            return (supervised,)
        settings = self.settings
        serve = impl(_RAY_SERVE_ENDPOINTS)(
            self.backend, self.artifacts, env=env, home=self.home,
            proxy_location=settings.ray_serve_proxy_location,
            host=settings.ray_serve_host, port=settings.ray_serve_port,
            resolve_ttl_s=settings.env_resolve_ttl_seconds, replica_access=replica_access)
        return (serve, supervised)

    @property
    def env_builder(self) -> UvEnvBuilder:
        """Builds and caches job environments under ``SHOAL_HOME/envs``."""
        from shoal.envs import UvEnvBuilder

        return UvEnvBuilder(self.home / "envs",
                            resolve_ttl_seconds=self.settings.env_resolve_ttl_seconds,
                            withhold_credentials=self.settings.endpoint_credentials
                            == "withhold")

    def supervisor_env(self) -> dict[str, str]:
        if self.settings.server_url is not None:
            # The server writes its supervisors' environment (server/_launches.py).
            return {"SHOAL_SERVER_URL": self.settings.server_url,
                    "SHOAL_JOB_PROCESS": self.settings.job_process}
        env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
        env["SHOAL_HOME"] = str(self.home)
        env["SHOAL_METADATA_URL"] = self.settings.resolved_metadata_url()
        env["SHOAL_ARTIFACT_URL"] = self.settings.resolved_artifact_url()
        env["SHOAL_MAX_SLOTS"] = str(self.max_slots)
        env["SHOAL_JOB_PROCESS"] = self.settings.job_process
        env["SHOAL_MAX_EXTRACT_BYTES"] = str(self.settings.max_extract_bytes)
        env["SHOAL_MAX_EXTRACT_FILES"] = str(self.settings.max_extract_files)
        env["SHOAL_CHECKPOINT_SYNC_SECONDS"] = str(self.settings.checkpoint_sync_seconds)
        env["SHOAL_STORE_OUTAGE_SECONDS"] = str(self.settings.store_outage_seconds)
        return env

    @property
    def max_slots(self) -> int:
        return int(self.settings.max_slots or os.cpu_count() or 1)

    # --- SageMaker parity -------------------------------------------------------------

    def default_bucket(self) -> str:
        """Where uploads go by default (SageMaker returns its S3 bucket's name): the
        ``default_bucket`` argument, else the config's ``DefaultS3Bucket``, else the artifact
        store's root URL."""
        configured = self.defaults.session.get("DefaultS3Bucket")
        return (self._default_bucket or (configured.value if configured else None)
                or self.settings.resolved_artifact_url())

    @property
    def default_bucket_prefix(self) -> str | None:
        """The key prefix of uploads to the default bucket (argument, else the config's
        ``DefaultS3ObjectKeyPrefix``)."""
        if self._default_bucket_prefix is not None:
            return self._default_bucket_prefix
        configured = self.defaults.session.get("DefaultS3ObjectKeyPrefix")
        return configured.value if configured else None

    @property
    def boto_region_name(self) -> str:
        """``AWS_REGION``/``AWS_DEFAULT_REGION`` when set (code builds names with it), else
        ``local``; nothing here depends on it."""
        from shoal.config import aws_region

        return aws_region() or "local"

    def account_id(self) -> str:
        """A fixed twelve-digit placeholder (there is no AWS account behind shoal)."""
        return PLACEHOLDER_ACCOUNT

    def _root(self, bucket: str | None, key_prefix: str) -> str:
        """The URL for (*bucket*, *key_prefix*): SageMaker's rule, the default bucket's prefix
        applies only when no bucket is given."""
        from shoal.storage.transfer import join

        self._private_home()  # a first upload under the home must not create it open to all
        if bucket is None:
            return join(_as_url(self.default_bucket()), self.default_bucket_prefix or "",
                        key_prefix)
        return join(_as_url(bucket), key_prefix)

    def upload_data(self, path: str | os.PathLike[str], bucket: str | None = None,
                    key_prefix: str = "data", callback: Any = None,
                    extra_args: Any = None) -> str:
        """Upload a local file or directory under *key_prefix*; return its URI.

        Like SageMaker's: a directory gives ``<root>/<key_prefix>``, a file
        ``<root>/<key_prefix>/<name>``. The root is *bucket* (a URL, or an S3 bucket name), else
        ``default_bucket()`` with ``default_bucket_prefix``. *callback* is called with each
        file's size in bytes; *extra_args* (S3 upload options) has no effect on a local store.
        """
        from shoal.storage.transfer import upload_path

        if extra_args:
            self.report_inert("upload_data.extra_args", f"upload_data(extra_args={extra_args!r}"
                              ") has no effect on this artifact store")
        return upload_path(path, self._root(bucket, key_prefix), callback=callback)

    def upload_string_as_file_body(self, body: str, bucket: str, key: str,
                                   kms_key: str | None = None) -> str:
        """Write *body* (text) as the object *key* in *bucket*; return its URI."""
        from shoal.storage.transfer import write_bytes

        if kms_key:
            self.report_inert("kms_key", f"kms_key={kms_key!r} has no effect on this store")
        data = body.encode() if isinstance(body, str) else bytes(body)
        return write_bytes(self._root(bucket, key), data)

    def download_data(self, path: str | os.PathLike[str], bucket: str, key_prefix: str = "",
                      extra_args: Any = None) -> list[str]:
        """Download the object *key_prefix*, or every object under it, into the directory
        *path*; return the local paths."""
        from shoal.storage.transfer import download

        return download(self._root(bucket, key_prefix), path)

    def read_s3_file(self, bucket: str, key_prefix: str) -> str:
        """The object *key_prefix* of *bucket* as UTF-8 text."""
        from shoal.storage.transfer import read_bytes

        return read_bytes(self._root(bucket, key_prefix)).decode("utf-8")

    def list_s3_files(self, bucket: str, key_prefix: str) -> list[str]:
        """The keys (relative to *bucket*) of the objects under *key_prefix*."""
        from shoal.storage.transfer import list_files

        root = _as_url(bucket).rstrip("/")
        return [u[len(root) + 1:] for u in list_files(self._root(bucket, key_prefix))]

    def close(self) -> None:
        with self._lock:
            if self._metadata is not None:
                self._metadata.close()
                self._metadata = None
            self._runs = None
            self._endpoint_store = None
            if self._server is not None:
                self._endpoint_backends = None
            self._artifacts = None if self._server is not None else self._artifacts
            if self._server is not None:
                self._server.close()
                self._server = None
            if self._backend is not None:
                self._backend.close()
            self._jobs = None


#: What ``get_execution_role()`` and ``Session.account_id()`` return: shaped like AWS's, so
#: code that formats or parses them keeps working; nothing here reads them.
PLACEHOLDER_ACCOUNT = "000000000000"
PLACEHOLDER_ROLE = f"arn:aws:iam::{PLACEHOLDER_ACCOUNT}:role/shoal-placeholder-execution-role"
_REPORTED: set[str] = set()


def _report_once(key: str, message: str) -> None:
    """Warn once per process (for calls that have no session to report on)."""
    if key not in _REPORTED:
        _REPORTED.add(key)
        logger.warning(message)


def _tolerant(open_store: Callable[[], MetadataStore], url: str,
              seconds: float) -> MetadataStore:
    """The metadata store *open_store* opens, waiting out an outage of up to *seconds*, as
    every call on it does (``storage/outage.py``)."""
    from shoal.storage.outage import tolerant
    from shoal.storage.sql import redact_url

    shown = redact_url(url)
    opener = tolerant(_Opener(open_store), seconds=seconds, shown=shown)
    return tolerant(opener.open(), seconds=seconds, shown=shown)


class _Opener:
    def __init__(self, open_store: Callable[[], MetadataStore]) -> None:
        self.open = open_store


def _as_url(bucket: str) -> str:
    return bucket if "://" in bucket or bucket.startswith("/") else f"s3://{bucket}"


def get_execution_role(sagemaker_session: Session | None = None, use_default: bool = False) -> str:
    """A placeholder IAM role ARN (SageMaker returns the notebook's role). shoal needs no
    role: every ``role=`` is accepted and has no effect; this says so once."""
    _report_once("get_execution_role", "get_execution_role() returns the placeholder "
                 f"{PLACEHOLDER_ROLE}: roles have no effect in shoal (no AWS account is used)")
    return PLACEHOLDER_ROLE


_default: Session | None = None
_default_lock = threading.Lock()
_override: contextvars.ContextVar[Session | None] = contextvars.ContextVar("shoal_session",
                                                                         default=None)


def current() -> Session:
    """The session in effect: the one given to ``use()``, else the lazily built default."""
    session = _override.get()
    if session is not None:
        return session
    global _default
    with _default_lock:
        if _default is None:
            _default = Session()
        return _default


@contextlib.contextmanager
def use(session: Session) -> Iterator[Session]:
    token = _override.set(session)
    try:
        yield session
    finally:
        _override.reset(token)


_SUPERVISOR_SETTINGS = {"SHOAL_HOME": "home", "SHOAL_METADATA_URL": "metadata_url",
                        "SHOAL_SERVER_URL": "server_url",
                        "SHOAL_ARTIFACT_URL": "artifact_url", "SHOAL_MAX_SLOTS": "max_slots",
                        "SHOAL_JOB_PROCESS": "job_process",
                        "SHOAL_STORE_OUTAGE_SECONDS": "store_outage_seconds"}
_WARM: dict[tuple[tuple[str, str], ...], Session] = {}


def _warm_key(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, env[k]) for k in _SUPERVISOR_SETTINGS if k in env))


def warm_supervisor(env: Mapping[str, str]) -> None:
    """In the launcher, before it forks: build and warm the session a supervisor will use.

    The forked supervisor inherits imported modules, the Settings class and SQLAlchemy's
    compiled statements; connections are closed first, so none crosses the fork.
    """
    key = _warm_key(env)
    if "SHOAL_SERVER_URL" in env:
        return  # all-HTTP: no store to warm, and no connection may cross the fork
    session = _WARM.get(key)
    if session is None:
        kwargs: dict[str, Any] = {_SUPERVISOR_SETTINGS[k]: v for k, v in key}
        session = Session(**kwargs)
        # Only the metadata store is warmed: an object store's client (s3fs) runs an event
        # loop thread that must not cross a fork, so the child opens artifacts itself.
        session.metadata.find_job("shoal-warm-up")
        _WARM[key] = session
    session.metadata.close()  # dispose pooled connections; the engine and its caches stay


def _worker_context(session: Session) -> WorkerContext:
    """What a supervisor process takes from *session* (``shoal.jobs.worker``)."""
    from shoal.jobs.worker import WorkerContext

    settings = session.settings
    return WorkerContext(
        jobs=session.jobs, home=session.home, max_slots=session.max_slots,
        fork=settings.job_process == "fork", envs=session.env_builder,
        warm_endpoint=lambda pool, busy: _warm_endpoint(session, pool, busy=busy),
        close=session.close, zygote_idle_seconds=settings.zygote_idle_seconds,
        checkpoint_sync_seconds=settings.checkpoint_sync_seconds)


def _warm_endpoint(session: Session, pool: str, *, busy: bool = False) -> WarmWorkerEndpoint:
    """The session's backend's side of the warm pool in *pool*."""
    from shoal.core.ports import WarmPoolHost

    backend = session.backend
    if not isinstance(backend, WarmPoolHost):
        raise ConfigError(f"backend {backend.name!r} keeps no warm workers, but this supervisor "
                          f"was started for the warm pool {pool}", backend=backend.name)
    return backend.warm_endpoint(pool, busy=busy)


def _run_worker(session: Session, main: Callable[..., int], *args: str) -> int:
    """Call the job layer's *main* with *session*'s context (it closes the session)."""
    try:
        ctx = _worker_context(session)
    except BaseException:
        session.close()
        raise
    return main(ctx, *args)


# The entry points backends start (``shoal.session:supervisor_main`` ...): wiring only.

def supervisor_main(job: str, *batch: str) -> int:
    """Entry point of a job's supervisor process (forked by the launcher or spawned); with
    *batch*, *job* names a batch and *batch* its jobs (``shoal.jobs.worker``)."""
    from shoal._internal.proctitle import set_title
    from shoal.jobs import worker

    set_title("supervisor", job)
    session = _WARM.get(_warm_key(os.environ)) or Session()
    session.token_from_environ = True
    return _run_worker(session, worker.supervisor_main, job, *batch)


def rank_host_main(job: str, attempt: str, host_index: str, master_addr: str,
                   master_port: str) -> int:
    """Entry point of another host of a job placed on several nodes (``shoal.jobs.worker``)."""
    from shoal.jobs import worker

    session = Session()
    session.token_from_environ = True
    return _run_worker(session, worker.rank_host_main, job, attempt, host_index,
                       master_addr, master_port)


def serve_warm_main() -> int:
    """Entry point of a warm supervisor that starts without a job (a Ray backend's warm
    actor's; ``shoal.jobs.worker``)."""
    from shoal.jobs import worker

    session = Session()
    session.token_from_environ = True
    return _run_worker(session, worker.serve_warm_main)
