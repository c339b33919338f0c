"""A batch executor's output, split into each call's own log.

The executor writes ``\\x1e<marker><index>:<time>\\x1e`` (one atomic write, under PIPE_BUF)
before each call; the marker is random per executor, so a job's own output does not contain
it by chance. Everything after a call's marker, up to the next one, is that call's output.
"""

from __future__ import annotations

import os
from collections.abc import Callable

__all__ = ["MarkedOutput"]


class MarkedOutput:
    def __init__(self, marker: bytes, *, begin: Callable[[int, float], None],
                 write: Callable[[bytes], None]) -> None:
        """*begin(index, time)* is told when a call's marker passes, *write(data)* gets the
        output in between (for the call that began last)."""
        self._mark = b"\x1e" + marker
        self._begin = begin
        self._write = write
        self._held = b""  # the start of what may be a marker

    @property
    def marker(self) -> bytes:
        return self._mark[1:]

    def read(self, fd: int) -> int:
        """Take what the (non-blocking) pipe *fd* holds; say how many bytes that was."""
        total = 0
        while True:
            try:
                data = os.read(fd, 65536)
            except (BlockingIOError, InterruptedError):
                return total
            if not data:
                return total
            total += len(data)
            self.feed(data)

    def feed(self, data: bytes) -> None:
        buf = self._held + data if self._held else data
        self._held = b""
        mark = self._mark
        pos = 0
        while (i := buf.find(mark, pos)) >= 0:
            self._out(buf[pos:i])
            j = buf.find(b"\x1e", i + len(mark))
            if j < 0:
                self._held = buf[i:]
                return
            index, began = buf[i + len(mark):j].split(b":")
            self._begin(int(index), float(began))
            pos = j + 1
        rest = buf[pos:]
        k = rest.rfind(b"\x1e", max(0, len(rest) - len(mark)))
        if k >= 0 and mark.startswith(rest[k:]):  # perhaps the start of a marker: wait
            self._out(rest[:k])
            self._held = rest[k:]
        else:
            self._out(rest)

    def release(self) -> None:
        """The call that began last ended: what was held back was its output after all (a
        marker is written whole, so a part of one can only be the call's own bytes)."""
        held, self._held = self._held, b""
        self._out(held)

    def _out(self, data: bytes) -> None:
        if data:
            self._write(data)
