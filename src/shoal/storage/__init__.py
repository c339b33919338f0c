"""Artifact store (fsspec) and metadata store (SQLAlchemy). Knows nothing about jobs' meaning."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shoal.storage.artifacts import FsspecArtifactStore, job_key

if TYPE_CHECKING:
    from shoal.core.clock import Clock
    from shoal.storage.sql import SqlMetadataStore

__all__ = ["FsspecArtifactStore", "job_key", "open_metadata_store"]


def open_metadata_store(url: str, *, clock: Clock | None = None,
                        create: bool = False) -> SqlMetadataStore:
    """Open the SQL metadata store for *url* (imports SQLAlchemy on first use)."""
    from shoal.storage.sql import SqlMetadataStore

    return SqlMetadataStore.open(url, clock=clock, create=create)
