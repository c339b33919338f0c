"""At SageMaker's path ``sagemaker.s3``: ``S3Uploader`` and ``S3Downloader`` over any fsspec URL.

``s3://`` goes to S3 (or an S3-compatible store) through s3fs; ``file://``, ``gs://``,
``az://``, ``memory://`` and bare local paths work the same way, so code written for S3 runs
against the artifact store (``Session().default_bucket()`` is its root).

Example::

    uri = S3Uploader.upload("data/train.csv", f"{sess.default_bucket()}/data")
    S3Downloader.read_file(uri)
"""

from __future__ import annotations

import io
import os
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from shoal.errors import InvalidArgumentError

if TYPE_CHECKING:
    from shoal.session import Session

__all__ = ["S3Downloader", "S3Uploader", "is_s3_url", "parse_s3_url", "s3_path_join"]


def parse_s3_url(url: str) -> tuple[str, str]:
    """(bucket, key) of an ``s3://`` URL (ValueError for another scheme, as SageMaker's)."""
    parsed = urlparse(url)
    if parsed.scheme != "s3":
        raise ValueError(f"Expecting 's3' scheme, got: {parsed.scheme} in {url}.")
    return parsed.netloc, parsed.path.lstrip("/")


def is_s3_url(url: str) -> bool:
    return isinstance(url, str) and urlparse(url).scheme == "s3"


def s3_path_join(*args: str, with_end_slash: bool = False) -> str:
    """The parts joined by single slashes; a leading ``scheme://`` is kept."""
    parts = [str(a) for a in args if a]
    if not parts:
        return ""
    head = ""
    if "://" in parts[0]:
        scheme, _, rest = parts[0].partition("://")
        head, parts[0] = f"{scheme}://", rest
    lead = "/" if parts[0].startswith("/") else ""  # file:///dir keeps its root
    joined = "/".join(p.strip("/") for p in parts if p.strip("/"))
    out = head + lead + joined
    return out + "/" if with_end_slash and not out.endswith("/") else out


def _session(given: Session | None) -> Session:
    from shoal.session import Session, current

    return given if isinstance(given, Session) else current()


def _url(uri: Any, name: str) -> str:
    if not isinstance(uri, str) or not uri:
        raise InvalidArgumentError(f"{name} must be a URL such as s3://bucket/prefix or "
                                   f"file:///dir, got {uri!r}", argument=name)
    return uri


def _kms(session: Session, kms_key: str | None) -> None:
    if kms_key:
        session.report_inert("kms_key", f"kms_key={kms_key!r} has no effect on this store")


class S3Uploader:
    """Static methods that upload files, text and bytes."""

    @staticmethod
    def upload(local_path: str | os.PathLike[str], desired_s3_uri: str,
               kms_key: str | None = None, sagemaker_session: Session | None = None,
               callback: Any = None) -> str:
        """Upload a file (to ``<uri>/<name>``) or a directory (its files under ``<uri>/``);
        return the URI."""
        from shoal.storage.transfer import upload_path

        _kms(_session(sagemaker_session), kms_key)
        return upload_path(local_path, _url(desired_s3_uri, "desired_s3_uri"),
                           callback=callback)

    @staticmethod
    def upload_string_as_file_body(body: str, desired_s3_uri: str | None = None,
                                   kms_key: str | None = None,
                                   sagemaker_session: Session | None = None) -> str:
        """Write *body* (text) as the object *desired_s3_uri*; return the URI."""
        from shoal.storage.transfer import write_bytes

        _kms(_session(sagemaker_session), kms_key)
        return write_bytes(_url(desired_s3_uri, "desired_s3_uri"), str(body).encode("utf-8"))

    @staticmethod
    def upload_bytes(b: bytes | io.BytesIO, s3_uri: str, kms_key: str | None = None,
                     sagemaker_session: Session | None = None) -> str:
        """Write *b* (bytes or a BytesIO) as the object *s3_uri*; return the URI."""
        from shoal.storage.transfer import write_bytes

        _kms(_session(sagemaker_session), kms_key)
        data = b.getvalue() if isinstance(b, io.BytesIO) else bytes(b)
        return write_bytes(_url(s3_uri, "s3_uri"), data)


class S3Downloader:
    """Static methods that download, read and list."""

    @staticmethod
    def download(s3_uri: str, local_path: str | os.PathLike[str], kms_key: str | None = None,
                 sagemaker_session: Session | None = None) -> list[str]:
        """Copy the object, or every object under the prefix, into *local_path*; return the
        local paths."""
        from shoal.storage.transfer import download

        _kms(_session(sagemaker_session), kms_key)
        return download(_url(s3_uri, "s3_uri"), local_path)

    @staticmethod
    def read_file(s3_uri: str, sagemaker_session: Session | None = None) -> str:
        """The object's body as UTF-8 text."""
        from shoal.storage.transfer import read_bytes

        return read_bytes(_url(s3_uri, "s3_uri")).decode("utf-8")

    @staticmethod
    def read_bytes(s3_uri: str, sagemaker_session: Session | None = None) -> bytes:
        """The object's body."""
        from shoal.storage.transfer import read_bytes

        return read_bytes(_url(s3_uri, "s3_uri"))

    @staticmethod
    def list(s3_uri: str, sagemaker_session: Session | None = None) -> list[str]:
        """The URIs of the objects under *s3_uri*, sorted."""
        from shoal.storage.transfer import list_files

        return list_files(_url(s3_uri, "s3_uri"))
