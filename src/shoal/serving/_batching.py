"""Requests wait here for the model: ``InferenceQueue`` groups them into batches as they
arrive (LitServe's loop) and runs each batch on its own inference thread, off the event loop.

A batch is whatever has queued up while the model was busy, up to ``max_batch_size``; when the
model is idle the first request waits at most ``max_batch_delay`` for company. So under load
batches grow by themselves, and a lone request pays no delay unless one is configured.

The inference thread takes its next batch itself as soon as one is finished, and hands the
results back to the event loop with one ``call_soon_threadsafe`` per batch: the model never
waits for the event loop to dispatch work, and each batch costs one thread hand-off each way
(an executor per batch cost two more, and left the model idle while the loop was busy).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from shoal.serving.http import RequestError
from shoal.serving.loop import ServingLoop

__all__ = ["InferenceQueue"]

log = logging.getLogger(__name__)

_QUEUED, _TAKEN, _GONE = 0, 1, 2

#: what a request's caller is told: its result, or the exception that answers it
Answer = Callable[[Any], None]


class _Item:
    __slots__ = ("answer", "answered", "data", "deadline", "enqueued", "state", "timeout_s")

    def __init__(self, data: Any, answer: Answer, enqueued: float, timeout_s: float) -> None:
        self.data = data
        self.answer = answer
        self.answered = False
        self.enqueued = enqueued
        self.timeout_s = timeout_s
        self.deadline = enqueued + timeout_s
        self.state = _QUEUED

    def settle(self, result: Any) -> None:
        """Tell the caller (on the event loop), once."""
        if not self.answered:
            self.answered = True
            self.answer(result)


def _future_answer(future: asyncio.Future[Any]) -> Answer:
    def answer(result: Any) -> None:
        if future.done():
            return
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)
    return answer


class InferenceQueue(ServingLoop[_Item]):
    """Bounded queue in front of ``run_batch(list) -> list`` (one result per item).

    ``submit`` raises ``RequestError`` 503 (with ``Retry-After``) when ``max_queue`` requests
    are already waiting, and 504 when the answer takes longer than its timeout; the model's
    thread cannot be interrupted, so a hung model keeps its thread while the server answers.
    """

    def __init__(self, run_batch: Callable[[list[Any]], list[Any]], *, max_batch_size: int,
                 max_batch_delay_s: float, max_queue: int,
                 on_batch: Callable[[int], None] = lambda n: None) -> None:
        # _pending, _waiting, _idle, _stopping and every item's state change under _cond.
        super().__init__(lock=threading.Lock())
        self._run_batch = run_batch
        self._max = max_batch_size
        self._delay = max_batch_delay_s
        self._max_queue = max_queue
        self._on_batch = on_batch
        self._waiting = 0  # queued items whose caller still waits
        self._room = 0  # while it waits for a batch to fill: wake it only once this many queue
        self._loop: asyncio.AbstractEventLoop | None = None
        # on the event loop only: the requests not yet answered, in arrival order, and the
        # one timer that expires them
        self._open: deque[_Item] = deque()
        self._expiry: asyncio.TimerHandle | None = None
        self._expiry_at = 0.0

    @property
    def depth(self) -> int:
        """Requests waiting for the model (not counting the batch it is running)."""
        return self._waiting

    thread_name = "shoal-inference"

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        super().start()

    async def close(self) -> None:
        """Stop taking batches and fail the requests still waiting (503); the batch in the
        model finishes on its own (a hung model's thread is a daemon, not joined)."""
        with self._cond:
            self._stopping = True
            left = list(self._pending)
            self._pending.clear()
            self._waiting = 0
            self._cond.notify()
        for item in left:
            item.settle(RequestError(503, "shutting down", "the server is stopping"))

    def put(self, data: Any, timeout_s: float, answer: Answer) -> None:
        """Queue *data* (on the event loop); ``answer`` gets the result, or the
        ``RequestError`` that answers the request (504 once *timeout_s* has passed), once,
        on the event loop. Raises ``RequestError`` 503 (with ``Retry-After``) when
        ``max_queue`` requests already wait."""
        self._queue_item(data, timeout_s, answer)

    async def submit(self, data: Any, timeout_s: float) -> Any:
        """``put`` and wait: a request cancelled while still queued never reaches the model."""
        loop = self._running_loop()
        future = loop.create_future()
        item = self._queue_item(data, timeout_s, _future_answer(future))
        try:
            return await future
        finally:
            item.answered = True
            if item.state == _QUEUED:  # cancelled while queued: the model must not run it
                with self._cond:
                    if item.state == _QUEUED:
                        item.state = _GONE
                        self._waiting -= 1

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("InferenceQueue.start() was not called")
        return self._loop

    def _queue_item(self, data: Any, timeout_s: float, answer: Answer) -> _Item:
        loop = self._running_loop()
        item = _Item(data, answer, loop.time(), timeout_s)
        with self._cond:
            waiting = self._waiting
            full = waiting >= self._max_queue
            if not full:
                self._pending.append(item)
                self._waiting += 1
                if self._idle:
                    self._cond.notify()
                elif self._room and len(self._pending) >= self._room:
                    self._room = 0
                    self._cond.notify()
        if full:
            raise RequestError(503, "overloaded",
                               f"{waiting} requests are already waiting for the model (the "
                               f"limit is {self._max_queue}); retry shortly",
                               headers=((b"retry-after", b"1"),))
        self._open.append(item)
        if self._expiry is None or item.deadline < self._expiry_at:
            self._arm(item.deadline)
        return item

    # --- timeouts: one timer for the open requests (a timer per request cost more) ---------

    def _arm(self, when: float) -> None:
        loop = self._running_loop()
        if self._expiry is not None:
            self._expiry.cancel()
        self._expiry_at = when
        self._expiry = loop.call_at(when, self._expire_due)

    def _expire_due(self) -> None:
        """Answer 504 to the open requests past their deadline; arm for the next one."""
        self._expiry = None
        now = self._running_loop().time()
        open_items = self._open
        while open_items and open_items[0].answered:
            open_items.popleft()
        nearest = None
        for item in open_items:
            if item.answered:
                continue
            if item.deadline <= now:
                self._expire(item)
            elif nearest is None or item.deadline < nearest:
                nearest = item.deadline
        if nearest is not None:
            self._arm(nearest)

    def _expire(self, item: _Item) -> None:
        with self._cond:
            queued = item.state == _QUEUED
            if queued:
                item.state = _GONE
                self._waiting -= 1
        where = "waiting for the model" if queued else "in the model"
        item.settle(RequestError(
            504, "timeout", f"the invocation took longer than {item.timeout_s:g} s ({where}); "
            f"the server is still up. Raise --timeout-s (SHOAL_MODEL_SERVER_TIMEOUT) if the "
            f"model needs longer"))

    # --- the inference thread ---------------------------------------------------------------

    def _take(self, into: list[_Item]) -> None:
        """Move queued items into *into*, up to the batch size (holding ``_cond``)."""
        pending, limit = self._pending, self._max
        while pending and len(into) < limit:
            item = pending.popleft()
            if item.state != _QUEUED:  # timed out or cancelled while queued
                continue
            item.state = _TAKEN
            self._waiting -= 1
            into.append(item)

    def _next_batch(self) -> list[_Item] | None:
        """The next batch, waiting for requests (and for company, with a batch delay); None
        once stopped."""
        batch: list[_Item] = []
        with self._cond:
            while True:
                if not self._wait_for_work():
                    return None
                self._take(batch)  # the queued items may all have left: wait again
                if batch:
                    break
            if self._delay > 0 and len(batch) < self._max:
                loop = self._loop
                assert loop is not None
                deadline = batch[0].enqueued + self._delay
                while len(batch) < self._max and not self._stopping:
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        break
                    self._room = self._max - len(batch)
                    self._cond.wait(remaining)
                    self._room = 0
                    self._take(batch)
        return batch

    def _iteration(self) -> bool:
        loop = self._loop
        assert loop is not None
        batch = self._next_batch()
        if batch is None:
            return False
        try:
            results = self._run_batch([item.data for item in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"the handler returned {len(results)} results for a "
                                   f"batch of {len(batch)}")
        except Exception as e:  # a handler bug: fail this batch, keep serving
            log.exception("inference failed for a batch of %d", len(batch))
            results = [RequestError(500, "internal error", f"{type(e).__name__}: {e}")
                       for _ in batch]
        try:
            loop.call_soon_threadsafe(self._deliver, batch, results)
        except RuntimeError:  # the loop is closed: the server has stopped
            return False
        return True

    def _deliver(self, batch: list[_Item], results: list[Any]) -> None:
        self._on_batch(len(batch))
        for item, result in zip(batch, results, strict=True):
            item.settle(result)
        open_items = self._open  # answered roughly in order: drop the answered from the front
        while open_items and open_items[0].answered:
            open_items.popleft()


