"""Artifact store over fsspec: ``file://``, ``memory://``, ``s3://`` and any other fsspec URL.

Writes are atomic: on local disk a temporary file is renamed into place; object stores make a
single PUT visible whole. Readers never see half an artifact.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import uuid
from collections.abc import Mapping
from typing import Any, BinaryIO

from shoal._internal.extras import require_for_url
from shoal.errors import ArtifactNotFound, ArtifactStoreError, InvalidArtifactKeyError

__all__ = ["FsspecArtifactStore", "check_key", "job_key"]


_TMP_IDS = itertools.count()


def check_key(key: str) -> str:
    """*key* when it names something below a store's root; InvalidArtifactKeyError naming it
    when it is empty, absolute or climbs out with ``..``."""
    if not key or key.startswith("/") or ".." in key.split("/"):
        raise InvalidArtifactKeyError(
            f"invalid artifact key {key!r}: a key is a relative path below the store's root "
            "('<job>/output/model.tar.gz'), never empty, absolute or with '..'", key=key)
    return key


def job_key(job: str, *parts: str) -> str:
    """``<job>/<part>/...``: the per-job layout of ARCHITECTURE.md."""
    return "/".join((job, *parts))


class FsspecArtifactStore:
    """Bytes under keys below a root URL."""

    def __init__(self, fs: Any, root_path: str, root_url: str) -> None:
        self._fs = fs
        self._root_path = root_path.rstrip("/")
        self._root_url = root_url.rstrip("/")
        self._local = "file" in _protocols(fs)
        self._made: set[str] = set()  # directories known to exist (saves a stat per write)

    @classmethod
    def open(cls, url: str, storage_options: Mapping[str, Any] | None = None) -> FsspecArtifactStore:
        import fsspec.core

        require_for_url(url, f"the artifact store {url}")
        try:
            # A filesystem of its own: fsspec would hand back one cached for the same
            # options, whose client read the environment (AWS_ENDPOINT_URL_S3, credentials)
            # when an earlier store of this process was opened.
            fs, path = fsspec.core.url_to_fs(url, skip_instance_cache=True,
                                             **dict(storage_options or {}))
        except (ImportError, ValueError) as e:
            raise ArtifactStoreError(f"cannot open artifact store {url!r}: {e}. For s3:// "
                                     "install shoal[s3].", url=url) from e
        if "file" in _protocols(fs):
            _makedirs_private(path)  # a new root (and each new parent): this user's alone
        return cls(fs, path, url)

    @property
    def root(self) -> str:
        return self._root_url

    def uri(self, key: str) -> str:
        return f"{self._root_url}/{key}"

    def local_path(self, key: str) -> str | None:
        """The file's path on this machine, when the store is local disk."""
        return self._path(key) if self._local else None

    def _path(self, key: str) -> str:
        return f"{self._root_path}/{check_key(key)}"

    def put_bytes(self, key: str, data: bytes) -> None:
        path = self._path(key)
        try:
            if self._local:
                parent = os.path.dirname(path)
                if parent not in self._made:
                    _makedirs(parent)
                    if len(self._made) > 4096:
                        self._made.clear()
                    self._made.add(parent)
                tmp = f"{path}.tmp-{os.getpid()}-{next(_TMP_IDS)}-{uuid.uuid4().hex[:8]}"
                try:
                    try:
                        f = _create_private(tmp)
                    except FileNotFoundError:  # the directory was removed since we made it
                        _makedirs(parent)
                        f = _create_private(tmp)
                    with f:
                        f.write(data)
                    os.replace(tmp, path)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
                    raise
            else:
                self._fs.pipe_file(path, data)
        except Exception as e:
            if not _is_store_error(e):
                raise
            raise ArtifactStoreError(f"cannot write {self.uri(key)}: {_said(e)}",
                                     key=key, store=self._root_url,
                                     transient=_is_transient(e)) from e

    def put_file(self, key: str, local: str | os.PathLike[str]) -> None:
        """Upload a file without reading it into memory; atomic like put_bytes."""
        path = self._path(key)
        try:
            if self._local:
                parent = os.path.dirname(path)
                _makedirs(parent)
                tmp = f"{path}.tmp-{os.getpid()}-{next(_TMP_IDS)}-{uuid.uuid4().hex[:8]}"
                try:
                    _create_private(tmp).close()  # copyfile keeps the mode of what it replaces
                    shutil.copyfile(local, tmp)
                    os.replace(tmp, path)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
                    raise
            else:  # one PUT (or a completed multipart upload): readers never see half of it
                self._fs.put_file(os.fspath(local), path)
        except Exception as e:
            if not _is_store_error(e):
                raise
            raise ArtifactStoreError(f"cannot write {self.uri(key)} from {local}: {_said(e)}",
                                     key=key, store=self._root_url,
                                     transient=_is_transient(e)) from e

    def get_file(self, key: str, local: str | os.PathLike[str]) -> None:
        """Download to *local* (written beside it, then renamed)."""
        path = self._path(key)
        tmp = f"{os.fspath(local)}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            if self._local:
                shutil.copyfile(path, tmp)
            else:
                self._fs.get_file(path, tmp)
            os.replace(tmp, local)
        except FileNotFoundError as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise ArtifactNotFound(f"no artifact at {self.uri(key)}", key=key) from e
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise ArtifactStoreError(f"cannot read {self.uri(key)} into {local}: {e}",
                                     key=key) from e

    def get_bytes(self, key: str) -> bytes:
        return self.read_range(key, 0)

    def read_range(self, key: str, start: int) -> bytes:
        path = self._path(key)
        try:
            if self._local:
                with open(path, "rb") as f:
                    f.seek(start)
                    return f.read()
            if start:
                size = self._fs.size(path)
                if start >= size:
                    return b""
                return bytes(self._fs.cat_file(path, start=start))
            return bytes(self._fs.cat_file(path))
        except FileNotFoundError as e:
            raise ArtifactNotFound(f"no artifact at {self.uri(key)}", key=key) from e
        except Exception as e:
            if not _is_store_error(e):
                raise
            raise ArtifactStoreError(f"cannot read {self.uri(key)}: {_said(e)}", key=key,
                                     store=self._root_url, transient=_is_transient(e)) from e

    def exists(self, key: str) -> bool:
        path = self._path(key)
        if self._local:
            return os.path.exists(path)
        try:
            self._fs.invalidate_cache(path)
            return bool(self._fs.exists(path))
        except OSError as e:
            raise ArtifactStoreError(f"cannot check {self.uri(key)}: {e}", key=key) from e

    def list_keys(self, prefix: str) -> list[str]:
        return self._list(self._path(prefix), prefix)

    def list_all(self) -> list[str]:
        """Every key in the store."""
        return self._list(self._root_path, "")

    def _list(self, path: str, prefix: str) -> list[str]:
        try:
            self._fs.invalidate_cache(path)
            found = self._fs.find(path)
        except FileNotFoundError:
            return []
        except OSError as e:
            raise ArtifactStoreError(f"cannot list {self.uri(prefix)}: {e}", key=prefix) from e
        root = self._fs._strip_protocol(self._root_path).rstrip("/") + "/"
        out = []
        for p in found:
            p = self._fs._strip_protocol(p)
            if ".tmp-" in p.rsplit("/", 1)[-1]:
                continue
            out.append(p[len(root):] if p.startswith(root) else p)
        return sorted(out)

    def disk_usage(self, prefix: str) -> int:
        """Bytes stored under *prefix* (0 when nothing is)."""
        path = self._path(prefix)
        try:
            self._fs.invalidate_cache(path)
            return int(self._fs.du(path, total=True)) if self._fs.exists(path) else 0
        except FileNotFoundError:
            return 0
        except OSError as e:
            raise ArtifactStoreError(f"cannot measure {self.uri(prefix)}: {e}",
                                     key=prefix) from e

    def delete_prefix(self, prefix: str) -> None:
        path = self._path(prefix)
        try:
            if self._fs.exists(path):
                self._fs.rm(path, recursive=True)
        except FileNotFoundError:
            return
        except OSError as e:
            raise ArtifactStoreError(f"cannot delete {self.uri(prefix)}: {e}", key=prefix) from e


#: Packages whose exceptions mean the remote store failed (a connection refused, a timeout),
#: which do not all derive from OSError (botocore's EndpointConnectionError does not).
_STORE_PACKAGES = ("botocore", "aiobotocore", "aiohttp", "s3fs", "gcsfs", "adlfs", "azure",
                   "google", "urllib3", "requests")


def _is_store_error(error: BaseException) -> bool:
    return isinstance(error, OSError) or \
        type(error).__module__.partition(".")[0] in _STORE_PACKAGES


def _is_transient(error: BaseException) -> bool:
    """A store that could not be reached (refused, reset, timed out), worth waiting for."""
    seen: BaseException | None = error
    for _ in range(8):
        if seen is None:
            return False
        name = type(seen).__name__
        if isinstance(seen, ConnectionError | TimeoutError) or "Connect" in name \
                or "Timeout" in name:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _said(error: BaseException) -> str:
    """An error's own words, one line, with its type when that says more (no traceback)."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text if isinstance(error, OSError) else f"{type(error).__name__}: {text}"


def _makedirs(path: str) -> None:
    """``os.makedirs``, each directory it creates 0700 (not only the last one)."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path)
    if parent and parent != path:
        _makedirs(parent)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)


def _create_private(path: str) -> BinaryIO:
    """A new file open for writing, mode 0600 whatever the umask (payloads, results and
    logs are the user's alone)."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb")


def _protocols(fs: Any) -> tuple[str, ...]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else tuple(proto)


def _makedirs_private(path: str) -> None:
    """``os.makedirs`` whose every new directory, not only the last, is 0700 (makedirs gives
    the parents it creates the umask's mode; existing directories are left as they are)."""
    missing = []
    p = os.path.abspath(path)
    while not os.path.isdir(p):
        missing.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it meanwhile
            os.mkdir(d, 0o700)
