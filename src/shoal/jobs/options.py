"""JobOptions: the knobs every job has, whoever asks for it (``@remote``, ``RemoteExecutor``,
``Estimator``), each declared, checked and defaulted here once; ``job_spec`` is the one way
from them to the JobSpec that is stored and run."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from shoal.core.clock import RandomIdFactory
from shoal.core.jobs import (
    Distribution,
    JobKind,
    JobName,
    JobSpec,
    RunRef,
    TrainingSpec,
    Workdir,
)
from shoal.core.resources import InstanceType, resolve_instance_type
from shoal.errors import InvalidArgumentError, ResourceUnavailableError

if TYPE_CHECKING:
    from shoal._internal.settings import Settings

__all__ = ["JobOptions", "check_gpus", "explicit_sources", "is_ray", "job_spec",
           "keep_alive_seconds", "new_job_name", "positive"]

#: SageMaker's range for ``keep_alive_period_in_seconds``.
KEEP_ALIVE_MAX_SECONDS = 3600


def positive(value: object, name: str) -> int:
    """*value* if it is a positive integer, else InvalidArgumentError naming *name*."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidArgumentError(f"{name} must be a positive integer, got {value!r}",
                                   argument=name)
    return value


@dataclass(frozen=True, slots=True)
class JobOptions:
    """What every job takes, checked on construction. ``keep_alive_period_in_seconds`` is
    float seconds (0: none asked for, see ``keep_alive_seconds``). *names* gives the caller's
    name of a knob where it is not SageMaker's ``@remote`` one (``Estimator``'s ``max_run``,
    ``environment``), for the errors."""

    instance_type: str = "local"
    instance_count: int = 1
    keep_alive_period_in_seconds: float = 0.0
    max_runtime_in_seconds: int = 24 * 3600
    max_retry_attempts: int = 1
    allow_cpu_fallback: bool = False
    stop_grace_period_in_seconds: float = 10.0
    environment_variables: Mapping[str, str] = field(default_factory=dict)
    tags: tuple[tuple[str, str], ...] = ()
    names: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for knob in ("max_runtime_in_seconds", "max_retry_attempts", "instance_count"):
            positive(getattr(self, knob), self._name(knob))
        keep = self.keep_alive_period_in_seconds
        if not isinstance(keep, int | float) or isinstance(keep, bool) or \
                not 0 <= keep <= KEEP_ALIVE_MAX_SECONDS:
            name = self._name("keep_alive_period_in_seconds")
            raise InvalidArgumentError(f"{name} must be a number of seconds from 0 to "
                                       f"{KEEP_ALIVE_MAX_SECONDS} (SageMaker's range), got "
                                       f"{keep!r}", argument=name)
        grace = self.stop_grace_period_in_seconds
        if not isinstance(grace, int | float) or isinstance(grace, bool) or grace < 0:
            raise InvalidArgumentError("stop_grace_period_in_seconds must be a number of seconds "
                                       f">= 0, got {grace!r}",
                                       argument="stop_grace_period_in_seconds")
        env = self.environment_variables
        if not isinstance(env, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in env.items()):
            name = self._name("environment_variables")
            raise InvalidArgumentError(f"{name} must map str to str", argument=name)
        # one type from here on: float seconds, a plain dict
        object.__setattr__(self, "keep_alive_period_in_seconds", float(keep))
        object.__setattr__(self, "stop_grace_period_in_seconds", float(grace))
        object.__setattr__(self, "environment_variables", dict(env))

    def _name(self, knob: str) -> str:
        return self.names.get(knob, knob)

    def resources(self) -> tuple[InstanceType, str | None]:
        """The instance type, and the CPU-fallback note when this machine lacks its GPUs
        (ResourceUnavailableError unless ``allow_cpu_fallback``)."""
        itype = resolve_instance_type(self.instance_type)
        return itype, check_gpus(itype.name, itype.gpus, self.allow_cpu_fallback)

    def ranks(self, *, torchrun: bool, per_host: int | None = None) -> Distribution:
        """``instance_count`` hosts of *per_host* processes; by default one per GPU with
        torchrun (one when the job falls back to the CPU), else one."""
        if per_host is None:
            itype, note = self.resources()
            per_host = max(1, 0 if note else itype.gpus) if torchrun else 1
        return Distribution(self.instance_count, per_host, torchrun)


def explicit_sources(options: JobOptions) -> dict[str, str]:
    """``JobSpec.option_sources`` of options that were passed as arguments and read from no
    defaults file (``Estimator``'s): "explicit argument" where a knob is not its default."""
    out = {"*": "default"}
    for f in dataclasses.fields(JobOptions):
        if f.name == "names":
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING \
            else f.default
        if getattr(options, f.name) != default:
            out[f.name] = "explicit argument"
    return out


def keep_alive_seconds(asked: float, settings: Settings, kind: JobKind = JobKind.FUNCTION,
                       *, backend: str | None = None) -> float:
    """The keep-alive a job gets: what it asked for; else, for a function job on Ray, the
    session's ``ray_keep_alive_seconds`` (warm supervisor actors serve such jobs by default);
    else none (SageMaker's default). *backend*: the one that runs the job (through a team
    server, the server's: ``Session.backend_name``), default *settings*'."""
    if asked or kind is not JobKind.FUNCTION or not is_ray(settings, backend):
        return float(asked)
    return float(settings.ray_keep_alive_seconds)


def new_job_name(base: str) -> str:
    """A fresh job name from *base* (a function's or script's name), as SageMaker makes them."""
    return str(RandomIdFactory().job_name(base, datetime.now(UTC)))


def job_spec(options: JobOptions, settings: Settings, *, name: str, kind: JobKind,
             function_name: str, distribution: Distribution | None = None,
             dependencies: str | None = None, pre_execution_commands: Sequence[str] = (),
             pre_execution_script: str | None = None,
             inert_settings: Mapping[str, object] | None = None,
             sys_path: Sequence[str] = (), run: RunRef | None = None,
             conda_env: str | None = None, strict_versions: bool = False,
             checkpoint_s3_uri: str | None = None, workdir: Workdir | None = None,
             training: TrainingSpec | None = None, sagemaker_alias: bool = False,
             framework_notices: Sequence[str] = (), backend: str | None = None,
             option_sources: Mapping[str, str] | None = None) -> JobSpec:
    """The JobSpec of a job with *options*, run on *backend* (default: *settings*'), with the
    parts only some jobs have; *option_sources*: where each option came from, recorded."""
    itype, gpu_note = options.resources()
    keep_alive = keep_alive_seconds(options.keep_alive_period_in_seconds, settings, kind,
                                    backend=backend)
    sources = dict(option_sources or {})
    if sources and keep_alive != options.keep_alive_period_in_seconds:
        sources["keep_alive_period_in_seconds"] = "setting ray_keep_alive_seconds (on Ray)"
    return JobSpec(
        name=JobName(name), kind=kind, function_name=function_name,
        instance_type=itype.name, cpus=float(itype.cpus),
        memory_mib=int(itype.memory_gib * 1024) or None,
        gpus=0 if gpu_note else itype.gpus, allow_cpu_fallback=options.allow_cpu_fallback,
        environment_variables=dict(options.environment_variables),
        dependencies=dependencies, pre_execution_commands=tuple(pre_execution_commands),
        pre_execution_script=pre_execution_script,
        max_runtime_in_seconds=options.max_runtime_in_seconds,
        max_retry_attempts=options.max_retry_attempts,
        stop_grace_period_in_seconds=options.stop_grace_period_in_seconds,
        keep_alive_period_in_seconds=keep_alive,
        tags=options.tags, python_version=f"{sys.version_info.major}.{sys.version_info.minor}",
        inert_settings=dict(inert_settings or {}), sys_path=tuple(sys_path), run=run,
        conda_env=conda_env, gpu_fallback=gpu_note, strict_versions=strict_versions,
        distribution=distribution, checkpoint_s3_uri=checkpoint_s3_uri, workdir=workdir,
        training=training, sagemaker_alias=sagemaker_alias,
        framework_notices=tuple(framework_notices), option_sources=sources)


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


def is_ray(settings: Settings, backend: str | None = None) -> bool:
    """Whether jobs run on Ray: *backend* (a session's ``backend_name``), else *settings*'."""
    backend = backend or settings.backend
    return backend == "ray" or backend.startswith("ray://")


def _visible_gpus() -> int:
    return len([p for p in Path("/dev").glob("nvidia[0-9]*")])
