"""``CheckpointLocation``: a function argument that is a checkpoint directory inside the job.

As on SageMaker, pass ``CheckpointLocation(uri)`` as an argument of a ``@remote`` function and
use it as a path (``os.PathLike``). In the job it is a local directory that starts with
whatever is stored under *uri* (so a retried or resumed job finds its last checkpoints). The
job's supervisor keeps it, as it keeps an estimator's checkpoints (``jobs._training.
CheckpointTap``): restored before the function starts, synced to *uri* every
``checkpoint_sync_seconds`` while it runs and once more when it has ended, whatever the
outcome, so a job that is stopped or times out keeps what it wrote. The supervisor names the
directory in ``SHOAL_CHECKPOINT_DIR``/``SHOAL_CHECKPOINT_URI``. A location the call's
arguments do not show directly (one inside a list or an object) is restored and uploaded by
the job itself, when the function returns or raises. *uri* is any fsspec URL (``s3://``,
``file://``, ``gs://``...). Called outside a job (plain Python), a local *uri* is itself the
directory.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from shoal.errors import InvalidArgumentError

__all__ = ["CheckpointLocation", "find_checkpoint_location"]

_URL = re.compile(r"^[a-z][a-z0-9+.-]*://.+$")


class CheckpointLocation(os.PathLike[str]):
    """Where a remote function's checkpoints live (SageMaker's ``CheckpointLocation``)."""

    def __init__(self, s3_uri: str) -> None:
        if not isinstance(s3_uri, str) or not (_URL.match(s3_uri) or s3_uri.startswith("/")):
            raise InvalidArgumentError(
                f"CheckpointLocation({s3_uri!r}) needs a URL such as s3://bucket/checkpoints "
                "or file:///dir/checkpoints (or an absolute local path)", argument="s3_uri")
        self._s3_uri = s3_uri.rstrip("/")
        self._local: Path | None = None

    @property
    def s3_uri(self) -> str:
        return self._s3_uri

    def __fspath__(self) -> str:
        if self._local is not None:
            return str(self._local)
        local = _local_dir(self._s3_uri)
        if local is None:
            raise InvalidArgumentError(
                f"CheckpointLocation({self._s3_uri!r}) is a directory inside a @remote job; "
                "outside one only a local URI (file://... or a path) can be used as a path",
                argument="s3_uri")
        local.mkdir(parents=True, exist_ok=True)
        return str(local)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return _restore, (self._s3_uri,)

    def __repr__(self) -> str:
        return f"CheckpointLocation({self._s3_uri!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CheckpointLocation) and other._s3_uri == self._s3_uri

    def __hash__(self) -> int:
        return hash(self._s3_uri)


def _local_dir(uri: str) -> Path | None:
    if uri.startswith("file://"):
        return Path(uri.removeprefix("file://"))
    return Path(uri) if uri.startswith("/") else None


def _restore(uri: str) -> CheckpointLocation:
    """Unpickling: inside a job, the directory the supervisor restored and syncs; else (a
    location the supervisor was not told of) a directory made and filled from *uri* now, and
    uploaded to it when the function has ended."""
    location = CheckpointLocation(uri)
    from shoal.config import job_checkpoints, job_name

    name = job_name()
    if name is None:
        return location
    kept = job_checkpoints()
    if kept is not None and kept[1] == location.s3_uri:
        location._local = Path(kept[0])
        location._local.mkdir(parents=True, exist_ok=True)
        return location
    from shoal.jobs.checkpoints import Checkpoints

    local = Path(tempfile.gettempdir()) / "shoal-checkpoints" / name
    shutil.rmtree(local, ignore_errors=True)
    store = Checkpoints(local, uri)
    restored = store.restore()
    sys.stderr.write(f"shoal: checkpoints: {restored} file(s) from {uri} in {local}\n")
    location._local = local

    def upload() -> None:
        sent = store.sync()
        sys.stderr.write(f"shoal: checkpoints: uploaded {sent} file(s) from {local} to {uri}\n")
        shutil.rmtree(local, ignore_errors=True)

    from shoal.jobs.hooks import job_end_hooks

    hooks = job_end_hooks()
    if hooks is not None:
        hooks.append(upload)
    return location


def find_checkpoint_location(values: tuple[Any, ...]) -> CheckpointLocation | None:
    """The one CheckpointLocation among a call's arguments (SageMaker allows one)."""
    found = [v for v in values if isinstance(v, CheckpointLocation)]
    if len(found) > 1:
        raise InvalidArgumentError(f"a remote function takes at most one CheckpointLocation "
                                   f"argument (SageMaker's rule); got {found}",
                                   argument="CheckpointLocation")
    return found[0] if found else None
