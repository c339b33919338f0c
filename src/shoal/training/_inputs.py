"""Training inputs (data channels), under SageMaker's names."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal._internal.extras import require_for_url
from shoal.core.inert import given
from shoal.errors import InvalidArgumentError

if TYPE_CHECKING:
    from shoal.core.ports import ArtifactStore

__all__ = ["TrainingInput", "UploadProgress", "check_input_mode", "local_files",
           "resolve_channels", "ship_local_channels"]

#: Uploads larger than this (in all) report their progress on stderr.
PROGRESS_BYTES = 8 * 1024 * 1024

_INERT_INPUT = ("hub_access_config", "model_access_config", "shuffle_config", "instance_groups",
                "attribute_names", "target_attribute_name", "compression")

_CHANNEL_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


class TrainingInput:
    """One data channel: where its data is and how the job sees it.

    ``s3_data`` takes a local path or any fsspec URL (``file://``, ``s3://``, ``gs://``...).
    Local data is linked into ``input/data/<channel>``; anything else is copied there before
    the script starts.
    """

    def __init__(self, s3_data: str | os.PathLike[str], distribution: str | None = None,
                 compression: str | None = None, content_type: str | None = None,
                 record_wrapping: str | None = None, s3_data_type: str = "S3Prefix",
                 instance_groups: Any = None, input_mode: str | None = None,
                 attribute_names: Any = None, target_attribute_name: Any = None,
                 shuffle_config: Any = None, hub_access_config: Mapping[str, Any] | None = None,
                 model_access_config: Mapping[str, Any] | None = None) -> None:
        self.s3_data = os.fspath(s3_data)
        self.distribution = distribution or "FullyReplicated"
        self.compression = compression
        self.content_type = content_type
        self.record_wrapping = record_wrapping
        self.s3_data_type = s3_data_type
        self.input_mode = check_input_mode(input_mode) if input_mode else None
        #: SageMaker settings with no effect here (JumpStart hub and EULA access, S3
        #: shuffling...): kept on the job record and reported once by ``fit()``.
        self.inert = given({"hub_access_config": hub_access_config,
                            "model_access_config": model_access_config,
                            "shuffle_config": shuffle_config, "instance_groups": instance_groups,
                            "attribute_names": attribute_names,
                            "target_attribute_name": target_attribute_name,
                            "compression": compression}, dict.fromkeys(_INERT_INPUT))
        self.config: dict[str, object] = {"DataSource": {"S3DataSource": {
            "S3DataType": s3_data_type, "S3Uri": self.s3_data,
            "S3DataDistributionType": self.distribution}}}
        if content_type:
            self.config["ContentType"] = content_type

    def __repr__(self) -> str:
        return f"TrainingInput({self.s3_data!r})"


def check_input_mode(mode: str) -> str:
    """SageMaker's ``input_mode``: "File" and "FastFile" (the data is staged before the script
    starts) work; "Pipe" (a FIFO stream) is not provided."""
    if mode not in ("File", "FastFile"):
        raise InvalidArgumentError(
            f"input_mode={mode!r} is not supported; use 'File' (the data is staged before the "
            "script starts) or 'FastFile'", argument="input_mode")
    return mode


def _as_uri(where: str) -> str:
    if "://" in where:
        return where
    return Path(where).expanduser().resolve().as_uri()


def resolve_channels(inputs: Any, input_mode: str = "File", *,
                     store: ArtifactStore | None = None) -> dict[str, dict[str, Any]]:
    """``fit(inputs)`` → ``{channel: {"uri", ...}}``; every channel is checked to exist now.
    *input_mode* is the estimator's, for channels that do not set their own. *store*: a team
    server's artifact store, through which a URI inside it is checked (it need not be on
    this machine); others are checked from here."""
    if inputs is None:
        return {}
    if isinstance(inputs, (str, os.PathLike, TrainingInput)):
        inputs = {"training": inputs}
    if not isinstance(inputs, dict):
        raise InvalidArgumentError(
            f"inputs must be a URI, a TrainingInput or a dict of channel name to either, got "
            f"{type(inputs).__name__}", argument="inputs")
    channels: dict[str, dict[str, Any]] = {}
    for name, value in inputs.items():
        if not isinstance(name, str) or not name or set(name) - _CHANNEL_NAME_CHARS:
            raise InvalidArgumentError(f"channel name {name!r} is invalid: use letters, digits, "
                                       "'-', '_' or '.'", channel=str(name))
        ti = value if isinstance(value, TrainingInput) else None
        where = ti.s3_data if ti is not None else value
        if not isinstance(where, (str, os.PathLike)):
            raise InvalidArgumentError(f"channel {name!r}: expected a URI or TrainingInput, got "
                                       f"{type(where).__name__}", channel=name)
        uri = _as_uri(os.fspath(where))
        _check_exists(name, uri, store)
        channels[name] = {
            "uri": uri, "content_type": ti.content_type if ti else None,
            "input_mode": (ti.input_mode if ti else None) or input_mode,
            "distribution": ti.distribution if ti else "FullyReplicated",
            "record_wrapping": ti.record_wrapping if ti else None,
        }
        if ti is not None and ti.inert:
            channels[name]["inert"] = dict(ti.inert)
    return channels


def _store_key(store: ArtifactStore, uri: str) -> str | None:
    """*uri*'s key in *store*, or None when it is not inside it."""
    root = store.root.rstrip("/") + "/"
    return uri[len(root):].strip("/") if uri.startswith(root) and uri != root else None


def _check_exists(name: str, uri: str, store: ArtifactStore | None = None) -> None:
    import fsspec.core

    key = None if store is None else _store_key(store, uri)
    if store is not None and key is not None:
        if not store.exists(key) and not store.list_keys(key + "/"):
            raise InvalidArgumentError(f"channel {name!r}: {uri} does not exist in the "
                                       "server's artifact store; nothing was started",
                                       channel=name, uri=uri)
        return
    require_for_url(uri, f"channel {name!r} ({uri})")
    try:
        fs, path = fsspec.core.url_to_fs(uri)
        fs.invalidate_cache(path)
        found = fs.exists(path)
    except (ImportError, ValueError) as e:
        raise InvalidArgumentError(f"channel {name!r}: cannot open {uri}: {e}. For s3:// "
                                   "install shoal[s3].", channel=name, uri=uri) from e
    except OSError as e:
        raise InvalidArgumentError(f"channel {name!r}: cannot reach {uri}: {e}", channel=name,
                                   uri=uri) from e
    if not found:
        raise InvalidArgumentError(f"channel {name!r}: {uri} does not exist; nothing was "
                                   "started", channel=name, uri=uri)


def local_files(path: Path, rel: str, what: str) -> tuple[str, dict[str, Path]]:
    """The files of the local *path* (a file, or a directory's files, links followed) as
    ``{rel/...: file}``, and the key (below the job) that stands for them: *rel* for a
    directory, ``rel/<name>`` for a file (where a job's channel stages it)."""
    if path.is_file():
        return f"{rel}/{path.name}", {f"{rel}/{path.name}": path}
    if not path.is_dir():
        raise InvalidArgumentError(f"{what}: {path} does not exist (or is not a file or a "
                                   "directory); nothing was started", path=str(path))
    files: dict[str, Path] = {}
    for root, _dirs, names in os.walk(path, followlinks=True):
        for file in sorted(names):
            full = Path(root) / file
            if full.is_file():
                files[f"{rel}/{full.relative_to(path).as_posix()}"] = full
    if not files:
        raise InvalidArgumentError(f"{what}: the directory {path} holds no files, so there is "
                                   "nothing to upload to the server; nothing was started",
                                   path=str(path))
    return rel, files


def ship_local_channels(channels: dict[str, dict[str, Any]], job: str,
                        store: ArtifactStore) -> dict[str, Path]:
    """Through a team server: the files of every channel on this machine (a ``file://`` URI
    outside the server's *store*), to go up under ``<job>/input/data/<channel>/``; each such
    channel's ``uri`` becomes the store's, so the job reads what was uploaded, never a path
    of the client's disk (which may exist on the server's host by chance)."""
    from shoal.storage.artifacts import job_key

    files: dict[str, Path] = {}
    for name, channel in channels.items():
        uri = str(channel["uri"])
        if not uri.startswith("file://") or _store_key(store, uri) is not None:
            continue
        where, more = local_files(Path(uri[len("file://"):]), f"input/data/{name}",
                                  f"channel {name!r} ({uri})")
        files.update(more)
        channel["uri"] = store.uri(job_key(job, *where.split("/")))
    return files


class UploadProgress:
    """``on_file`` for ``JobService.submit_script``: past ``PROGRESS_BYTES`` in all, a line
    on stderr as each tenth of the bytes goes up (and at the end)."""

    def __init__(self, job: str, files: Mapping[str, bytes | Path],
                 write: Callable[[str], Any] | None = None) -> None:
        self.job = job
        self.total = sum(len(v) if isinstance(v, bytes) else v.stat().st_size
                         for v in files.values())
        self.sent = 0
        self._shown = 0
        self._write = write or _to_stderr

    def __call__(self, rel: str, size: int) -> None:
        self.sent += size
        if self.total < PROGRESS_BYTES:
            return
        tenth = self.sent * 10 // self.total
        if tenth > self._shown:
            self._shown = int(tenth)
            self._write(f"[shoal] job {self.job}: uploaded {self.sent / 1e6:.1f} of "
                        f"{self.total / 1e6:.1f} MB ({rel})")


def _to_stderr(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
