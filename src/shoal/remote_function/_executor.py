"""RemoteExecutor: a ``concurrent.futures.Executor`` whose work items are tracked jobs."""

from __future__ import annotations

import collections
import concurrent.futures.thread  # noqa: F401 - see _python_exit
import dataclasses
import functools
import itertools
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future
from concurrent.futures import TimeoutError as FuturesTimeout
from concurrent.futures._base import (  # the states Future.cancel() itself uses
    CANCELLED,
    CANCELLED_AND_NOTIFIED,
    FINISHED,
    RUNNING,
)
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shoal.core.jobs import JobKind, JobSpec
from shoal.core.ports import JobQuery
from shoal.errors import BackendUnavailableError, InvalidArgumentError, JobNotFound
from shoal.jobs.options import is_ray, keep_alive_seconds
from shoal.remote_function._options import UNSET, RemoteOptions
from shoal.remote_function._runs import run_call, submit_calls

if TYPE_CHECKING:
    from shoal.jobs.service import JobService
    from shoal.session import Session

__all__ = ["RemoteExecutor", "RemoteFuture", "get_future", "list_futures"]


class RemoteFuture(Future[Any]):  # Any: what the job's function returns
    """A ``concurrent.futures.Future`` bound to a job; ``cancel()`` also stops a running job."""

    def __init__(self) -> None:
        super().__init__()
        self._job_name: str | None = None
        self._service: JobService | None = None
        self._job_ready = threading.Event()
        #: A BackendUnavailableError its wait ended with, once the caller has been given it:
        #: the next result() or exception() waits for the job again (the cluster may be back).
        self._unavailable_seen = False

    @property
    def job_name(self) -> str | None:
        return self._job_name

    def _bind(self, service: JobService, job_name: str) -> None:
        self._service, self._job_name = service, job_name
        self._job_ready.set()

    def cancel(self) -> bool:
        with self._condition:
            if self._state == FINISHED:
                return False
            if self._state in (CANCELLED, CANCELLED_AND_NOTIFIED):
                return True
            running = self._state == RUNNING
        if not running:
            return super().cancel()
        # A running job: ask it to stop, then settle the future as cancelled now.
        self._job_ready.wait()  # set as soon as the job is recorded (or failed to be)
        if self._service is not None and self._job_name is not None:
            self._service.cancel(self._job_name)
        with self._condition:
            if self._state == FINISHED:
                return False
            self._state = CANCELLED_AND_NOTIFIED
            for waiter in self._waiters:
                waiter.add_cancelled(self)
            self._condition.notify_all()
        # Future.cancel()'s own last step (CPython's concurrent.futures; not in typeshed).
        self._invoke_callbacks()  # type: ignore[attr-defined]
        return True

    def result(self, timeout: float | None = None) -> Any:
        self._wait_again(timeout)
        try:
            return super().result(timeout)
        except BackendUnavailableError:
            self._unavailable_seen = True
            raise

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait_again(timeout)
        error = super().exception(timeout)
        if isinstance(error, BackendUnavailableError):
            self._unavailable_seen = True
        return error

    def _wait_again(self, timeout: float | None) -> None:
        """A future whose wait ended because the cluster did not answer (and whose caller
        was told so) follows its job again: it then holds what the job ended with, or the
        same kind of error while the cluster is still away."""
        with self._condition:
            if not (self._unavailable_seen and self._state == FINISHED
                    and isinstance(self._exception, BackendUnavailableError)):
                return
        if self._service is None or self._job_name is None:
            return
        try:
            record = self._service.wait(self._job_name, timeout=timeout)
        except TimeoutError as e:
            raise FuturesTimeout(f"job {self._job_name} did not end within {timeout} s") from e
        except BackendUnavailableError as e:
            self._replace(error=e)
            return
        try:
            value = self._service.outcome(record)
        except BaseException as e:  # the job's own exception, from now on
            self._replace(error=e)
        else:
            self._replace(value=value)

    def _replace(self, *, value: Any = None, error: BaseException | None = None) -> None:
        with self._condition:
            self._result, self._exception = value, error
            self._unavailable_seen = False

    def _settle(self, fn: Callable[[], Any]) -> None:
        try:
            value = fn()
        except BaseException as e:  # the job's own exception travels to the caller
            with self._condition:
                if self._state in (CANCELLED, CANCELLED_AND_NOTIFIED):
                    return
            self.set_exception(e)
        else:
            with self._condition:
                if self._state in (CANCELLED, CANCELLED_AND_NOTIFIED):
                    return
            self.set_result(value)


_STOP = object()
#: Executors with workers; at interpreter exit each is shut down and waited for, as
#: concurrent.futures.thread does for ThreadPoolExecutor (its workers are daemon threads too).
_LIVE: weakref.WeakSet[RemoteExecutor] = weakref.WeakSet()
_exiting = False


def _python_exit() -> None:
    """Before the interpreter shuts down: run every submitted call to its end. (The calls
    may import what registers such hooks itself, which fails from here on: fsspec imports
    concurrent.futures.thread, so that is imported above, before shutdown.)"""
    global _exiting
    _exiting = True
    for executor in list(_LIVE):
        executor.shutdown(wait=True)


threading._register_atexit(_python_exit)  # type: ignore[attr-defined]  # the stdlib's own hook
#: Most calls a warm worker is handed at once when map() is given no chunksize.
AUTO_CHUNK = 64


@dataclass(slots=True)
class _Item:
    """A submitted call waiting for an executor thread."""

    future: RemoteFuture
    session: Session
    spec: JobSpec
    files: dict[str, bytes]
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    #: Most calls that may be handed to a warm worker with this one (1: alone).
    chunk: int = 1


class RemoteExecutor(Executor):
    """Run functions as jobs, at most ``max_parallel_jobs`` at a time (SageMaker's names).

    With a warm pool (``keep_alive_period_in_seconds`` > 0), calls of one function that wait
    in the queue are handed to a warm worker together (see ``map``'s ``chunksize``); each is
    still its own job, with its own record, log, result and end state.

    Example:
        >>> with RemoteExecutor(instance_type="ml.m5.large", max_parallel_jobs=2) as e:  # doctest: +SKIP
        ...     futures = [e.submit(square, i) for i in range(4)]
    """

    def __init__(
            self, *, dependencies: str | None = UNSET,
            pre_execution_commands: list[str] | None = UNSET,
            pre_execution_script: str | None = UNSET,
            environment_variables: dict[str, str] | None = UNSET,
            image_uri: str | None = UNSET, include_local_workdir: bool | None = UNSET,
            custom_file_filter: Any = UNSET, instance_count: int = 1,
            instance_type: str | None = UNSET, job_conda_env: str | None = UNSET,
            job_name_prefix: str | None = None, keep_alive_period_in_seconds: float = 0,
            max_parallel_jobs: int = 1, max_retry_attempts: int = 1,
            max_runtime_in_seconds: int = 24 * 3600, role: str | None = UNSET,
            s3_kms_key: str | None = UNSET, s3_root_uri: str | None = UNSET,
            sagemaker_session: Session | None = None, security_group_ids: list[str] | None = UNSET,
            subnets: list[str] | None = UNSET, tags: Any = UNSET,
            volume_kms_key: str | None = UNSET, volume_size: int = UNSET,
            encrypt_inter_container_traffic: bool | None = UNSET, spark_config: Any = UNSET,
            use_spot_instances: bool = UNSET, max_wait_time_in_seconds: int | None = UNSET,
            disable_output_compression: bool = False, use_torchrun: bool = False,
            use_mpirun: bool = False, nproc_per_node: int | None = UNSET,
            enable_session_tag_chaining: bool | None = UNSET,
            allow_cpu_fallback: bool = False,
            stop_grace_period_in_seconds: float = 10.0) -> None:
        """SageMaker's ``RemoteExecutor`` parameters, in its order (all keyword-only), then
        shoal's own, as for ``@remote``."""
        if not isinstance(max_parallel_jobs, int) or max_parallel_jobs < 1:
            raise InvalidArgumentError(f"max_parallel_jobs must be a positive integer, got "
                                       f"{max_parallel_jobs!r}", argument="max_parallel_jobs")
        self._options = RemoteOptions.from_arguments(locals())
        self._max = max_parallel_jobs
        self._items: collections.deque[_Item | object] = collections.deque()
        self._workers: list[threading.Thread] = []
        self._shutdown = False
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)

    def _session(self) -> Session:
        from shoal.session import current

        return self._options.sagemaker_session or current()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> RemoteFuture:
        return self._submit(fn, args, kwargs)

    def _submit(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                *, after_shutdown: bool = False, chunk: int = AUTO_CHUNK) -> RemoteFuture:
        # A map() iterator opened before shutdown() may still refill its window: like the
        # standard library's map, which submits everything up front, its inputs are owed.
        with self._lock:
            if self._shutdown and not after_shutdown:
                raise RuntimeError("cannot submit to a RemoteExecutor after shutdown()")
            if _exiting:
                raise RuntimeError("cannot submit to a RemoteExecutor after interpreter "
                                   "shutdown began")
            future = RemoteFuture()
            # Build the spec now: bad options or config fail at submit(), not in a thread.
            session = self._session()
            spec, files = self._options.build_job(fn, session,
                                                  call_args=(*args, *kwargs.values()))
            item = _Item(future, session, spec, files, fn, args, kwargs,
                         chunk if _batchable(spec, files, session) else 1)
            self._items.append(item)
            if self._shutdown:
                # The workers were told to stop: this late item brings its own, which stops
                # after it (FIFO: the item is taken before the stop that follows it).
                self._items.append(_STOP)
                self._spawn_worker()
            elif len(self._workers) < self._max:
                self._spawn_worker()
            self._ready.notify()
        return future

    def _spawn_worker(self) -> None:
        t = threading.Thread(target=self._work, name=f"shoal-executor-{len(self._workers)}",
                             daemon=True)
        self._workers.append(t)
        _LIVE.add(self)
        t.start()

    def _take(self) -> list[_Item] | None:
        """The next call, with the calls queued behind it that may share its hand-over (at
        most its chunk, and a fair share of the queue); None: stop."""
        with self._ready:
            while not self._items:
                self._ready.wait()
            first = self._items.popleft()
            if not isinstance(first, _Item):
                return None
            taken = [first]
            if first.chunk > 1:
                share = -(-(len(self._items) + 1) // self._max)  # ceil: every worker gets some
                limit = min(first.chunk, share)
                while self._items and len(taken) < limit:
                    nxt = self._items[0]
                    if not isinstance(nxt, _Item) or not _same_batch(first, nxt):
                        break
                    taken.append(nxt)
                    self._items.popleft()
            return taken

    def _work(self) -> None:
        while (items := self._take()) is not None:
            live = [i for i in items if i.future.set_running_or_notify_cancel()]
            if live and (len(live) > 1 or live[0].chunk > 1):
                self._run_batch(live)
                continue
            for item in live:
                item.future._settle(functools.partial(self._run, item))

    @staticmethod
    def _run(item: _Item) -> Any:
        service = item.session.jobs
        try:  # _bind sets _job_ready once the name is known; a failed submit sets it too
            return run_call(service, item.session.runs, item.spec, item.fn, (item.args, item.kwargs),
                            files=item.files,
                            submitted=functools.partial(item.future._bind, service))
        finally:
            item.future._job_ready.set()

    def _run_batch(self, items: list[_Item]) -> None:
        """Several calls handed to one warm worker together; each settles as its job ends."""
        service = items[0].session.jobs
        try:
            batch = submit_calls(service, items[0].session.runs, [i.spec for i in items],
                                 items[0].fn, [(i.args, i.kwargs) for i in items])
        except BaseException:
            # Nothing was recorded (a call that does not pickle, a name taken): one by one,
            # so each call gets its own outcome.
            for item in items:
                item.future._settle(functools.partial(self._run, item))
            return
        futures = {}
        for item, name in zip(items, batch.names, strict=True):
            item.future._bind(service, name)
            futures[name] = item.future
        try:
            for name, outcome in batch.outcomes():
                futures.pop(name)._settle(outcome)
        except BaseException as e:  # a store failure: no future is left waiting
            for future in futures.values():
                future._settle(functools.partial(_raise, e))

    def map(self, fn: Callable[..., Any], *iterables: Iterable[Any],
            timeout: float | None = None, chunksize: int | None = None) -> Iterator[Any]:
        """Results in input order; inputs are consumed lazily, a window ahead of the results.

        *chunksize*: with a warm pool, at most this many calls are handed to a worker at once
        (each still its own job); None lets shoal choose (up to 64 of the calls waiting); 1
        hands them over one by one. Without a warm pool it has no effect, as with
        ``ThreadPoolExecutor``.
        """
        if chunksize is not None and (not isinstance(chunksize, int) or chunksize < 1):
            raise InvalidArgumentError(f"chunksize must be >= 1, got {chunksize!r}",
                                       argument="chunksize")
        chunk = chunksize or AUTO_CHUNK
        end = None if timeout is None else time.monotonic() + timeout
        args_iter = zip(*iterables, strict=False)
        window: collections.deque[RemoteFuture] = collections.deque()
        session = self._session()
        warm = keep_alive_seconds(self._options.keep_alive_period_in_seconds,
                                  session.settings, backend=session.backend_name) > 0
        # Enough calls ahead that every worker has a full hand-over waiting.
        ahead = max(2 * self._max * (chunk if warm else 1), 4)
        for args in itertools.islice(args_iter, ahead):
            window.append(self._submit(fn, args, {}, chunk=chunk))

        def results() -> Iterator[Any]:
            try:
                while window:
                    future = window.popleft()
                    left = None if end is None else end - time.monotonic()
                    if left is not None and left <= 0:
                        raise FuturesTimeout(f"map() timed out after {timeout} s")
                    try:
                        value = future.result(left)
                    except BaseException:
                        future.cancel()  # as the standard library does: no orphaned job
                        raise
                    for args in itertools.islice(args_iter, 1):
                        window.append(self._submit(fn, args, {}, after_shutdown=True,
                                                   chunk=chunk))
                    yield value
            finally:
                for f in window:
                    f.cancel()

        return results()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            if cancel_futures:
                for item in self._items:
                    if isinstance(item, _Item):
                        item.future.cancel()
            for _ in self._workers:
                self._items.append(_STOP)
            self._ready.notify_all()
        if wait:
            for t in self._workers:
                t.join()


def _raise(error: BaseException) -> Any:
    raise error


def _batchable(spec: JobSpec, files: dict[str, bytes], session: Session) -> bool:
    """Calls that a warm worker can take in a batch: a plain function on the client's own
    interpreter, run once (no environment to build, workdir, pre-execution or retries), on
    a backend with warm workers (local, and Ray's warm actors)."""
    settings = session.settings
    return (spec.keep_alive_period_in_seconds > 0 and spec.kind == JobKind.FUNCTION
            and not files and not spec.dependencies and not spec.conda_env
            and spec.distribution is None
            and not spec.pre_execution_commands and not spec.pre_execution_script
            and spec.max_retry_attempts <= 1
            and not spec.checkpoint_s3_uri  # its supervisor syncs them
            and (session.backend_name == "local" or is_ray(settings, session.backend_name))
            and settings.job_process == "fork")


def _same_batch(a: _Item, b: _Item) -> bool:
    """One hand-over takes calls of one function whose jobs differ only in their names."""
    return (a.fn is b.fn and a.session is b.session and a.chunk == b.chunk
            and dataclasses.replace(b.spec, name=a.spec.name) == a.spec)


def _future_for(service: JobService, name: str) -> RemoteFuture:
    record = service.get(name)
    future = RemoteFuture()
    future.set_running_or_notify_cancel()
    future._bind(service, record.name)

    def settle() -> None:
        rec = service.wait(record.name)
        future._settle(lambda: service.outcome(rec))

    if record.is_terminal:
        settle()
    else:
        threading.Thread(target=settle, name=f"shoal-future-{name}", daemon=True).start()
    return future


def get_future(job_name: str, sagemaker_session: Session | None = None) -> RemoteFuture:
    """A future for an existing job, from any process (SageMaker's ``get_future``)."""
    from shoal.session import current

    service = (sagemaker_session or current()).jobs
    return _future_for(service, job_name)


def list_futures(job_name_prefix: str, sagemaker_session: Session | None = None) -> Iterator[RemoteFuture]:
    """Futures of the jobs whose names start with *job_name_prefix*, newest first."""
    from shoal.session import current

    service = (sagemaker_session or current()).jobs
    # Job names are made from function names the way SageMaker makes them ('_' -> '-').
    prefix = job_name_prefix.replace("_", "-").lower()
    for record in service.metadata.list_jobs(JobQuery(name_prefix=prefix, limit=10000)):
        try:
            yield _future_for(service, record.name)
        except JobNotFound:
            continue

