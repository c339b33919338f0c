"""In-process wake-ups of the server's long polls: ``fire(keys)`` from any thread (a route
that recorded a job's end, a warm worker's claim that got a message) wakes the requests
awaiting those keys on the event loop; a waiter re-reads what it waits on after each wake-up
(or after its slice), so a wake-up lost to a race only costs one slice."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from shoal.core.jobs import JobChange, JobStatus

__all__ = ["NotifyingJobStore", "Signals"]


class Signals:
    def __init__(self) -> None:
        self._waiting: dict[str, set[asyncio.Future[None]]] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def wait(self, key: str, timeout: float,
                   ready: Callable[[], bool] | None = None) -> None:
        """Until *key* fires or *timeout* passes. *ready* (what the waiter waits for) is
        asked again once the waiter is registered: a ``fire`` from another thread between
        the caller's own check and the registration would otherwise be lost, and the waiter
        would sleep its whole slice with its answer there."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            self._waiting.setdefault(key, set()).add(future)
        try:
            if ready is not None and ready():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(future), timeout)
        finally:
            with self._lock:
                waiting = self._waiting.get(key)
                if waiting is not None:
                    waiting.discard(future)
                    if not waiting:
                        del self._waiting[key]

    def fire(self, keys: Iterable[str]) -> None:
        loop = self._loop
        if loop is None:
            return
        with self._lock:
            futures = [f for k in keys for f in self._waiting.get(k, ())]
        if futures:
            with contextlib.suppress(RuntimeError):  # the loop closed (shutting down)
                loop.call_soon_threadsafe(_resolve, futures)


def _resolve(futures: Sequence[asyncio.Future[None]]) -> None:
    for future in futures:
        if not future.done():
            future.set_result(None)


class NotifyingJobStore:
    """The server's job store, firing a job's name once a route recorded its end (what the
    wait and log routes await). Every other call passes through."""

    def __init__(self, store: Any, signals: Signals) -> None:
        self._store = store
        self._signals = signals

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def update_job(self, name: str, *, status: JobStatus, **fields: Any) -> Any:
        result = self._store.update_job(name, status=status, **fields)
        if status.is_terminal:
            self._signals.fire([name])
        return result

    def update_jobs(self, changes: Sequence[JobChange]) -> list[bool]:
        applied: list[bool] = self._store.update_jobs(changes)
        self._signals.fire([c.name for c, ok in zip(changes, applied, strict=True)
                            if ok and c.status.is_terminal])
        return applied
