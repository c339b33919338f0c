"""RemoteExecutor: a ``concurrent.futures.Executor`` whose work items are tracked jobs."""

from __future__ import annotations

import collections
import functools
import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future
from concurrent.futures import TimeoutError as FuturesTimeout
from concurrent.futures._base import (  # the states Future.cancel() itself uses
    CANCELLED,
    CANCELLED_AND_NOTIFIED,
    FINISHED,
    RUNNING,
)
from typing import Any

from shoal.core.ports import JobQuery
from shoal.errors import InvalidArgumentError, JobNotFound
from shoal.remote_function._options import RemoteOptions
from shoal.remote_function._runs import link_to_run

__all__ = ["RemoteExecutor", "RemoteFuture", "get_future", "list_futures"]


class RemoteFuture(Future):  # type: ignore[type-arg]
    """A ``concurrent.futures.Future`` bound to a job; ``cancel()`` also stops a running job."""

    def __init__(self) -> None:
        super().__init__()
        self._job_name: str | None = None
        self._service: Any = None
        self._job_ready = threading.Event()

    @property
    def job_name(self) -> str | None:
        return self._job_name

    def _bind(self, service: Any, job_name: str) -> None:
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
        self._invoke_callbacks()
        return True

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


class RemoteExecutor(Executor):
    """Run functions as jobs, at most ``max_parallel_jobs`` at a time (SageMaker's names).

    Example:
        >>> with RemoteExecutor(instance_type="ml.m5.large", max_parallel_jobs=2) as e:  # doctest: +SKIP
        ...     futures = [e.submit(square, i) for i in range(4)]
    """

    def __init__(self, *, max_parallel_jobs: int = 1, **kwargs: Any) -> None:
        if not isinstance(max_parallel_jobs, int) or max_parallel_jobs < 1:
            raise InvalidArgumentError(f"max_parallel_jobs must be a positive integer, got "
                                       f"{max_parallel_jobs!r}", argument="max_parallel_jobs")
        self._options = RemoteOptions.from_kwargs(kwargs)
        self._max = max_parallel_jobs
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self._shutdown = False
        self._lock = threading.Lock()
        self._pending: collections.deque[RemoteFuture] = collections.deque()

    def _session(self) -> Any:
        from shoal.session import current

        return self._options.sagemaker_session or current()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> RemoteFuture:
        return self._submit(fn, args, kwargs)

    def _submit(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                *, after_shutdown: bool = False) -> RemoteFuture:
        # A map() iterator opened before shutdown() may still refill its window: like the
        # standard library's map, which submits everything up front, its inputs are owed.
        with self._lock:
            if self._shutdown and not after_shutdown:
                raise RuntimeError("cannot submit to a RemoteExecutor after shutdown()")
            future = RemoteFuture()
            # Build the spec now: bad options or config fail at submit(), not in a thread.
            session = self._session()
            spec, files = self._options.build_job(fn, session,
                                                  call_args=(*args, *kwargs.values()))
            self._pending.append(future)
            self._queue.put((future, session, (spec, files), fn, args, kwargs))
            if self._shutdown:
                # The workers were told to stop: this late item brings its own, which stops
                # after it (FIFO: the item is taken before the stop that follows it).
                self._queue.put(_STOP)
                self._spawn_worker()
            elif len(self._workers) < self._max:
                self._spawn_worker()
        return future

    def _spawn_worker(self) -> None:
        t = threading.Thread(target=self._work, name=f"shoal-executor-{len(self._workers)}",
                             daemon=True)
        self._workers.append(t)
        t.start()

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            future, session, spec, fn, args, kwargs = item
            with self._lock:
                if future in self._pending:
                    self._pending.remove(future)
            if not future.set_running_or_notify_cancel():
                continue
            future._settle(functools.partial(self._run, future, session, spec, fn, args, kwargs))

    @staticmethod
    def _run(future: RemoteFuture, session: Any, job: Any, fn: Callable[..., Any],
             args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        service = session.jobs
        spec, files = job
        try:
            record = service.submit_function(spec, fn, args, kwargs, files=files)
        except BaseException:
            future._job_ready.set()
            raise
        future._bind(service, record.name)  # sets _job_ready once the name is known
        link_to_run(service.metadata, spec, record.name)
        record = service.wait(record.name)
        return service.outcome(record)

    def map(self, fn: Callable[..., Any], *iterables: Iterable[Any],
            timeout: float | None = None, chunksize: int = 1) -> Iterator[Any]:
        """Results in input order; inputs are consumed lazily, a window ahead of the results."""
        end = None if timeout is None else time.monotonic() + timeout
        args_iter = zip(*iterables, strict=False)
        window: collections.deque[RemoteFuture] = collections.deque()
        ahead = max(2 * self._max, 4)
        for args in itertools.islice(args_iter, ahead):
            window.append(self.submit(fn, *args))

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
                        window.append(self._submit(fn, args, {}, after_shutdown=True))
                    yield value
            finally:
                for f in window:
                    f.cancel()

        return results()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            if cancel_futures:
                for f in list(self._pending):
                    f.cancel()
            for _ in self._workers:
                self._queue.put(_STOP)
        if wait:
            for t in self._workers:
                t.join()


def _future_for(service: Any, name: str) -> RemoteFuture:
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


def get_future(job_name: str, sagemaker_session: Any = None) -> RemoteFuture:
    """A future for an existing job, from any process (SageMaker's ``get_future``)."""
    from shoal.session import current

    service = (sagemaker_session or current()).jobs
    return _future_for(service, job_name)


def list_futures(job_name_prefix: str, sagemaker_session: Any = None) -> Iterator[RemoteFuture]:
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

