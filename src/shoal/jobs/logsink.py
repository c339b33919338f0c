"""Where a job's output goes: straight into the store's file on local disk, or a local spool
uploaded every few seconds (and at the end) for object stores."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from shoal.core.ports import ArtifactStore
from shoal.core.secrets import StreamRedactor

__all__ = ["LogSink", "StdoutSink"]

if TYPE_CHECKING:
    from shoal.core.ports import ArtifactStore


class LogSink:
    def __init__(self, artifacts: ArtifactStore, key: str, spool: Path, *, interval: float = 2.0,
                 redact: tuple[str, ...] = ()) -> None:
        self._artifacts = artifacts
        self._key = key
        local = artifacts.local_path(key)
        self._direct = local is not None
        self._path = Path(local) if local is not None else spool
        # opened at the first write: a silent job writes no file
        self._f_obj: BinaryIO | None = None
        self._interval = interval
        self._dirty = False
        self._last_flush = 0.0
        self._closed = False
        # Secret values (environment variables named *TOKEN*, *KEY*...) never reach the log,
        # not even when written in pieces (the redactor holds back a possible beginning).
        self._redactor = StreamRedactor(redact)

    def resume(self) -> None:
        """Go on after the log an earlier supervisor of the job stored (a later attempt on
        another machine): the spool starts as a copy of it, so uploads keep what it held."""
        if self._direct or self._path.exists():
            return
        from shoal.errors import ArtifactNotFound

        try:
            earlier = self._artifacts.get_bytes(self._key)
        except ArtifactNotFound:
            return
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._path.write_bytes(earlier)

    def write(self, data: bytes) -> None:
        self._put(self._redactor.feed(data))

    def end(self) -> None:
        """The output has ended: write what the redactor held back."""
        self._put(self._redactor.flush())

    def _put(self, data: bytes) -> None:
        if not data:
            return
        f = self._f
        f.write(data)
        f.flush()
        self._dirty = True

    @property
    def _f(self) -> BinaryIO:
        if self._f_obj is None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self._f_obj = open(self._path, "ab")  # noqa: SIM115 - lives as long as the job
        return self._f_obj

    def next_flush(self, now: float) -> float:
        if self._direct or not self._dirty:
            return now + 3600.0
        return self._last_flush + self._interval

    def maybe_flush(self, now: float) -> None:
        if not self._direct and self._dirty and now >= self._last_flush + self._interval:
            self._upload(now)

    def _upload(self, now: float) -> None:
        self._f.flush()  # only called once something was written
        self._artifacts.put_bytes(self._key, self._path.read_bytes())
        self._dirty = False
        self._last_flush = now

    def tail(self, lines: int) -> str:
        """The last *lines* of the log (called once the output has ended)."""
        self.end()
        if self._f_obj is None:
            return ""
        self._f_obj.flush()
        with open(self._path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 16384))
            text = f.read().decode(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def close(self) -> None:
        if self._closed:
            return
        self.end()
        if not self._direct and self._dirty:
            self._upload(0.0)
        if self._f_obj is not None:
            self._f_obj.close()
        self._closed = True


class StdoutSink:
    """A log sink on this process's standard output (``run_host``: another process
    collects it)."""

    def __init__(self, redact: tuple[str, ...] = ()) -> None:
        self._tail: list[bytes] = []
        self._redactor = StreamRedactor(redact)

    def write(self, data: bytes) -> None:
        self._put(self._redactor.feed(data))

    def _put(self, data: bytes) -> None:
        if not data:
            return
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        self._tail = (self._tail + data.splitlines())[-50:]

    def tail(self, lines: int) -> str:
        self._put(self._redactor.flush())
        return b"\n".join(self._tail[-lines:]).decode(errors="replace")

    def close(self) -> None:
        self._put(self._redactor.flush())
        sys.stdout.flush()
