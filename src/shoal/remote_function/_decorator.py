"""``@remote``: each call of the decorated function is one tracked job.

The decorator records intent only; the call submits, streams the job's log, and returns the
result or re-raises the function's own exception with the remote traceback.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

from shoal.jobs.options import is_ray
from shoal.remote_function._executor import _batchable
from shoal.remote_function._options import UNSET, RemoteOptions
from shoal.remote_function._runs import run_call, submit_calls

if TYPE_CHECKING:
    from shoal.session import Session

_P = ParamSpec("_P")
_R = TypeVar("_R")

__all__ = ["remote"]



def _session(options: RemoteOptions) -> Session:
    from shoal.session import current

    return options.sagemaker_session or current()


def _stream(chunk: bytes) -> None:
    # The job's output is the user's data: it goes to the caller's stdout as it arrives.
    out = sys.stdout
    out.write(chunk.decode(errors="replace"))
    out.flush()


def run_job(options: RemoteOptions, func: Callable[..., Any], args: tuple[Any, ...],
            kwargs: dict[str, Any], *, stream: bool) -> Any:
    session = _session(options)
    spec, files = options.build_job(func, session, call_args=(*args, *kwargs.values()))
    service = session.jobs
    on_terminal = stream and sys.stdout.isatty()
    if is_ray(session.settings, session.backend_name) and _batchable(spec, files, session) \
            and not on_terminal:
        # On Ray: the call goes to a warm supervisor actor as a batch of one (one transaction
        # creates its record, one file holds its payloads, the result comes back with the
        # news). Read to the end: the actor is handed the next call only once it said it
        # is done.
        batch = submit_calls(service, session.runs, [spec], func, [(args, kwargs)])
        [(_name, outcome)] = list(batch.outcomes(on_output=_stream if stream else None))
        return outcome()
    if on_terminal:
        with _Progress(spec.name) as progress:
            return run_call(service, session.runs, spec, func, (args, kwargs), files=files,
                            submitted=progress.named, on_output=progress.output,
                            on_status=progress.status)
    return run_call(service, session.runs, spec, func, (args, kwargs), files=files,
                    on_output=_stream if stream else None)


class _Progress:
    """On a terminal: a spinner with the job's phase (queued, environment, running) while the
    job's own output scrolls above it."""

    def __init__(self, job: str) -> None:
        from rich.console import Console

        self._console = Console()
        self._job = job
        self._status = self._console.status(f"job {job}: submitted")

    def __enter__(self) -> _Progress:
        self._status.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._status.__exit__(None, None, None)

    def named(self, job: str) -> None:
        self._job = job

    def output(self, chunk: bytes) -> None:
        self._console.out(chunk.decode(errors="replace"), end="", highlight=False)

    def status(self, record: Any) -> None:
        phase = {"pending": "waiting for a slot", "starting": "preparing the environment",
                 "running": "running", "stopping": "stopping"}.get(str(record.status),
                                                                    str(record.status))
        self._status.update(f"job {self._job}: {phase}")


@overload
def remote(
        _func: Callable[_P, _R], *, dependencies: str | None = UNSET,
        pre_execution_commands: list[str] | None = UNSET,
        pre_execution_script: str | None = UNSET,
        environment_variables: dict[str, str] | None = UNSET, image_uri: str | None = UNSET,
        include_local_workdir: bool | None = UNSET, custom_file_filter: Any = UNSET,
        instance_count: int = 1, instance_type: str | None = UNSET,
        job_conda_env: str | None = UNSET, job_name_prefix: str | None = None,
        keep_alive_period_in_seconds: float = 0, max_retry_attempts: int = 1,
        max_runtime_in_seconds: int = 24 * 3600, role: str | None = UNSET,
        s3_kms_key: str | None = UNSET, s3_root_uri: str | None = UNSET,
        sagemaker_session: Session | None = None, security_group_ids: list[str] | None = UNSET,
        subnets: list[str] | None = UNSET, tags: Any = UNSET,
        volume_kms_key: str | None = UNSET, volume_size: int = UNSET,
        encrypt_inter_container_traffic: bool | None = UNSET, spark_config: Any = UNSET,
        use_spot_instances: bool = UNSET, max_wait_time_in_seconds: int | None = UNSET,
        disable_output_compression: bool = False, use_torchrun: bool = False,
        use_mpirun: bool = False, nproc_per_node: int | None = UNSET,
        enable_session_tag_chaining: bool | None = UNSET, allow_cpu_fallback: bool = False,
        stop_grace_period_in_seconds: float = 10.0) -> Callable[_P, _R]: ...


@overload
def remote(
        _func: None = None, *, dependencies: str | None = UNSET,
        pre_execution_commands: list[str] | None = UNSET,
        pre_execution_script: str | None = UNSET,
        environment_variables: dict[str, str] | None = UNSET, image_uri: str | None = UNSET,
        include_local_workdir: bool | None = UNSET, custom_file_filter: Any = UNSET,
        instance_count: int = 1, instance_type: str | None = UNSET,
        job_conda_env: str | None = UNSET, job_name_prefix: str | None = None,
        keep_alive_period_in_seconds: float = 0, max_retry_attempts: int = 1,
        max_runtime_in_seconds: int = 24 * 3600, role: str | None = UNSET,
        s3_kms_key: str | None = UNSET, s3_root_uri: str | None = UNSET,
        sagemaker_session: Session | None = None, security_group_ids: list[str] | None = UNSET,
        subnets: list[str] | None = UNSET, tags: Any = UNSET,
        volume_kms_key: str | None = UNSET, volume_size: int = UNSET,
        encrypt_inter_container_traffic: bool | None = UNSET, spark_config: Any = UNSET,
        use_spot_instances: bool = UNSET, max_wait_time_in_seconds: int | None = UNSET,
        disable_output_compression: bool = False, use_torchrun: bool = False,
        use_mpirun: bool = False, nproc_per_node: int | None = UNSET,
        enable_session_tag_chaining: bool | None = UNSET, allow_cpu_fallback: bool = False,
        stop_grace_period_in_seconds: float = 10.0) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]: ...


def remote(
        _func: Callable[..., Any] | None = None, *, dependencies: str | None = UNSET,
        pre_execution_commands: list[str] | None = UNSET,
        pre_execution_script: str | None = UNSET,
        environment_variables: dict[str, str] | None = UNSET, image_uri: str | None = UNSET,
        include_local_workdir: bool | None = UNSET, custom_file_filter: Any = UNSET,
        instance_count: int = 1, instance_type: str | None = UNSET,
        job_conda_env: str | None = UNSET, job_name_prefix: str | None = None,
        keep_alive_period_in_seconds: float = 0, max_retry_attempts: int = 1,
        max_runtime_in_seconds: int = 24 * 3600, role: str | None = UNSET,
        s3_kms_key: str | None = UNSET, s3_root_uri: str | None = UNSET,
        sagemaker_session: Session | None = None, security_group_ids: list[str] | None = UNSET,
        subnets: list[str] | None = UNSET, tags: Any = UNSET,
        volume_kms_key: str | None = UNSET, volume_size: int = UNSET,
        encrypt_inter_container_traffic: bool | None = UNSET, spark_config: Any = UNSET,
        use_spot_instances: bool = UNSET, max_wait_time_in_seconds: int | None = UNSET,
        disable_output_compression: bool = False, use_torchrun: bool = False,
        use_mpirun: bool = False, nproc_per_node: int | None = UNSET,
        enable_session_tag_chaining: bool | None = UNSET, allow_cpu_fallback: bool = False,
        stop_grace_period_in_seconds: float = 10.0
        ) -> Callable[_P, _R] | Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Run each call of the function as a job (SageMaker's ``@remote``: its parameters, in its
    order, then shoal's ``enable_session_tag_chaining`` (no effect, reported),
    ``allow_cpu_fallback`` and ``stop_grace_period_in_seconds``).

    A parameter left out takes its value from the defaults config (``RemoteFunction`` in
    ``config.yaml``), as in SageMaker.

    Example:
        >>> @remote(instance_type="ml.m5.large")   # doctest: +SKIP
        ... def divide(x, y):
        ...     return x / y
        >>> divide(2, 3.0)                          # doctest: +SKIP
        0.6666666666666666
    """
    options = RemoteOptions.from_arguments(locals())

    def decorate(func: Callable[_P, _R]) -> Callable[_P, _R]:
        @functools.wraps(func)
        def wrapper(*args: _P.args, **kw: _P.kwargs) -> _R:
            result: _R = run_job(options, func, args, kw, stream=True)  # what func returned
            return result

        # RemoteExecutor and the batch runner read the options back from the function.
        wrapper.__shoal_options__ = options  # type: ignore[attr-defined]  # a mark on a plain function
        return wrapper

    if _func is not None:
        if not callable(_func):
            from shoal.errors import InvalidArgumentError

            raise InvalidArgumentError("@remote decorates a function; got "
                                       f"{type(_func).__name__}")
        return decorate(_func)
    return decorate
