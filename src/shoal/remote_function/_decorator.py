"""``@remote``: each call of the decorated function is one tracked job.

The decorator records intent only; the call submits, streams the job's log, and returns the
result or re-raises the function's own exception with the remote traceback.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar, overload

from shoal.remote_function._executor import _batchable
from shoal.remote_function._options import RemoteOptions, is_ray
from shoal.remote_function._runs import link_to_run

__all__ = ["remote"]

F = TypeVar("F", bound=Callable[..., Any])


def _session(options: RemoteOptions) -> Any:
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
    if is_ray(session.settings) and _batchable(spec, files, session) \
            and not (stream and sys.stdout.isatty()):
        return _run_warm(service, spec, func, args, kwargs, stream=stream)
    record = service.submit_function(spec, func, args, kwargs, files=files)
    link_to_run(service.metadata, spec, record.name)
    if stream and sys.stdout.isatty():
        with _Progress(record.name) as progress:
            record = service.wait(record.name, on_output=progress.output,
                                  on_status=progress.status)
    else:
        record = service.wait(record.name, on_output=_stream if stream else None)
    return service.outcome(record)


def _run_warm(service: Any, spec: Any, func: Callable[..., Any], args: tuple[Any, ...],
              kwargs: dict[str, Any], *, stream: bool) -> Any:
    """On Ray: the call goes to a warm supervisor actor as a batch of one (one transaction
    creates its record, one file holds its payloads, the result comes back with the news)."""
    batch = service.submit_batch([spec], func, [(args, kwargs)])
    link_to_run(service.metadata, spec, batch.names[0])
    # Read to the end: the actor is handed the next call only once it said it is done.
    [(_name, outcome)] = list(batch.outcomes(on_output=_stream if stream else None))
    return outcome()


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

    def output(self, chunk: bytes) -> None:
        self._console.out(chunk.decode(errors="replace"), end="", highlight=False)

    def status(self, record: Any) -> None:
        phase = {"pending": "waiting for a slot", "starting": "preparing the environment",
                 "running": "running", "stopping": "stopping"}.get(str(record.status),
                                                                    str(record.status))
        self._status.update(f"job {self._job}: {phase}")


@overload
def remote(_func: F) -> F: ...
@overload
def remote(_func: None = None, **kwargs: Any) -> Callable[[F], F]: ...


def remote(_func: Callable[..., Any] | None = None, **kwargs: Any) -> Any:
    """Run each call of the function as a job (SageMaker's ``@remote``, same arguments).

    Example:
        >>> @remote(instance_type="ml.m5.large")   # doctest: +SKIP
        ... def divide(x, y):
        ...     return x / y
        >>> divide(2, 3.0)                          # doctest: +SKIP
        0.6666666666666666
    """
    options = RemoteOptions.from_kwargs(kwargs)

    def decorate(func: Callable[..., Any]) -> Any:
        @functools.wraps(func)
        def wrapper(*args: Any, **kw: Any) -> Any:
            return run_job(options, func, args, kw, stream=True)

        wrapper.__shoal_options__ = options  # type: ignore[attr-defined]
        return wrapper

    if _func is not None:
        if not callable(_func):
            from shoal.errors import InvalidArgumentError

            raise InvalidArgumentError("@remote decorates a function; got "
                                       f"{type(_func).__name__}")
        return decorate(_func)
    return decorate
