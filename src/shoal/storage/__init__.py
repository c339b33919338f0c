"""Artifact store (fsspec) and metadata store (SQLAlchemy). Knows nothing about jobs' meaning."""

from shoal.storage.artifacts import FsspecArtifactStore, job_key

__all__ = ["FsspecArtifactStore", "job_key", "open_metadata_store"]


def open_metadata_store(url: str, **kwargs: object):  # type: ignore[no-untyped-def]
    """Open the SQL metadata store for *url* (imports SQLAlchemy on first use)."""
    from shoal.storage.sql import SqlMetadataStore

    return SqlMetadataStore.open(url, **kwargs)  # type: ignore[arg-type]
