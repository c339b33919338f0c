"""Capacity slots shared by every supervisor on this machine: one flock'ed file per slot."""

from __future__ import annotations

import fcntl
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

__all__ = ["SlotPool"]


class SlotPool:
    def __init__(self, directory: Path, count: int) -> None:
        self._dir = Path(directory)
        self._count = max(1, count)
        self._held: IO[str] | None = None

    def acquire(self, should_stop: Callable[[], bool]) -> int | None:
        """Block until a slot is free; return its index, or None when *should_stop* says so."""
        self._dir.mkdir(parents=True, exist_ok=True)
        delay = 0.002
        while True:
            for i in range(self._count):
                f = open(self._dir / f"slot-{i}.lock", "a")  # noqa: SIM115 - held until release
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    f.close()
                    continue
                self._held = f
                return i
            if should_stop():
                return None
            time.sleep(delay)  # bounded back-off while every slot is busy
            delay = min(delay * 2, 0.25)

    def release(self) -> None:
        if self._held is not None:
            fcntl.flock(self._held, fcntl.LOCK_UN)
            self._held.close()
            self._held = None
