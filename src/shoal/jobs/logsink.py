"""Where a job's output goes: straight into the store's file on local disk, or a local spool
uploaded every few seconds (and at the end) for object stores."""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from shoal.core.ports import ArtifactStore
from shoal.core.secrets import StreamRedactor
from shoal.errors import ArtifactStoreError, ShoalError

__all__ = ["LogSink", "StdoutSink"]

if TYPE_CHECKING:
    from shoal.core.ports import ArtifactStore

logger = logging.getLogger(__name__)


class LogSink:
    def __init__(self, artifacts: ArtifactStore, key: str, spool: Path, *, interval: float = 2.0,
                 redact: tuple[str, ...] = ()) -> None:
        # Uploads while the job runs are not held up by a store that is away (the next one
        # goes on from the spool); the last one waits for it (``close``).
        self._artifacts = getattr(artifacts, "inner", artifacts)
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
        self._failing = False
        #: How long the last upload waits out a store that does not answer.
        self.outage_seconds = float(getattr(artifacts, "seconds", 60.0))
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
            self._try_upload(now)

    def flush(self) -> None:
        """Upload what the job wrote so far now, if the store answers (else at the next try,
        or the last upload in ``close``): a job's output, once it has ended, is readable while
        its supervisor still waits for another store (a metadata store's outage)."""
        if not self._direct and self._dirty:
            self._try_upload(time.monotonic())

    def _try_upload(self, now: float) -> None:
        try:
            self._upload(now)
        except ShoalError as e:  # a store that blinked never stops the job: next time
            self._last_flush = now
            if not self._failing:
                logger.warning("the job's log could not be uploaded (%s); it is kept in %s "
                               "and uploaded when the store answers", e, self._path)
            self._failing = True
        else:
            self._failing = False

    def _upload(self, now: float) -> None:
        self._f.flush()  # only called once something was written
        self._artifacts.put_bytes(self._key, self._path.read_bytes())
        self._dirty = False
        self._last_flush = now

    def _upload_within(self, seconds: float) -> None:
        """The last upload, tried again while the store does not answer, for *seconds*;
        then ArtifactStoreError naming the store (the log stays in the spool)."""
        deadline = time.monotonic() + seconds
        pause = 0.2
        while True:
            try:
                self._upload(0.0)
                return
            except ShoalError as e:
                if time.monotonic() + pause > deadline:
                    raise ArtifactStoreError(
                        f"the job's log could not be uploaded to the artifact store "
                        f"({self._artifacts.root}) within {seconds:g} s: {e}. It is kept "
                        f"in {self._path}", key=self._key) from e
            time.sleep(pause)  # the store's outage: a bounded, growing pause
            pause = min(pause * 2, 2.0)

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
            self._upload_within(self.outage_seconds)
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
