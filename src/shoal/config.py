"""Settings (``SHOAL_*`` environment) and the SageMaker-schema defaults files.

The only module besides the in-job entry point that reads ``os.environ``. Nothing here runs at
import time; ``Settings()`` and ``load_defaults()`` read when called.

Defaults files use SageMaker's schema, so an existing SageMaker config works unchanged::

    SchemaVersion: '1.0'
    SageMaker:
      PythonSDK:
        Modules:
          RemoteFunction:
            InstanceType: ml.m5.large

Precedence: explicit argument > extra files given to the session (last wins) > user file >
admin file > built-in default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from shoal.errors import ConfigError

__all__ = [
    "REMOTE_FUNCTION_KEYS",
    "DefaultsConfig",
    "ResolvedValue",
    "Settings",
    "default_admin_config_path",
    "default_user_config_path",
    "default_user_secret_path",
    "djl_environ",
    "job_name",
    "aws_region",
    "defaults_from_dict",
    "job_run_context",
    "load_defaults",
    "load_defaults_cached",
    "load_sagemaker_config",
    "shoal_environ",
]


def _settings_class() -> type[Any]:
    # pydantic-settings costs ~0.2 s to import; build the class on first use only.
    global _SETTINGS_CLS
    if _SETTINGS_CLS is not None:
        return _SETTINGS_CLS
    from pydantic import Field, PrivateAttr
    from pydantic_settings import BaseSettings, SettingsConfigDict

    from shoal._internal.archives import DEFAULT_MAX_EXTRACT_BYTES, DEFAULT_MAX_EXTRACT_FILES

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
        admin_config_override: Path | None = None
        user_config_override: Path | None = None
        #: The user's secret, from which every job's keys derive (kept outside the stores;
        #: default ``$XDG_CONFIG_HOME/shoal/user-secret``).
        user_secret_file: Path | None = None
        _explicit: frozenset[str] = PrivateAttr(default=frozenset())

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

        def sources(self) -> dict[str, str]:
            """Where each setting came from: ``argument``, ``env SHOAL_X`` or ``default``."""
            out = {}
            for name in type(self).model_fields:
                env = f"SHOAL_{name.upper()}"
                if name in self._explicit:
                    out[name] = "argument"
                elif name in self.model_fields_set and env in os.environ:
                    out[name] = f"env {env}"
                elif name in self.model_fields_set:
                    out[name] = "argument"
                else:
                    out[name] = "default"
            return out

    _SETTINGS_CLS = Settings
    return Settings


_SETTINGS_CLS: type[Any] | None = None


def Settings(**kwargs: Any) -> Any:  # noqa: N802 - a factory that stands where the class would
    """Build settings: keyword arguments > ``SHOAL_*`` environment > defaults.

    Example:
        >>> Settings(home="/tmp/shoal-home").resolved_metadata_url()
        'sqlite:////tmp/shoal-home/shoal.db'
    """
    from pydantic import ValidationError

    try:
        settings = _settings_class()(**kwargs)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}"
                             for err in e.errors())
        raise ConfigError(f"invalid shoal settings ({problems}). Check the SHOAL_* environment "
                          "variables and the arguments given to Session().") from e
    settings._explicit = frozenset(kwargs)
    return settings


def job_name() -> str | None:
    """Inside a job: its name (``SHOAL_JOB_NAME``, set by the supervisor), else None."""
    return os.environ.get("SHOAL_JOB_NAME") or None


def job_checkpoints() -> tuple[str, str] | None:
    """Inside a job with a checkpoint location: ``(local dir, URI)`` that the supervisor
    restored and syncs (``SHOAL_CHECKPOINT_DIR`` / ``SHOAL_CHECKPOINT_URI``), else None."""
    local, uri = os.environ.get("SHOAL_CHECKPOINT_DIR"), os.environ.get("SHOAL_CHECKPOINT_URI")
    return (local, uri) if local and uri else None


def job_run_context() -> str | None:
    """Inside a job: the JSON ``{"experiment_name", "run_name"}`` of the experiment run its
    caller had open (``SHOAL_RUN_CONTEXT``, set by the supervisor), else None."""
    return os.environ.get("SHOAL_RUN_CONTEXT") or None


def shoal_environ() -> dict[str, str]:
    """A snapshot of the ``SHOAL_*`` environment, for entry points that parse their own knobs
    (the model server's ``ServerOptions.from_env``)."""
    return {k: v for k, v in os.environ.items() if k.startswith("SHOAL_")}


def child_environ(**overrides: str) -> dict[str, str]:
    """The environment for a child process this one starts, with *overrides* applied."""
    return {**os.environ, **overrides}


def djl_environ() -> dict[str, str]:
    """A snapshot of the variables DJL's LLM containers read beside ``serving.properties``
    (``OPTION_*``, ``SERVING_*``, ``HF_MODEL_ID``), for the LLM server's options."""
    return {k: v for k, v in os.environ.items()
            if k.startswith(("OPTION_", "SERVING_")) or k == "HF_MODEL_ID"}


def aws_region() -> str | None:
    """``AWS_REGION`` or ``AWS_DEFAULT_REGION`` (what SageMaker code names resources with)."""
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None


def _sagemaker_override(var: str) -> Path | None:
    """SageMaker's override variable: a config file, or a directory holding ``config.yaml``."""
    value = os.environ.get(var)
    if not value:
        return None
    if "://" in value:
        raise ConfigError(f"{var}={value!r}: shoal reads config files from local paths; copy "
                          "the file here and point the variable at it", variable=var)
    path = Path(value).expanduser()
    return path / "config.yaml" if path.is_dir() else path


def default_admin_config_path() -> Path:
    return Path("/etc/xdg/shoal/config.yaml")


def default_user_config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "shoal" / "config.yaml"


def default_user_secret_path() -> Path:
    """The user's secret file: ``$XDG_CONFIG_HOME/shoal/user-secret`` (``~/.config/...``)."""
    return default_user_config_path().with_name("user-secret")


# --- SageMaker-schema defaults ------------------------------------------------------------

#: Every key SageMaker accepts under RemoteFunction, with the type it must have.
REMOTE_FUNCTION_KEYS: Mapping[str, str] = {
    "Dependencies": "str",
    "EnableInterContainerTrafficEncryption": "bool",
    "EnvironmentVariables": "dict[str,str]",
    "ImageUri": "str",
    "IncludeLocalWorkDir": "bool",
    "CustomFileFilter": "CustomFileFilter",
    "InstanceType": "str",
    "JobCondaEnvironment": "str",
    "PreExecutionCommands": "list[str]",
    "PreExecutionScript": "str",
    "RoleArn": "str",
    "S3KmsKeyId": "str",
    "S3RootUri": "str",
    "Tags": "list[Tag]",
    "VolumeKmsKeyId": "str",
    "VpcConfig": "VpcConfig",
}
_SESSION_KEYS = {"DefaultS3Bucket": "str", "DefaultS3ObjectKeyPrefix": "str"}
# Sections of SageMaker's schema that shoal keeps but does not interpret (yet).
_OPAQUE_SAGEMAKER_SECTIONS = frozenset({
    "AutoMLJob", "AutoMLJobV2", "CompilationJob", "EdgePackagingJob", "Endpoint",
    "EndpointConfig", "FeatureGroup", "HyperParameterTuningJob", "InferenceComponent",
    "InferenceRecommendationsJob", "Model", "ModelPackage", "MonitoringSchedule",
    "ProcessingJob", "TrainingJob", "TransformJob", "Pipeline", "ModelCard",
    "ClusterConfig", "Cluster",
})


@dataclass(frozen=True, slots=True)
class ResolvedValue:
    value: Any
    source: str


@dataclass(frozen=True, slots=True)
class DefaultsConfig:
    """RemoteFunction (and Session) defaults with the file each value came from."""

    remote_function: Mapping[str, ResolvedValue] = field(default_factory=dict)
    session: Mapping[str, ResolvedValue] = field(default_factory=dict)
    files: tuple[str, ...] = ()

    def get(self, key: str, default: Any = None) -> Any:
        item = self.remote_function.get(key)
        return item.value if item is not None else default


def load_defaults(files: Sequence[tuple[str, Path]]) -> DefaultsConfig:
    """Read (label, path) files in increasing precedence; missing files are skipped."""
    rf: dict[str, ResolvedValue] = {}
    sess: dict[str, ResolvedValue] = {}
    used: list[str] = []
    for label, path in files:
        if not path.exists():
            if label == "extra":
                raise ConfigError(f"config file {path} does not exist", file=str(path))
            continue
        doc = _read_yaml(path)
        used.append(f"{label}:{path}")
        modules = _validate(doc, path)
        for key, value in modules.get("RemoteFunction", {}).items():
            rf[key] = ResolvedValue(value, f"{label} file {path}")
        for key, value in modules.get("Session", {}).items():
            sess[key] = ResolvedValue(value, f"{label} file {path}")
    return DefaultsConfig(rf, sess, tuple(used))


#: (label, path, mtime_ns, size) of each file -> what they said; a changed file is a new key.
_DEFAULTS_CACHE: dict[tuple[tuple[str, str, int, int], ...], DefaultsConfig] = {}


def _file_key(label: str, path: Path) -> tuple[str, str, int, int]:
    try:
        st = path.stat()
    except OSError:
        return label, str(path), -1, -1
    return label, str(path), st.st_mtime_ns, st.st_size


def load_defaults_cached(files: Sequence[tuple[str, Path]]) -> DefaultsConfig:
    """``load_defaults``, read again only when a file was created, changed or removed (its
    path, mtime and size are the cache key), so an edit takes effect at the next use."""
    key = tuple(_file_key(label, path) for label, path in files)
    found = _DEFAULTS_CACHE.get(key)
    if found is None:
        found = load_defaults(files)
        if len(_DEFAULTS_CACHE) > 64:
            _DEFAULTS_CACHE.clear()
        _DEFAULTS_CACHE[key] = found
    return found


def defaults_from_dict(doc: Mapping[str, Any], label: str) -> DefaultsConfig:
    """Defaults from a config already loaded as a dict (``Session(sagemaker_config=...)``)."""
    modules = _validate(dict(doc), Path(f"<{label}>"))
    rf = {k: ResolvedValue(v, label) for k, v in modules.get("RemoteFunction", {}).items()}
    sess = {k: ResolvedValue(v, label) for k, v in modules.get("Session", {}).items()}
    return DefaultsConfig(rf, sess, (label,))


def load_sagemaker_config(additional_config_paths: Sequence[str | os.PathLike[str]] | None = None,
                          s3_resource: Any = None, repo_root_dir: str | None = None
                          ) -> dict[str, Any]:
    """The merged config dict (SageMaker's ``sagemaker.config.load_sagemaker_config``): the
    admin file, then the user file (``SHOAL_*``/``SAGEMAKER_*_CONFIG_OVERRIDE`` honoured), then
    *additional_config_paths*, later values replacing earlier ones key by key. Each file is
    checked against the schema; a missing additional path is an error."""
    settings = Settings()
    paths: list[tuple[str, Path]] = [("admin", settings.admin_config_path()),
                                     ("user", settings.user_config_path())]
    for extra in additional_config_paths or ():
        path = Path(os.fspath(extra)).expanduser()
        paths.append(("extra", path / "config.yaml" if path.is_dir() else path))
    merged: dict[str, Any] = {}
    for label, path in paths:
        if not path.exists():
            if label == "extra":
                raise ConfigError(f"config file {path} does not exist", file=str(path))
            continue
        doc = _read_yaml(path)
        _validate(doc, path)
        _merge(merged, doc)
    return merged


def _merge(into: dict[str, Any], doc: Mapping[str, Any]) -> None:
    for key, value in doc.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = _copy(value)


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    return list(value) if isinstance(value, list) else value


def _read_yaml(path: Path) -> Any:
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e}", file=str(path)) from e
    try:
        return yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"config file {path} is not valid YAML{where}: "
                          f"{getattr(e, 'problem', e)}", file=str(path)) from e


def _fail(path: Path, key: str, expected: str, got: Any = None, *, unknown: bool = False) -> None:
    if unknown:
        raise ConfigError(f"config file {path}: unknown key {key!r}; expected one of {expected}",
                          file=str(path), key=key)
    raise ConfigError(f"config file {path}: {key} must be {expected}, got "
                      f"{type(got).__name__} {got!r}", file=str(path), key=key)


def _validate(doc: Any, path: Path) -> dict[str, dict[str, Any]]:
    if not isinstance(doc, dict):
        _fail(path, "(top level)", "a mapping", doc)
    for key in doc:
        if key not in ("SchemaVersion", "SageMaker", "CustomParameters"):
            _fail(path, str(key), "SchemaVersion, SageMaker, CustomParameters", unknown=True)
    if str(doc.get("SchemaVersion", "1.0")) != "1.0":
        _fail(path, "SchemaVersion", "'1.0'", doc.get("SchemaVersion"))
    sm = doc.get("SageMaker") or {}
    if not isinstance(sm, dict):
        _fail(path, "SageMaker", "a mapping", sm)
    for key in sm:
        if key != "PythonSDK" and key not in _OPAQUE_SAGEMAKER_SECTIONS:
            _fail(path, f"SageMaker.{key}",
                  "PythonSDK or a SageMaker resource section", unknown=True)
    sdk = sm.get("PythonSDK") or {}
    if not isinstance(sdk, dict):
        _fail(path, "SageMaker.PythonSDK", "a mapping", sdk)
    for key in sdk:
        if key != "Modules":
            _fail(path, f"SageMaker.PythonSDK.{key}", "Modules", unknown=True)
    modules = sdk.get("Modules") or {}
    if not isinstance(modules, dict):
        _fail(path, "SageMaker.PythonSDK.Modules", "a mapping", modules)
    out: dict[str, dict[str, Any]] = {}
    for name, schema in (("RemoteFunction", REMOTE_FUNCTION_KEYS), ("Session", _SESSION_KEYS)):
        section = modules.get(name) or {}
        prefix = f"SageMaker.PythonSDK.Modules.{name}"
        if not isinstance(section, dict):
            _fail(path, prefix, "a mapping", section)
        for key, value in section.items():
            if key not in schema:
                _fail(path, f"{prefix}.{key}", ", ".join(sorted(schema)), unknown=True)
            _check_type(path, f"{prefix}.{key}", schema[key], value)
        out[name] = dict(section)
    for name in modules:
        if name not in ("RemoteFunction", "Session", "Estimator", "Model", "Processor"):
            _fail(path, f"SageMaker.PythonSDK.Modules.{name}",
                  "RemoteFunction, Session, Estimator, Model, Processor", unknown=True)
    return out


def _check_type(path: Path, key: str, kind: str, value: Any) -> None:
    if kind == "str":
        if not isinstance(value, str):
            _fail(path, key, "a string", value)
    elif kind == "bool":
        if not isinstance(value, bool):
            _fail(path, key, "true or false", value)
    elif kind == "list[str]":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            _fail(path, key, "a list of strings", value)
    elif kind == "dict[str,str]":
        if not isinstance(value, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            _fail(path, key, "a mapping of string to string", value)
    elif kind == "list[Tag]":
        ok = isinstance(value, list) and all(
            isinstance(t, dict) and set(t) == {"Key", "Value"}
            and isinstance(t["Key"], str) and isinstance(t["Value"], str) for t in value)
        if not ok:
            _fail(path, key, 'a list of {"Key": str, "Value": str}', value)
    elif kind == "CustomFileFilter":
        patterns = value.get("IgnoreNamePatterns", []) if isinstance(value, dict) else None
        ok = isinstance(value, dict) and set(value) <= {"IgnoreNamePatterns"} and isinstance(
            patterns, list) and all(isinstance(p, str) for p in patterns)
        if not ok:
            _fail(path, key, "{IgnoreNamePatterns: [str, ...]}", value)
    elif kind == "VpcConfig":
        ok = isinstance(value, dict) and set(value) <= {"SecurityGroupIds", "Subnets"} and all(
            isinstance(v, list) and all(isinstance(s, str) for s in v) for v in value.values())
        if not ok:
            _fail(path, key, "{SecurityGroupIds: [str], Subnets: [str]}", value)
