"""The settings model behind ``shoal.config.Settings()`` (``SHOAL_*`` environment > defaults).

Its own module so that pydantic-settings (~0.2 s to import) is imported only when settings are
first built: ``shoal.config`` imports this module inside ``_settings_class()``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from shoal._internal.archives import DEFAULT_MAX_EXTRACT_BYTES, DEFAULT_MAX_EXTRACT_FILES
from shoal.config import (
    _sagemaker_override,
    default_admin_config_path,
    default_credentials_path,
    default_user_config_path,
    default_user_secret_path,
    shoal_environ,
)

__all__ = ["Settings"]


class Settings(BaseSettings):  # noqa: D401 - documented on the factory below
    model_config = SettingsConfigDict(env_prefix="SHOAL_", env_nested_delimiter="__",
                                      extra="forbid")
    home: Path = Field(default_factory=lambda: Path.home() / ".shoal")
    metadata_url: str | None = None
    artifact_url: str | None = None
    backend: str = "local"
    #: Ray backend: the cluster (``auto``, ``host:6379``, ``ray://host:10001``), custom
    #: resources every job asks for, and the namespace of the jobs' actors.
    ray_address: str = "auto"
    ray_resources: dict[str, float] = Field(default_factory=dict)
    ray_namespace: str = "shoal"
    #: Endpoints on the Ray backend (Ray Serve): where Serve's HTTP proxies listen when
    #: shoal starts Serve (a cluster that already runs Serve keeps its own), and on which
    #: nodes ("HeadOnly", "EveryNode"). Loopback by default: nothing is exposed.
    ray_serve_host: str = "127.0.0.1"
    ray_serve_port: int = Field(default=8000, ge=1, le=65535)
    ray_serve_proxy_location: Literal["HeadOnly", "EveryNode"] = "HeadOnly"
    #: Token of a cluster with token authentication; default: the one 'shoal ray up'
    #: wrote under this home (``ray/auth_token``), if any.
    ray_auth_token_file: Path | None = None
    #: Ray backend: how long a warm supervisor actor waits for the next job when a
    #: ``@remote`` or ``RemoteExecutor`` job sets no ``keep_alive_period_in_seconds``
    #: (it holds its resources meanwhile); 0 gives every such job an actor of its own.
    ray_keep_alive_seconds: int = Field(default=60, ge=0, le=3600)
    max_slots: int | None = None
    launch_mode: Literal["forkserver", "spawn"] = "forkserver"
    launcher_idle_seconds: float = 600.0
    job_process: Literal["fork", "exec"] = "fork"
    env_resolve_ttl_seconds: float = 24 * 3600.0
    zygote_idle_seconds: float = 300.0
    #: Framework estimators: a framework_version or py_version that cannot run as asked
    #: here is an error instead of running the nearest that can (with a notice).
    strict_versions: bool = False
    #: The most one archive (model.tar.gz, a job's source, a workdir, a bundle) may
    #: expand to when shoal extracts it, in bytes and in members; checked while
    #: extracting, so a decompression bomb stops at the cap and leaves nothing behind.
    max_extract_bytes: int = Field(default=DEFAULT_MAX_EXTRACT_BYTES, ge=1)
    max_extract_files: int = Field(default=DEFAULT_MAX_EXTRACT_FILES, ge=1)
    #: How often a running job's checkpoints (an estimator's ``checkpoint_s3_uri``, a
    #: ``@remote`` function's ``CheckpointLocation``) are synced to their URI.
    checkpoint_sync_seconds: float = Field(default=5.0, gt=0)
    #: How long supervisors and clients wait out a metadata or artifact store that does not
    #: answer (a database restart) before a job fails naming the store.
    store_outage_seconds: float = Field(default=60.0, ge=0)
    admin_config_override: Path | None = None
    user_config_override: Path | None = None
    #: The user's secret, from which every job's keys derive (kept outside the stores;
    #: default ``$XDG_CONFIG_HOME/shoal/user-secret``).
    user_secret_file: Path | None = None
    # A team server (preview): runs and metrics go through it; its API token (never shown).
    server_url: str | None = None
    token: SecretStr | None = None
    #: On a team server: the URL its jobs' supervisors reach it at (``http://host:8765``);
    #: default: the address it binds (see ``shoal.server.admin.supervisor_url``).
    server_public_url: str | None = None
    #: The logins ``shoal login`` stores (default ``$XDG_CONFIG_HOME/shoal/credentials``);
    #: the current one is used when no ``SHOAL_SERVER_URL`` (nor own store URL) is set.
    credentials_file: Path | None = None
    #: On a team server: the largest upload (an artifact) it takes, in bytes (413 past it).
    server_max_upload_bytes: int = Field(default=20 * 1024**3, ge=1)
    #: On a team server: the largest request body it passes on to an endpoint
    #: (``POST /api/v1/endpoints/{name}/invocations``; SageMaker's limit), 413 past it.
    server_max_invocation_bytes: int = Field(default=6 * 1024**2, ge=1)
    #: What an endpoint's model servers (the user's inference code) inherit of their
    #: supervisor's environment: all of it, or (``withhold``: endpoints a team server starts)
    #: nothing that looks like a credential (``shoal.core.secrets.without_credentials``).
    endpoint_credentials: Literal["inherit", "withhold"] = "inherit"
    _explicit: frozenset[str] = PrivateAttr(default=frozenset())
    #: The credentials file server_url (and token) came from, when they did.
    _login_file: Path | None = PrivateAttr(default=None)

    def resolved_metadata_url(self) -> str:
        return self.metadata_url or f"sqlite:///{self.home / 'shoal.db'}"

    def resolved_artifact_url(self) -> str:
        return self.artifact_url or f"file://{self.home / 'artifacts'}"

    def admin_config_path(self) -> Path:
        """``SHOAL_ADMIN_CONFIG_OVERRIDE``, else SageMaker's
        ``SAGEMAKER_ADMIN_CONFIG_OVERRIDE``, else the default admin file."""
        return self.admin_config_override or _sagemaker_override(
            "SAGEMAKER_ADMIN_CONFIG_OVERRIDE") or default_admin_config_path()

    def user_config_path(self) -> Path:
        """``SHOAL_USER_CONFIG_OVERRIDE``, else SageMaker's
        ``SAGEMAKER_USER_CONFIG_OVERRIDE``, else the default user file."""
        return self.user_config_override or _sagemaker_override(
            "SAGEMAKER_USER_CONFIG_OVERRIDE") or default_user_config_path()

    def user_secret_path(self) -> Path:
        return self.user_secret_file or default_user_secret_path()

    def credentials_path(self) -> Path:
        return self.credentials_file or default_credentials_path()

    def sources(self) -> dict[str, str]:
        """Where each setting came from: ``argument``, ``env SHOAL_X`` or ``default``."""
        out = {}
        environ = shoal_environ()
        for name in type(self).model_fields:
            env = f"SHOAL_{name.upper()}"
            if self._login_file is not None and name in ("server_url", "token") and \
                    env not in environ and name not in self._explicit:
                out[name] = f"login {self._login_file}"
            elif name in self._explicit:
                out[name] = "argument"
            elif name in self.model_fields_set and env in environ:
                out[name] = f"env {env}"
            elif name in self.model_fields_set:
                out[name] = "argument"
            else:
                out[name] = "default"
        return out
