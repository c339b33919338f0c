"""Where a job's payloads live: small ones in the metadata store, large ones as files.

A payload is a pickle and its envelope's metadata (``shoal.serialization``: format, versions,
HMAC-SHA256 under the job's own key). Stored as files, each takes ``<job>/<kind>/payload.pkl``
and ``metadata.json`` (the artifact layout of ARCHITECTURE.md): two files and a directory, a
4 KiB block each on a local disk, for what is usually a few hundred bytes. So a payload whose
pickle is at most ``INLINE_MAX_BYTES`` is one row of the metadata store instead
(``job_payloads``, revision 0005), with the same bytes and the same HMAC: whoever reads it
verifies it as before, and a changed row is refused like a changed file.

Readers look in the metadata store first, then at the files: a large payload, and every
payload of a job stored before revision 0005, is read from the artifact layout as it always
was. A job's stored payloads go with its record (the rows cascade on delete) or with its
artifact prefix (the files).
"""

from __future__ import annotations

from collections.abc import Mapping

from shoal.core.ports import ArtifactStore, JobStore
from shoal.serialization import Payload
from shoal.storage.artifacts import job_key

__all__ = ["INLINE_MAX_BYTES", "KINDS", "load_payload", "payload_files", "store_payloads"]

#: The largest pickle stored in the metadata store; a larger one is a file in the artifact
#: store (a database is no place for a 1 GB argument, and above a few blocks the files'
#: overhead no longer matters).
INLINE_MAX_BYTES = 16 * 1024

KINDS = ("function", "arguments", "results", "exception")


def payload_files(job: str, kind: str) -> tuple[str, str]:
    """The artifact keys of a payload stored as files: the pickle, then its metadata."""
    return job_key(job, kind, "payload.pkl"), job_key(job, kind, "metadata.json")


def store_payloads(metadata: JobStore, artifacts: ArtifactStore, job: str,
                   payloads: Mapping[str, Payload]) -> None:
    """Store job *job*'s *payloads* (``{kind: Payload}``): the small ones in one transaction
    of the metadata store, the others as files (the pickle first, its metadata last: a reader
    that finds the metadata finds both)."""
    inline = {kind: (p.data, p.metadata) for kind, p in payloads.items()
              if len(p.data) <= INLINE_MAX_BYTES}
    for kind, p in payloads.items():
        if kind not in inline:
            data_key, meta_key = payload_files(job, kind)
            artifacts.put_bytes(data_key, p.data)
            artifacts.put_bytes(meta_key, p.metadata)
    metadata.put_job_payloads(job, inline)


def load_payload(metadata: JobStore, artifacts: ArtifactStore, job: str, kind: str) -> Payload:
    """Job *job*'s *kind* payload, from the metadata store or else its files.
    ArtifactNotFound (naming the file) when it is in neither."""
    row = metadata.get_job_payload(job, kind)
    if row is not None:
        return Payload(row[0], row[1])
    data_key, meta_key = payload_files(job, kind)
    return Payload(artifacts.get_bytes(data_key), artifacts.get_bytes(meta_key))

