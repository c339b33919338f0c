"""RemoteOptions: the knobs of @remote and RemoteExecutor, declared once, under SageMaker's
names, resolved against the defaults files (explicit > user file > admin file > default)."""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shoal.core.clock import RandomIdFactory
from shoal.core.jobs import JobKind, JobName, JobSpec
from shoal.core.resources import resolve_instance_type
from shoal.core.tags import normalise_tags as _normalise_tags
from shoal.errors import InvalidArgumentError, ResourceUnavailableError
from shoal.experiments import current_run_context
from shoal.remote_function._checkpoint import find_checkpoint_location

__all__ = ["UNSET", "RemoteOptions"]


class _Unset:
    """Distinguishes 'not passed' from None (httpx's UseClientDefault)."""

    _instance: _Unset | None = None

    def __new__(cls) -> _Unset:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNSET"

    def __bool__(self) -> bool:
        return False


UNSET: Any = _Unset()

#: ``dependencies="auto_capture"``: pin what the function needs from the current environment.
AUTO_CAPTURE = "auto_capture"

#: The largest working directory include_local_workdir ships (uncompressed).
WORKDIR_MAX_BYTES = 100 * 1024**2

# SageMaker parameter -> config key under RemoteFunction.
_CONFIG_KEYS = {
    "dependencies": "Dependencies",
    "pre_execution_commands": "PreExecutionCommands",
    "pre_execution_script": "PreExecutionScript",
    "environment_variables": "EnvironmentVariables",
    "image_uri": "ImageUri",
    "include_local_workdir": "IncludeLocalWorkDir",
    "custom_file_filter": "CustomFileFilter",
    "instance_type": "InstanceType",
    "job_conda_env": "JobCondaEnvironment",
    "role": "RoleArn",
    "s3_kms_key": "S3KmsKeyId",
    "s3_root_uri": "S3RootUri",
    "tags": "Tags",
    "volume_kms_key": "VolumeKmsKeyId",
    "encrypt_inter_container_traffic": "EnableInterContainerTrafficEncryption",
}
# Settings that mean something on SageMaker only: kept on the record, reported once.
_INERT = ("image_uri", "role", "s3_kms_key", "s3_root_uri", "volume_kms_key", "subnets",
          "security_group_ids", "encrypt_inter_container_traffic", "volume_size",
          "use_spot_instances", "max_wait_time_in_seconds", "disable_output_compression",
          "enable_session_tag_chaining")
# Features that arrive with later issues: refused clearly rather than ignored.
_NOT_YET = {"spark_config": "a later issue", "use_mpirun": "a later issue"}


@dataclass(frozen=True, slots=True)
class RemoteOptions:
    """Everything ``@remote`` and ``RemoteExecutor`` accept, under SageMaker's names."""

    dependencies: Any = UNSET
    pre_execution_commands: Any = UNSET
    pre_execution_script: Any = UNSET
    environment_variables: Any = UNSET
    image_uri: Any = UNSET
    include_local_workdir: Any = UNSET
    custom_file_filter: Any = UNSET
    instance_count: int = 1
    instance_type: Any = UNSET
    job_conda_env: Any = UNSET
    job_name_prefix: str | None = None
    keep_alive_period_in_seconds: int = 0
    max_retry_attempts: int = 1
    max_runtime_in_seconds: int = 24 * 3600
    role: Any = UNSET
    s3_kms_key: Any = UNSET
    s3_root_uri: Any = UNSET
    sagemaker_session: Any = None
    security_group_ids: Any = UNSET
    subnets: Any = UNSET
    tags: Any = UNSET
    volume_kms_key: Any = UNSET
    volume_size: Any = UNSET
    encrypt_inter_container_traffic: Any = UNSET
    spark_config: Any = UNSET
    use_spot_instances: Any = UNSET
    max_wait_time_in_seconds: Any = UNSET
    disable_output_compression: bool = False
    use_torchrun: bool = False
    use_mpirun: bool = False
    nproc_per_node: Any = UNSET
    # shoal's own (enable_session_tag_chaining is SageMaker's Estimator's; accepted here too)
    enable_session_tag_chaining: Any = UNSET
    allow_cpu_fallback: bool = False
    stop_grace_period_in_seconds: float = 10.0
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_arguments(cls, args: Mapping[str, Any]) -> RemoteOptions:
        """The options from a signature that declares them all (``remote``,
        ``RemoteExecutor``): *args* is its ``locals()``."""
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        opts = cls(**{k: v for k, v in args.items() if k in names})
        opts.validate()
        return opts

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any]) -> RemoteOptions:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise InvalidArgumentError(
                f"unknown argument(s) {', '.join(unknown)}; @remote and RemoteExecutor accept "
                f"SageMaker's names: {', '.join(sorted(names - {'extra'}))}", arguments=unknown)
        opts = cls(**kwargs)
        opts.validate()
        return opts

    def validate(self) -> None:
        for name in ("max_runtime_in_seconds", "max_retry_attempts", "instance_count"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidArgumentError(f"{name} must be a positive integer, got {value!r}",
                                           argument=name)
        keep = self.keep_alive_period_in_seconds
        if not isinstance(keep, int) or isinstance(keep, bool) or not 0 <= keep <= 3600:
            raise InvalidArgumentError("keep_alive_period_in_seconds must be an integer from 0 "
                                       f"to 3600 (SageMaker's range), got {keep!r}",
                                       argument="keep_alive_period_in_seconds")
        if self.instance_count != 1 and not self.use_torchrun:
            raise InvalidArgumentError(
                f"instance_count={self.instance_count} runs the function as several ranks, "
                "which needs use_torchrun=True (as on SageMaker); or use instance_count=1",
                argument="instance_count")
        per_node = self.nproc_per_node
        if per_node not in (UNSET, None) and (not isinstance(per_node, int) or
                                             isinstance(per_node, bool) or per_node < 1):
            raise InvalidArgumentError(f"nproc_per_node must be a positive integer, got "
                                       f"{per_node!r}", argument="nproc_per_node")
        if per_node not in (UNSET, None) and not self.use_torchrun:
            raise InvalidArgumentError("nproc_per_node applies with use_torchrun=True",
                                       argument="nproc_per_node")
        for name, issue in _NOT_YET.items():
            value = getattr(self, name)
            if value not in (UNSET, None, False, 0, (), []):
                raise InvalidArgumentError(
                    f"{name} is not supported by this version of shoal yet (TODO({issue})); "
                    "remove it to run the job", argument=name)

    # --- resolution -------------------------------------------------------------------

    def resolve(self, key: str, defaults: Any) -> Any:
        value = getattr(self, key)
        if value is not UNSET:
            return value
        config_key = _CONFIG_KEYS.get(key)
        return defaults.get(config_key) if config_key else None

    def build_job(self, func: Callable[..., Any], session: Any, *,
                  call_args: tuple[Any, ...] = ()) -> tuple[JobSpec, dict[str, bytes]]:
        """The JobSpec plus the files that travel with the job (packed workdir, captured
        requirements)."""
        spec = self.build_spec(func, session)
        checkpoint = find_checkpoint_location(call_args)
        if checkpoint is not None:  # recorded like an estimator's CheckpointConfig
            spec = dataclasses.replace(spec, extra={**spec.extra,
                                                    "checkpoint_s3_uri": checkpoint.s3_uri})
        files: dict[str, bytes] = {}
        shipped = bool(self.resolve("include_local_workdir", session.defaults))
        if spec.dependencies == AUTO_CAPTURE:
            from shoal.envs._capture import capture_requirements, require_no_editable

            captured = capture_requirements(func, extra_objects=call_args)
            require_no_editable(captured, shipped_workdir=Path.cwd() if shipped else None)
            files["env/requirements.txt"] = ("\n".join(captured.requirements) + "\n").encode()
        if shipped:
            from shoal.envs._workdir import pack_workdir

            packed = pack_workdir(Path.cwd(), file_filter=self._file_filter(session.defaults),
                                  max_bytes=WORKDIR_MAX_BYTES)
            files[f"workdir/{packed.sha256}.zip"] = packed.data
            spec = dataclasses.replace(spec, extra={**spec.extra,
                                                    "workdir_sha256": packed.sha256,
                                                    "workdir_files": packed.files,
                                                    "workdir_bytes": packed.size_bytes})
        return spec, files

    def _file_filter(self, defaults: Any) -> Any:
        value = self.resolve("custom_file_filter", defaults)
        if isinstance(value, Mapping):  # the config file's {IgnoreNamePatterns: [...]}
            from shoal.remote_function._filter import CustomFileFilter

            return CustomFileFilter(ignore_name_patterns=value.get("IgnoreNamePatterns", []))
        return value

    def build_spec(self, func: Callable[..., Any], session: Any) -> JobSpec:
        """Turn these options, the session's defaults and *func* into a JobSpec."""
        defaults = session.defaults
        for name, issue in _NOT_YET.items():
            if name in _CONFIG_KEYS and getattr(self, name) is UNSET and \
                    defaults.get(_CONFIG_KEYS[name]) not in (None, False, [], ""):
                raise InvalidArgumentError(
                    f"{_CONFIG_KEYS[name]} is set in {defaults.remote_function[_CONFIG_KEYS[name]].source} "
                    f"but is not supported by this version of shoal yet (TODO({issue}))",
                    key=_CONFIG_KEYS[name])
        instance_type = self.resolve("instance_type", defaults) or "local"
        itype = resolve_instance_type(instance_type)
        gpu_note = self._check_gpus(itype.name, itype.gpus)
        env = self.resolve("environment_variables", defaults) or {}
        if not isinstance(env, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in env.items()):
            raise InvalidArgumentError("environment_variables must map str to str",
                                       argument="environment_variables")
        inert = {}
        for name in _INERT:
            value = self.resolve(name, defaults)
            if value not in (UNSET, None, False):
                inert[name] = value
                session.report_inert(name, f"{name}={value!r} has no effect on the "
                                           f"{session.settings.backend} backend; it is kept "
                                           "on the job record")
        extra: dict[str, Any] = {"sys_path": _import_path()}
        run = current_run_context()
        if run is not None:  # the job's load_run() finds the caller's run (SHOAL_RUN_CONTEXT)
            extra["run"] = run
        conda_env = self.resolve("job_conda_env", defaults)
        if conda_env not in (None, UNSET, ""):
            if not isinstance(conda_env, str) or not conda_env.strip():
                raise InvalidArgumentError("job_conda_env must be the name of a conda "
                                           "environment", argument="job_conda_env")
            deps = self.resolve("dependencies", defaults)
            if isinstance(deps, str) and deps.endswith((".yml", ".yaml")):
                raise InvalidArgumentError("give job_conda_env or a conda environment file as "
                                           "dependencies, not both; to add packages to the named "
                                           "environment give a requirements.txt",
                                           argument="job_conda_env")
            extra["conda_env"] = conda_env.strip()
        if gpu_note:
            extra["gpu_fallback"] = gpu_note
        if getattr(session.settings, "strict_versions", False):
            extra["strict_versions"] = True  # a conda file's python= must then be the client's
        if self.use_torchrun:
            per_node = self.nproc_per_node if self.nproc_per_node not in (UNSET, None) else \
                max(1, 0 if gpu_note else itype.gpus)
            extra["distribution"] = {"hosts": self.instance_count, "per_host": per_node,
                                     "torchrun": True}
        commands, script = self._pre_execution(defaults)
        base = self.job_name_prefix or getattr(func, "__name__", "job")
        now = datetime.now(UTC)
        return JobSpec(
            name=JobName(RandomIdFactory().job_name(base, now)),
            kind=JobKind.FUNCTION,
            function_name=f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', '?')}",
            instance_type=itype.name,
            cpus=float(itype.cpus),
            memory_mib=int(itype.memory_gib * 1024) or None,
            gpus=0 if gpu_note else itype.gpus,
            allow_cpu_fallback=self.allow_cpu_fallback,
            environment_variables=dict(env),
            dependencies=self._dependencies(defaults),
            pre_execution_commands=commands,
            pre_execution_script=script,
            max_runtime_in_seconds=self.max_runtime_in_seconds,
            max_retry_attempts=self.max_retry_attempts,
            stop_grace_period_in_seconds=self.stop_grace_period_in_seconds,
            keep_alive_period_in_seconds=self.keep_alive_period_in_seconds
            or _backend_keep_alive(session.settings),
            tags=self._tags(defaults),
            python_version=f"{sys.version_info.major}.{sys.version_info.minor}",
            inert_settings=inert,
            extra=extra,
        )

    def _check_gpus(self, name: str, gpus: int) -> str | None:
        return check_gpus(name, gpus, self.allow_cpu_fallback)

    def _dependencies(self, defaults: Any) -> str | None:
        deps = self.resolve("dependencies", defaults)
        if deps in (None, UNSET):
            return None
        if not isinstance(deps, str):
            raise InvalidArgumentError("dependencies must be a path to requirements.txt",
                                       argument="dependencies")
        if deps == AUTO_CAPTURE:
            return AUTO_CAPTURE
        path = Path(deps).expanduser().resolve()
        if not path.is_file():
            raise InvalidArgumentError(f"dependencies file {deps} does not exist (looked for "
                                       f"{path})", argument="dependencies", path=str(path))
        return str(path)

    def _pre_execution(self, defaults: Any) -> tuple[tuple[str, ...], str | None]:
        commands = self.resolve("pre_execution_commands", defaults) or []
        script = self.resolve("pre_execution_script", defaults)
        if commands and script:
            raise InvalidArgumentError("give pre_execution_commands or pre_execution_script, "
                                       "not both (SageMaker's rule)",
                                       argument="pre_execution_commands")
        if not isinstance(commands, list | tuple) or not all(isinstance(c, str) for c in commands):
            raise InvalidArgumentError("pre_execution_commands must be a list of strings",
                                       argument="pre_execution_commands")
        if script is not None:
            path = Path(str(script)).expanduser().resolve()
            if not path.is_file():
                raise InvalidArgumentError(f"pre_execution_script {script} does not exist "
                                           f"(looked for {path})", argument="pre_execution_script")
            script = str(path)
        return tuple(commands), script

    def _tags(self, defaults: Any) -> tuple[tuple[str, str], ...]:
        given = self.tags if self.tags is not UNSET else None
        tags = _normalise_tags(given)
        keys = {k for k, _ in tags}
        # Configured tags are appended unless the key is already given (SageMaker's rule).
        for k, v in _normalise_tags(defaults.get("Tags")):
            if k not in keys:
                tags.append((k, v))
        return tuple(tags)


_IMPORT_PATH: tuple[tuple[str, ...], list[str]] = ((), [])


def _import_path() -> list[str]:
    """The caller's sys.path directories (checked once per change of sys.path, not per job)."""
    global _IMPORT_PATH
    key = tuple(sys.path)
    if _IMPORT_PATH[0] != key:
        _IMPORT_PATH = (key, [p for p in key if p and os.path.isdir(p)])
    return list(_IMPORT_PATH[1])


def check_gpus(name: str, gpus: int, allow_cpu_fallback: bool) -> str | None:
    """None when this machine has the GPUs *name* asks for; the CPU-fallback note when it
    lacks them and the caller allowed that; else ResourceUnavailableError."""
    if gpus <= 0:
        return None
    have = _visible_gpus()
    if have >= gpus:
        return None
    note = f"{name} asks for {gpus} GPU(s); this machine has {have}"
    if not allow_cpu_fallback:
        raise ResourceUnavailableError(
            f"{note}. Pass allow_cpu_fallback=True to run on the CPU instead, or choose a CPU "
            "instance type such as ml.m5.xlarge", instance_type=name)
    return f"ran on CPU: {note}"


def is_ray(settings: Any) -> bool:
    backend = str(getattr(settings, "backend", "local"))
    return backend == "ray" or backend.startswith("ray://")


def _backend_keep_alive(settings: Any) -> int:
    """The keep-alive a job gets when it asks for none: on Ray, warm supervisor actors serve
    jobs by default (``ray_keep_alive_seconds``); locally, none (SageMaker's default)."""
    return int(getattr(settings, "ray_keep_alive_seconds", 0) or 0) if is_ray(settings) else 0


def _visible_gpus() -> int:
    return len([p for p in Path("/dev").glob("nvidia[0-9]*")])


def signature_names() -> list[str]:
    return [p for p in inspect.signature(RemoteOptions).parameters if p != "extra"]
