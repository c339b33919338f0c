"""``HttpArtifactStore``: the ``ArtifactStore`` port over a team server, on the server's own
artifact store (``file://`` or ``s3://`` there; nothing of it needs a credential here).

Keys travel as query parameters; bodies are raw bytes. ``put_file`` streams the file in
chunks with its ``Content-Length`` (never whole in memory) and ``get_file`` streams the
answer to a temporary file beside the target, renamed into place once complete. An upload
past the server's size limit is refused here before a byte is sent, and by the server (413)
should it get one. ``local_path`` is None: the bytes are on the server's host.
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections.abc import Iterator
from typing import Any

from shoal.client.http import ServerConnection
from shoal.errors import PayloadTooLargeError

__all__ = ["HttpArtifactStore"]

_CHUNK = 1024 * 1024


class HttpArtifactStore:
    """Bytes under keys in the team server's artifact store, through ``/api/v1``."""

    def __init__(self, connection: ServerConnection) -> None:
        self._http = connection
        self._info: dict[str, Any] | None = None
        self._lock = threading.Lock()

    @classmethod
    def open(cls, url: str, token: str | None) -> HttpArtifactStore:
        return cls(ServerConnection(url, token))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> HttpArtifactStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _described(self) -> dict[str, Any]:
        with self._lock:
            if self._info is None:
                self._info = dict(self._http.call("GET", "/artifact-store"))
            return self._info

    @property
    def root(self) -> str:
        """The server's artifact root (its URL on the server's host)."""
        return str(self._described()["root"])

    @property
    def max_upload_bytes(self) -> int:
        return int(self._described()["max_upload_bytes"])

    def uri(self, key: str) -> str:
        return f"{self.root}/{key}"

    def local_path(self, key: str) -> str | None:
        return None

    # --- writes -------------------------------------------------------------------------

    def put_bytes(self, key: str, data: bytes) -> None:
        self._check_size(key, len(data))
        self._http.request("PUT", "/artifacts", params={"key": key}, content=bytes(data),
                           length=len(data))

    def put_file(self, key: str, local: str | os.PathLike[str]) -> None:
        size = os.path.getsize(local)
        self._check_size(key, size)

        def chunks() -> Iterator[bytes]:
            with open(local, "rb") as f:
                while chunk := f.read(_CHUNK):
                    yield chunk

        self._http.request("PUT", "/artifacts", params={"key": key}, content=chunks,
                           length=size)

    def _check_size(self, key: str, size: int) -> None:
        limit = self.max_upload_bytes
        if size > limit:
            raise PayloadTooLargeError(
                f"{key!r} is {size} bytes, over the limit of {limit} bytes of the shoal server "
                f"at {self._http.url}; nothing was sent (its SHOAL_SERVER_MAX_UPLOAD_BYTES sets "
                "the limit)", key=key, limit=limit, size=size)

    def delete_prefix(self, prefix: str) -> None:
        self._http.request("DELETE", "/artifacts", params={"prefix": prefix})

    # --- reads --------------------------------------------------------------------------

    def get_file(self, key: str, local: str | os.PathLike[str]) -> None:
        """Stream *key* to *local* (written beside it, then renamed: never half a file)."""
        tmp = f"{os.fspath(local)}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            with self._http.download("/artifacts", params={"key": key}) as response, \
                    open(tmp, "wb") as f:
                for chunk in response.iter_bytes(_CHUNK):
                    f.write(chunk)
            os.replace(tmp, local)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def get_bytes(self, key: str) -> bytes:
        return self.read_range(key, 0)

    def read_range(self, key: str, start: int) -> bytes:
        params = {"key": key} if not start else {"key": key, "start": str(int(start))}
        return self._http.request("GET", "/artifacts", params=params).content

    def exists(self, key: str) -> bool:
        return bool(self._http.call("GET", "/artifacts/exists", params={"key": key})["exists"])

    def list_keys(self, prefix: str) -> list[str]:
        return [str(k) for k in self._http.call("GET", "/artifacts/keys",
                                                params={"prefix": prefix})]

    def disk_usage(self, prefix: str) -> int:
        return int(self._http.call("GET", "/artifacts/usage", params={"prefix": prefix})["bytes"])
