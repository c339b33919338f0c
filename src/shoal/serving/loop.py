"""The serving loop the servers' model threads share: a bounded queue of waiting work (a deque
under a condition), one daemon thread that takes it (``_iteration`` until it returns False),
``stop``, and ``pause``/``resume`` (tests hold the loop to queue requests up). The model
server's ``InferenceQueue`` and the LLM engines (transformers, vLLM) are ``ServingLoop``
subclasses.
"""

from __future__ import annotations

import abc
import threading
from collections import deque
from typing import Generic, TypeVar

__all__ = ["ServingLoop"]

T = TypeVar("T")


class ServingLoop(abc.ABC, Generic[T]):
    """Work items (``T``) wait in ``_pending``; the loop's thread runs ``_iteration`` until it
    returns False. Everything shared with the thread changes under ``_cond``.

    *lock*: the condition's lock (default: a re-entrant one, so callbacks the loop runs under
    it may submit again)."""

    #: the loop thread's name
    thread_name = "shoal-serving-loop"

    def __init__(self, *, lock: threading.Lock | threading.RLock | None = None) -> None:
        self._cond = threading.Condition(lock)
        self._pending: deque[T] = deque()
        self._paused = False
        self._stopping = False
        self._idle = False  # the thread waits in _wait_for_work (the lock held to read it)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10) -> None:
        """Stop the loop after its current iteration and wait for it (*timeout_s* at most)."""
        self._request_stop()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def pause(self) -> None:
        """Hold the loop after its current iteration (tests use it to queue work up)."""
        with self._cond:
            self._paused = True

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify()

    def _request_stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()

    def _enqueue(self, item: T) -> None:
        """Queue *item* and wake the loop (the lock held; the caller checked the bound)."""
        self._pending.append(item)
        self._cond.notify()

    def _has_work(self) -> bool:
        """Whether an iteration has something to do besides taking ``_pending`` (the lock
        held)."""
        return False

    def _wait_for_work(self) -> bool:
        """Wait (the lock held) until there is work and the loop is not paused; False once it
        is stopping."""
        while not self._stopping and (self._paused
                                      or not (self._pending or self._has_work())):
            self._idle = True
            self._cond.wait()
            self._idle = False
        return not self._stopping

    def _run(self) -> None:
        while self._iteration():
            pass

    @abc.abstractmethod
    def _iteration(self) -> bool:
        """One round of the loop's work; False to end the loop."""
