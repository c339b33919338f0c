"""Routes of the ``ArtifactStore`` port: keys under the server's own artifact store.

Uploads stream to a temporary file on the server (never whole in memory), counted against the
size limit as they come (and refused at once when their ``Content-Length`` says they are
over it), then go in with the store's atomic ``put_file``: a reader never sees half an
artifact, and a refused or broken upload leaves nothing behind. Downloads stream from the
store's file (opened before the answer starts, so a concurrent replace cannot mix versions).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, BinaryIO

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from shoal.core.ports import ArtifactStore
from shoal.errors import ArtifactNotFound, PayloadTooLargeError
from shoal.storage.artifacts import check_key

__all__ = ["DEFAULT_MAX_UPLOAD_BYTES", "artifact_routes"]

DEFAULT_MAX_UPLOAD_BYTES = 20 * 1024**3
_CHUNK = 1024 * 1024
Key = Annotated[str, Query(description="a relative path below the store's root")]
Prefix = Annotated[str, Query(description="a key prefix (a directory of keys)")]
#: Called with the request, the key (or prefix) and "write"/"delete" before a change: raises
#: PermissionDeniedError for keys the caller may not change (an endpoint's files).
WriteGuard = Callable[[Request, str, str], None]


def artifact_routes(store: ArtifactStore, *, upload_dir: Path | None = None,
                    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES,
                    guard: WriteGuard | None = None) -> APIRouter:
    api = APIRouter(tags=["artifacts"])

    @api.get("/artifact-store")
    def describe() -> dict[str, str | int]:
        return {"root": store.root, "max_upload_bytes": max_upload_bytes}

    @api.put("/artifacts", status_code=204)
    async def put_artifact(request: Request, key: Key) -> None:
        check_key(key)
        if guard is not None:
            await run_in_threadpool(guard, request, key, "write")
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_upload_bytes:
            raise _too_large(key, int(declared), max_upload_bytes)
        if upload_dir is not None:
            upload_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(prefix="upload-", dir=upload_dir)
        try:
            with os.fdopen(fd, "wb") as f:
                await _receive(request, f, key, max_upload_bytes)
            await run_in_threadpool(store.put_file, key, tmp)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    @api.get("/artifacts")
    def get_artifact(key: Key, start: Annotated[int, Query(ge=0)] = 0) -> Response:
        check_key(key)
        if start:  # the rest of a log: small, and read whole by the port anyway
            return Response(store.read_range(key, start), media_type="application/octet-stream")
        f, size = _open(store, key, upload_dir)
        return StreamingResponse(_chunks(f), media_type="application/octet-stream",
                                 headers={"Content-Length": str(size)},
                                 background=BackgroundTask(f.close))

    @api.get("/artifacts/exists")
    def exists(key: Key) -> dict[str, bool]:
        return {"exists": store.exists(check_key(key))}

    @api.get("/artifacts/keys")
    def list_keys(prefix: Prefix) -> list[str]:
        return store.list_keys(check_key(prefix))

    @api.get("/artifacts/usage")
    def disk_usage(prefix: Prefix) -> dict[str, int]:
        return {"bytes": store.disk_usage(check_key(prefix))}

    @api.delete("/artifacts", status_code=204)
    def delete_prefix(prefix: Prefix, request: Request) -> None:
        check_key(prefix)
        if guard is not None:
            guard(request, prefix, "delete")
        store.delete_prefix(prefix)

    return api


async def _receive(request: Request, f: BinaryIO, key: str, limit: int) -> None:
    """Write the request's body to *f* as it comes; PayloadTooLargeError once past *limit*."""
    received = 0
    async for chunk in request.stream():
        received += len(chunk)
        if received > limit:
            raise _too_large(key, received, limit)
        if chunk:
            await run_in_threadpool(f.write, chunk)


def _too_large(key: str, size: int, limit: int) -> PayloadTooLargeError:
    return PayloadTooLargeError(
        f"the upload of {key!r} is over this server's limit of {limit} bytes (at least "
        f"{size} bytes); nothing was stored. The server's SHOAL_SERVER_MAX_UPLOAD_BYTES sets "
        "the limit", key=key, limit=limit, size=size)


def _open(store: ArtifactStore, key: str, spool: Path | None) -> tuple[BinaryIO, int]:
    """*key*'s bytes as an open file, and its size: the store's own file on local disk, else
    a copy fetched into *spool* (unlinked at once: it goes when the file is closed)."""
    path = store.local_path(key)
    if path is None:
        if spool is not None:
            spool.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(prefix="download-", dir=spool)
        os.close(fd)
        try:
            store.get_file(key, tmp)
            f = open(tmp, "rb")  # noqa: SIM115 - closed by the response's background task
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return f, os.fstat(f.fileno()).st_size
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed by the response's background task
    except FileNotFoundError as e:
        raise ArtifactNotFound(f"no artifact at {store.uri(key)}", key=key) from e
    except IsADirectoryError as e:
        raise ArtifactNotFound(f"no artifact at {store.uri(key)} (a prefix of keys)",
                               key=key) from e
    return f, os.fstat(f.fileno()).st_size


def _chunks(f: BinaryIO) -> Iterator[bytes]:
    while chunk := f.read(_CHUNK):
        yield chunk
