"""A job's checkpoint directory kept in step with its checkpoint URI.

Script-mode jobs (``jobs/_training.py``: restored before the script starts, synced while it
runs and after it ends) and ``@remote`` functions with a ``CheckpointLocation``
(``remote_function/_checkpoint.py``, inside the job) use the same store.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from shoal.core.jobs import FailureKind
from shoal.errors import ShoalError
from shoal.jobs._prepare import PrepareError
from shoal.storage.artifacts import FsspecArtifactStore

__all__ = ["CHECKPOINT_SYNC_SECONDS", "Checkpoints"]

#: How often a running job's checkpoint directory is synced to its URI, by default (the
#: ``checkpoint_sync_seconds`` setting, ``SHOAL_CHECKPOINT_SYNC_SECONDS``).
CHECKPOINT_SYNC_SECONDS = 5.0


class Checkpoints:
    """A local directory kept in step with a URI: restored first, then uploaded as it changes."""

    def __init__(self, local: Path, uri: str,
                 interval: float = CHECKPOINT_SYNC_SECONDS) -> None:
        self.local = local
        self.uri = uri
        self.interval = interval
        self._store: FsspecArtifactStore | None = None
        self._seen: dict[str, tuple[int, int]] = {}
        self.last_sync = time.monotonic()

    def due(self) -> float:
        """When the next sync is due (``time.monotonic()``)."""
        return self.last_sync + self.interval

    @property
    def store(self) -> FsspecArtifactStore:
        if self._store is None:
            self._store = FsspecArtifactStore.open(self.uri)
        return self._store

    def restore(self) -> int:
        self.local.mkdir(parents=True, exist_ok=True)
        keys = [k for k in self.store.list_all() if k] if self._exists() else []
        for key in keys:
            target = self.local / key
            target.parent.mkdir(parents=True, exist_ok=True)
            self.store.get_file(key, target)
            st = target.stat()
            self._seen[key] = (st.st_size, st.st_mtime_ns)
        return len(keys)

    def _exists(self) -> bool:
        try:
            return bool(self.store.list_all())
        except ShoalError:
            return False

    def sync(self) -> int:
        self.last_sync = time.monotonic()
        if not self.local.is_dir():
            return 0
        sent = 0
        for path in sorted(self.local.rglob("*")):
            if not path.is_file() or path.name.startswith(".") and ".tmp" in path.name:
                continue
            rel = path.relative_to(self.local).as_posix()
            try:
                st = path.stat()
            except FileNotFoundError:  # the script replaced it meanwhile: next round
                continue
            mark = (st.st_size, st.st_mtime_ns)
            if self._seen.get(rel) == mark:
                continue
            self.store.put_file(rel, path)
            self._seen[rel] = mark
            sent += 1
        return sent

    def restore_for_job(self, log: Callable[[str], None]) -> None:
        """Restore before the job starts; PrepareError (an environment failure) if the URI
        cannot be read."""
        try:
            restored = self.restore()
        except (ShoalError, OSError) as e:
            raise PrepareError(FailureKind.ENVIRONMENT,
                               f"cannot restore checkpoints from {self.uri}: {e}") from e
        if restored:
            log(f"restored {restored} checkpoint file(s) from {self.uri} into {self.local}")

    def sync_for_job(self, log: Callable[[str], None]) -> None:
        """Sync while the job runs or after it ended: a failure goes to the job's log and the
        job carries on (the next sync tries again)."""
        try:
            self.sync()
        except (ShoalError, OSError) as e:
            log(f"could not sync checkpoints to {self.uri}: {e}")
