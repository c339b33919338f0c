"""Files to and from any fsspec URL, in the shapes SageMaker's ``Session`` and ``sagemaker.s3``
give them (``upload_data``, ``download_data``, ``read_s3_file``, ``list_s3_files``).

Writes go through ``FsspecArtifactStore`` (write then rename, or one PUT), so a reader never
sees half a file. A bare path is a local directory or file.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shoal._internal.extras import require_for_url
from shoal.errors import ArtifactNotFound, ArtifactStoreError, InvalidArgumentError
from shoal.storage.artifacts import FsspecArtifactStore

__all__ = ["download", "join", "list_files", "read_bytes", "upload_path", "write_bytes"]


def join(root: str, *parts: str) -> str:
    """*root* and *parts* joined with single slashes (``s3://b`` + ``a/`` + ``x`` → ``s3://b/a/x``)."""
    out = root.rstrip("/")
    for part in parts:
        part = str(part).strip("/")
        if part:
            out = f"{out}/{part}"
    return out


def _fs(url: str) -> tuple[Any, str]:
    """(fsspec filesystem, path in it) for *url*; Any: fsspec ships no type information."""
    import fsspec.core

    require_for_url(url, f"reading {url}")
    try:
        fs, path = fsspec.core.url_to_fs(url)
        return fs, str(path)
    except (ImportError, ValueError) as e:
        raise ArtifactStoreError(f"cannot open {url!r}: {e}. For s3:// install shoal[s3].",
                                 url=url) from e


def upload_path(path: str | os.PathLike[str], url: str,
                callback: Callable[[int], Any] | None = None) -> str:
    """Upload a file to ``<url>/<name>`` or a directory's files under ``<url>/``; return the
    file's URI, or *url* for a directory (SageMaker's ``upload_data``)."""
    src = Path(path).expanduser()
    if not src.exists():
        raise InvalidArgumentError(f"upload: {src} does not exist (looked for {src.resolve()})",
                                   path=str(src))
    store = FsspecArtifactStore.open(url)
    files = [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file())
    base = src.parent if src.is_file() else src
    for f in files:
        store.put_file(f.relative_to(base).as_posix(), f)
        if callback is not None:
            callback(f.stat().st_size)
    return store.uri(src.name) if src.is_file() else store.root


def write_bytes(url: str, body: bytes) -> str:
    """*body* as the object at *url*; return *url*."""
    parent, _, name = url.rstrip("/").rpartition("/")
    if not name or not parent or parent.endswith(":/"):
        raise InvalidArgumentError(f"{url!r} names no object: give a URL such as "
                                   "s3://bucket/key or file:///dir/name", url=url)
    FsspecArtifactStore.open(parent).put_bytes(name, body)
    return url


def read_bytes(url: str) -> bytes:
    """The object at *url*."""
    fs, path = _fs(url)
    try:
        if fs.isdir(path):
            raise InvalidArgumentError(f"{url} is a directory (prefix), not an object; list it "
                                       "with S3Downloader.list", url=url)
        return bytes(fs.cat_file(path))
    except FileNotFoundError as e:
        raise ArtifactNotFound(f"no object at {url}", url=url) from e
    except OSError as e:
        raise ArtifactStoreError(f"cannot read {url}: {e}", url=url) from e


def list_files(url: str) -> list[str]:
    """Every object under *url* (a prefix, or the object itself), as full URLs, sorted."""
    fs, path = _fs(url)
    try:
        fs.invalidate_cache(path)
        if fs.isfile(path):
            return [url]
        found = fs.find(path)
    except FileNotFoundError:
        return []
    except OSError as e:
        raise ArtifactStoreError(f"cannot list {url}: {e}", url=url) from e
    base = fs._strip_protocol(path).rstrip("/")
    out = []
    for p in found:
        p = fs._strip_protocol(p)
        if ".tmp-" in p.rsplit("/", 1)[-1]:
            continue
        out.append(join(url, p[len(base):]) if p.startswith(base + "/") else p)
    return sorted(out)


def download(url: str, local: str | os.PathLike[str]) -> list[str]:
    """Copy the object at *url*, or every object under it, into the directory *local*; return
    the local paths (SageMaker's ``download_data``: an object lands as ``local/<name>``,
    a prefix's objects keep their paths below it)."""
    target = Path(local).expanduser()
    fs, path = _fs(url)
    single = fs.isfile(path)
    urls = [url] if single else list_files(url)
    if not urls:
        raise ArtifactNotFound(f"nothing to download at {url}", url=url)
    out = []
    for item in urls:
        rel = item.rstrip("/").rsplit("/", 1)[-1] if single else item[len(url.rstrip("/")) + 1:]
        dest = target / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
        try:
            fs.get_file(fs._strip_protocol(item) if "://" in item else item, str(tmp))
            os.replace(tmp, dest)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise ArtifactStoreError(f"cannot download {item} to {dest}: {e}", url=item) from e
        out.append(str(dest))
    return out
