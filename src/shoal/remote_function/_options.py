"""RemoteOptions: the knobs of @remote and RemoteExecutor, declared once, under SageMaker's
names, resolved against the defaults files (explicit > user file > admin file > default)."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal.core.jobs import JobKind, JobSpec, RunRef, Workdir
from shoal.core.tags import normalise_tags as _normalise_tags
from shoal.errors import InvalidArgumentError
from shoal.experiments import current_run_context
from shoal.jobs.options import JobOptions, job_spec, new_job_name, positive
from shoal.remote_function._checkpoint import find_checkpoint_location

if TYPE_CHECKING:
    from shoal.config import DefaultsConfig
    from shoal.remote_function._filter import CustomFileFilter
    from shoal.session import Session

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
    """Everything ``@remote`` and ``RemoteExecutor`` accept, under SageMaker's names, in
    SageMaker's order (then shoal's own). UNSET: taken from the defaults config."""

    dependencies: str | None = UNSET
    pre_execution_commands: list[str] | None = UNSET
    pre_execution_script: str | None = UNSET
    environment_variables: dict[str, str] | None = UNSET
    image_uri: str | None = UNSET
    include_local_workdir: bool | None = UNSET
    custom_file_filter: Callable[[str, list[str]], list[str]] | CustomFileFilter | None = UNSET
    instance_count: int = 1
    instance_type: str | None = UNSET
    job_conda_env: str | None = UNSET
    job_name_prefix: str | None = None
    keep_alive_period_in_seconds: float = 0
    max_retry_attempts: int = 1
    max_runtime_in_seconds: int = 24 * 3600
    role: str | None = UNSET
    s3_kms_key: str | None = UNSET
    s3_root_uri: str | None = UNSET
    sagemaker_session: Session | None = None
    security_group_ids: list[str] | None = UNSET
    subnets: list[str] | None = UNSET
    tags: list[tuple[str, str]] | list[dict[str, str]] | dict[str, str] | None = UNSET
    volume_kms_key: str | None = UNSET
    volume_size: int = UNSET
    encrypt_inter_container_traffic: bool | None = UNSET
    spark_config: object = UNSET
    use_spot_instances: bool = UNSET
    max_wait_time_in_seconds: int | None = UNSET
    disable_output_compression: bool = False
    use_torchrun: bool = False
    use_mpirun: bool = False
    nproc_per_node: int | None = UNSET
    # shoal's own (enable_session_tag_chaining is SageMaker's Estimator's; accepted here too)
    enable_session_tag_chaining: bool | None = UNSET
    allow_cpu_fallback: bool = False
    stop_grace_period_in_seconds: float = 10.0

    @classmethod
    def from_arguments(cls, args: Mapping[str, Any]) -> RemoteOptions:
        """The options from a signature that declares them all (``remote``,
        ``RemoteExecutor``): *args* is its ``locals()``."""
        opts = cls(**{k: v for k, v in args.items() if k in _NAMES})
        opts.validate()
        return opts

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any]) -> RemoteOptions:
        unknown = sorted(set(kwargs) - _NAMES)
        if unknown:
            raise InvalidArgumentError(
                f"unknown argument(s) {', '.join(unknown)}; @remote and RemoteExecutor accept "
                f"SageMaker's names: {', '.join(sorted(_NAMES))}", arguments=unknown)
        opts = cls(**kwargs)
        opts.validate()
        return opts

    def validate(self) -> None:
        """Check what needs no defaults config (the rest is checked by ``build_spec``)."""
        JobOptions(**self._knobs())
        if self.instance_count != 1 and not self.use_torchrun:
            raise InvalidArgumentError(
                f"instance_count={self.instance_count} runs the function as several ranks, "
                "which needs use_torchrun=True (as on SageMaker); or use instance_count=1",
                argument="instance_count")
        if self.nproc_per_node not in (UNSET, None):
            positive(self.nproc_per_node, "nproc_per_node")
            if not self.use_torchrun:
                raise InvalidArgumentError("nproc_per_node applies with use_torchrun=True",
                                           argument="nproc_per_node")
        for name, issue in _NOT_YET.items():
            value = getattr(self, name)
            if value not in (UNSET, None, False, 0, (), []):
                raise InvalidArgumentError(
                    f"{name} is not supported by this version of shoal yet (TODO({issue})); "
                    "remove it to run the job", argument=name)

    def _knobs(self) -> dict[str, Any]:
        return {"instance_count": self.instance_count,
                "keep_alive_period_in_seconds": self.keep_alive_period_in_seconds,
                "max_runtime_in_seconds": self.max_runtime_in_seconds,
                "max_retry_attempts": self.max_retry_attempts,
                "allow_cpu_fallback": self.allow_cpu_fallback,
                "stop_grace_period_in_seconds": self.stop_grace_period_in_seconds}

    def sources(self, defaults: DefaultsConfig) -> dict[str, str]:
        """Where each option's value comes from: "explicit argument" (passed, and not its
        default), the defaults file that set it ("user file /path"), else the default. Only
        the options not at their default are listed, with ``"*": "default"`` for the rest
        (a spec stays small, and an empty mapping still means "not recorded")."""
        out = {"*": "default"}
        for f in _FIELDS:
            value = getattr(self, f.name)
            config_key = _CONFIG_KEYS.get(f.name)
            configured = defaults.remote_function.get(config_key) if config_key else None
            explicit = value is not UNSET and (f.default is UNSET or value != f.default)
            if explicit and f.name == "tags" and configured is not None:  # both are merged
                out[f.name] = f"explicit argument, then {configured.source}"
            elif explicit:
                out[f.name] = "explicit argument"
            elif configured is not None:
                out[f.name] = configured.source
        return out

    def job_options(self, defaults: DefaultsConfig) -> JobOptions:
        """These options with the defaults config applied."""
        return JobOptions(instance_type=self.resolve("instance_type", defaults) or "local",
                          environment_variables=self.resolve("environment_variables",
                                                             defaults) or {},
                          tags=self._tags(defaults), **self._knobs())

    # --- resolution -------------------------------------------------------------------

    def resolve(self, key: str, defaults: DefaultsConfig) -> Any:
        value = getattr(self, key)
        if value is not UNSET:
            return value
        config_key = _CONFIG_KEYS.get(key)
        return defaults.get(config_key) if config_key else None

    def build_job(self, func: Callable[..., Any], session: Session, *,
                  call_args: tuple[Any, ...] = ()) -> tuple[JobSpec, dict[str, bytes]]:
        """The JobSpec plus the files that travel with the job (packed workdir, captured
        requirements)."""
        spec = self.build_spec(func, session)
        checkpoint = find_checkpoint_location(call_args)
        if checkpoint is not None:  # recorded like an estimator's CheckpointConfig
            spec = dataclasses.replace(spec, checkpoint_s3_uri=checkpoint.s3_uri)
        files: dict[str, bytes] = {}
        shipped = bool(self.resolve("include_local_workdir", session.defaults))
        if spec.dependencies == AUTO_CAPTURE:
            from shoal.envs.capture import capture_requirements, require_no_editable

            captured = capture_requirements(func, extra_objects=call_args)
            require_no_editable(captured, shipped_workdir=Path.cwd() if shipped else None)
            files["env/requirements.txt"] = ("\n".join(captured.requirements) + "\n").encode()
        if shipped:
            from shoal.envs.workdir import pack_workdir

            packed = pack_workdir(Path.cwd(), file_filter=self._file_filter(session.defaults),
                                  max_bytes=WORKDIR_MAX_BYTES)
            files[f"workdir/{packed.sha256}.zip"] = packed.data
            spec = dataclasses.replace(spec, workdir=Workdir(packed.sha256, packed.files,
                                                             packed.size_bytes))
        return spec, files

    def _file_filter(self, defaults: DefaultsConfig) -> Any:
        value = self.resolve("custom_file_filter", defaults)
        if isinstance(value, Mapping):  # the config file's {IgnoreNamePatterns: [...]}
            from shoal.remote_function._filter import CustomFileFilter

            return CustomFileFilter(ignore_name_patterns=value.get("IgnoreNamePatterns", []))
        return value

    def build_spec(self, func: Callable[..., Any], session: Session) -> JobSpec:
        """Turn these options, the session's defaults and *func* into a JobSpec."""
        defaults = session.defaults
        for name, issue in _NOT_YET.items():
            if name in _CONFIG_KEYS and getattr(self, name) is UNSET and \
                    defaults.get(_CONFIG_KEYS[name]) not in (None, False, [], ""):
                raise InvalidArgumentError(
                    f"{_CONFIG_KEYS[name]} is set in {defaults.remote_function[_CONFIG_KEYS[name]].source} "
                    f"but is not supported by this version of shoal yet (TODO({issue}))",
                    key=_CONFIG_KEYS[name])
        options = self.job_options(defaults)
        inert = {}
        for name in _INERT:
            value = self.resolve(name, defaults)
            if value not in (UNSET, None, False):
                inert[name] = value
                session.report_inert(name, f"{name}={value!r} has no effect on the "
                                           f"{session.settings.backend} backend; it is kept "
                                           "on the job record")
        commands, script = self._pre_execution(defaults)
        run = current_run_context()  # the job's load_run() finds the caller's run
        per_node = self.nproc_per_node if self.nproc_per_node not in (UNSET, None) else None
        return job_spec(
            options, session.settings,
            name=new_job_name(self.job_name_prefix or str(getattr(func, "__name__", "job"))),
            kind=JobKind.FUNCTION,
            function_name=f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', '?')}",
            distribution=options.ranks(torchrun=True, per_host=per_node)
            if self.use_torchrun else None,
            dependencies=self._dependencies(defaults), pre_execution_commands=commands,
            pre_execution_script=script, inert_settings=inert, sys_path=_import_path(),
            run=None if run is None else RunRef.from_json(run),
            conda_env=self._conda_env(defaults),
            # a conda file's python= must then be the client's
            strict_versions=session.settings.strict_versions, backend=session.backend_name,
            option_sources=self.sources(defaults))

    def _conda_env(self, defaults: DefaultsConfig) -> str | None:
        conda_env = self.resolve("job_conda_env", defaults)
        if conda_env in (None, UNSET, ""):
            return None
        if not isinstance(conda_env, str) or not conda_env.strip():
            raise InvalidArgumentError("job_conda_env must be the name of a conda "
                                       "environment", argument="job_conda_env")
        deps = self.resolve("dependencies", defaults)
        if isinstance(deps, str) and deps.endswith((".yml", ".yaml")):
            raise InvalidArgumentError("give job_conda_env or a conda environment file as "
                                       "dependencies, not both; to add packages to the named "
                                       "environment give a requirements.txt",
                                       argument="job_conda_env")
        return conda_env.strip()

    def _dependencies(self, defaults: DefaultsConfig) -> str | None:
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

    def _pre_execution(self, defaults: DefaultsConfig) -> tuple[tuple[str, ...], str | None]:
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

    def _tags(self, defaults: DefaultsConfig) -> tuple[tuple[str, str], ...]:
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


_NAMES = frozenset(f.name for f in dataclasses.fields(RemoteOptions))
#: The options whose source a job records (the session is where it runs, not an option).
_FIELDS = tuple(f for f in dataclasses.fields(RemoteOptions) if f.name != "sagemaker_session")

