"""Requests wait here for the model: ``InferenceQueue`` groups them into batches as they
arrive (LitServe's loop) and runs each batch on one inference thread, off the event loop.

A batch is whatever has queued up while the model was busy, up to ``max_batch_size``; when the
model is idle the first request waits at most ``max_batch_delay`` for company. So under load
batches grow by themselves, and a lone request pays no delay unless one is configured.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from shoal.serving._http import RequestError

__all__ = ["InferenceQueue"]

log = logging.getLogger(__name__)

_QUEUED, _TAKEN = 0, 1


class _Item:
    __slots__ = ("data", "future", "enqueued", "state")

    def __init__(self, data: Any, future: asyncio.Future[Any], enqueued: float) -> None:
        self.data = data
        self.future = future
        self.enqueued = enqueued
        self.state = _QUEUED


class InferenceQueue:
    """Bounded queue in front of ``run_batch(list) -> list`` (one result per item).

    ``submit`` raises ``RequestError`` 503 (with ``Retry-After``) when ``max_queue`` requests
    are already waiting, and 504 when the answer takes longer than its timeout; the model's
    thread cannot be interrupted, so a hung model keeps its thread while the server answers.
    """

    def __init__(self, run_batch: Callable[[list[Any]], list[Any]], *, max_batch_size: int,
                 max_batch_delay_s: float, max_queue: int,
                 on_batch: Callable[[int], None] = lambda n: None) -> None:
        self._run_batch = run_batch
        self._max = max_batch_size
        self._delay = max_batch_delay_s
        self._max_queue = max_queue
        self._on_batch = on_batch
        self._pending: deque[_Item] = deque()
        self._waiting = 0  # queued items whose caller still waits
        self._waiter: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def depth(self) -> int:
        """Requests waiting for the model (not counting the batch it is running)."""
        return self._waiting

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="shoal-inference")
        self._task = self._loop.create_task(self._collect(), name="shoal-batch-collector")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self._executor is not None:
            # A hung model's thread cannot be joined; do not wait for it.
            self._executor.shutdown(wait=False, cancel_futures=True)
        for item in self._pending:
            if not item.future.done():
                item.future.set_exception(RequestError(503, "shutting down",
                                                       "the server is stopping"))

    async def submit(self, data: Any, timeout_s: float) -> Any:
        loop = self._loop
        if loop is None:
            raise RuntimeError("InferenceQueue.start() was not called")
        if self._waiting >= self._max_queue:
            raise RequestError(503, "overloaded",
                               f"{self._waiting} requests are already waiting for the model (the "
                               f"limit is {self._max_queue}); retry shortly",
                               headers=((b"retry-after", b"1"),))
        item = _Item(data, loop.create_future(), loop.time())
        self._pending.append(item)
        self._waiting += 1
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        expiry = loop.call_later(timeout_s, self._expire, item, timeout_s)
        try:
            return await item.future
        finally:
            expiry.cancel()

    def _expire(self, item: _Item, timeout_s: float) -> None:
        if item.future.done():
            return
        where = "waiting for the model" if item.state == _QUEUED else "in the model"
        if item.state == _QUEUED:
            self._waiting -= 1
        item.future.set_exception(RequestError(
            504, "timeout", f"the invocation took longer than {timeout_s:g} s ({where}); the "
            f"server is still up. Raise --timeout-s (SHOAL_MODEL_SERVER_TIMEOUT) if the model "
            f"needs longer"))

    def _take(self, limit: int, into: list[_Item]) -> None:
        pending = self._pending
        while pending and len(into) < limit:
            item = pending.popleft()
            if item.future.done():  # timed out (or the client went away) while queued
                continue
            item.state = _TAKEN
            self._waiting -= 1
            into.append(item)

    async def _wait_for_more(self, timeout: float | None) -> None:
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        handle = None
        if timeout is not None:
            handle = loop.call_later(timeout, _resolve, waiter)
        try:
            await waiter
        finally:
            self._waiter = None
            if handle is not None:
                handle.cancel()

    async def _collect(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch: list[_Item] = []
            self._take(self._max, batch)
            if not batch:
                await self._wait_for_more(None)
                continue
            if self._delay > 0:
                deadline = batch[0].enqueued + self._delay
                while len(batch) < self._max and (remaining := deadline - loop.time()) > 0:
                    await self._wait_for_more(remaining)
                    self._take(self._max, batch)
            await self._run(loop, batch)

    async def _run(self, loop: asyncio.AbstractEventLoop, batch: list[_Item]) -> None:
        try:
            results = await loop.run_in_executor(self._executor, self._run_batch,
                                                 [item.data for item in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"the handler returned {len(results)} results for a batch "
                                   f"of {len(batch)}")
        except Exception as e:  # a handler bug: fail this batch, keep serving
            log.exception("inference failed for a batch of %d", len(batch))
            results = [RequestError(500, "internal error", f"{type(e).__name__}: {e}")
                       for _ in batch]
        self._on_batch(len(batch))
        for item, result in zip(batch, results, strict=True):
            if item.future.done():
                continue
            if isinstance(result, BaseException):
                item.future.set_exception(result)
            else:
                item.future.set_result(result)


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
