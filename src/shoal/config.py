"""Settings (``SHOAL_*`` environment) and the SageMaker-schema defaults files.

The only module (with its settings model, ``shoal._internal.settings``) besides the in-job entry
point that reads ``os.environ``. Nothing here runs at import time; ``Settings()`` and
``load_defaults()`` read when called.

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
from typing import TYPE_CHECKING, Any, NoReturn

from shoal.errors import ConfigError

if TYPE_CHECKING:
    from shoal._internal.settings import Settings as SettingsModel

__all__ = [
    "REMOTE_FUNCTION_KEYS",
    "DefaultsConfig",
    "ResolvedValue",
    "Settings",
    "default_admin_config_path",
    "default_credentials_path",
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


def _settings_class() -> type[SettingsModel]:
    # pydantic-settings costs ~0.2 s to import: its module is imported on first use only.
    from shoal._internal.settings import Settings as SettingsModel

    return SettingsModel


def Settings(**kwargs: Any) -> SettingsModel:  # noqa: N802 - a factory in the class's place
    """Build settings: keyword arguments > ``SHOAL_*`` environment > defaults.

    Example:
        >>> Settings(home="/tmp/shoal-home").resolved_metadata_url()
        'sqlite:////tmp/shoal-home/shoal.db'

    *kwargs* are any of the model's fields (``shoal._internal.settings``), each of its own
    type: pydantic validates them.
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
    _use_login(settings, kwargs)
    return settings


def _use_login(settings: SettingsModel, kwargs: Mapping[str, Any]) -> None:
    """The current ``shoal login`` (the credentials file) when nothing names the stores: no
    ``SHOAL_SERVER_URL``, no ``server_url=`` argument (``None`` too: the team server's own
    session), no metadata or artifact URL (a session with its own stores, as every
    supervisor of the embedded default is). ``SHOAL_TOKEN`` still wins over the file's."""
    if settings.server_url is not None or "server_url" in kwargs or \
            settings.metadata_url is not None or settings.artifact_url is not None:
        return
    from shoal._internal.credentials import read_credentials

    path = settings.credentials_path()
    login = read_credentials(path).current_login()
    if login is None:
        return
    from pydantic import SecretStr

    settings.server_url = login.url
    if settings.token is None:
        settings.token = SecretStr(login.token)
    settings._login_file = path


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


def default_credentials_path() -> Path:
    """The logins of ``shoal login``: ``$XDG_CONFIG_HOME/shoal/credentials``."""
    return default_user_config_path().with_name("credentials")


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


def _read_yaml(path: Path) -> Any:  # YAML: whatever the file holds, _validate checks it
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


def _fail(path: Path, key: str, expected: str, got: object = None, *, unknown: bool = False
          ) -> NoReturn:
    if unknown:
        raise ConfigError(f"config file {path}: unknown key {key!r}; expected one of {expected}",
                          file=str(path), key=key)
    raise ConfigError(f"config file {path}: {key} must be {expected}, got "
                      f"{type(got).__name__} {got!r}", file=str(path), key=key)


def _validate(doc: object, path: Path) -> dict[str, dict[str, Any]]:
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


def _check_type(path: Path, key: str, kind: str, value: object) -> None:
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
