"""Small job payloads in the SQL metadata store (mixed into ``SqlMetadataStore``).

One row per payload: its pickle and its envelope's metadata, as ``serialization`` made them
(the HMAC inside is checked by whoever unpickles; this store never looks inside). Which
payloads come here and which stay files is ``shoal.jobs._payloads``'s choice.
"""

from __future__ import annotations

from collections.abc import Mapping

from shoal.errors import JobNotFound
from shoal.storage.sql._dbapi import Dbapi

__all__ = ["PayloadTables"]

_UPSERT = ("INSERT INTO job_payloads (job_name, kind, data, metadata) VALUES (?, ?, ?, ?) "
           "ON CONFLICT (job_name, kind) DO UPDATE SET data = excluded.data, "
           "metadata = excluded.metadata")


class PayloadTables:
    """The payload half of the SQL metadata store."""

    _db: Dbapi

    def put_job_payloads(self, name: str, payloads: Mapping[str, tuple[bytes, bytes]]) -> None:
        """Store (or replace) job *name*'s payloads, ``{kind: (pickle, metadata)}``, in one
        transaction. JobNotFound if no such job is recorded."""
        if not payloads:
            return
        rows = [(name, kind, bytes(data), bytes(meta)) for kind, (data, meta) in payloads.items()]
        try:
            with self._db.tx(write=True) as cur:
                cur.executemany(self._db.sql(_UPSERT), rows)
        except self._db.integrity_error as e:  # the foreign key: no such job
            raise JobNotFound(f"no job named {name!r} to store its {', '.join(payloads)} "
                              "payloads under", job=name) from e

    def get_job_payload(self, name: str, kind: str) -> tuple[bytes, bytes] | None:
        """Job *name*'s *kind* payload, ``(pickle, metadata)``; None when it is not stored
        here (a large payload, or a job stored before revision 0005: see the artifacts)."""
        with self._db.tx(write=False) as cur:
            cur.execute(self._db.sql("SELECT data, metadata FROM job_payloads "
                                     "WHERE job_name = ? AND kind = ?"), (name, kind))
            row = cur.fetchone()
        return None if row is None else (bytes(row[0]), bytes(row[1]))

    def job_payload_bytes(self, name: str) -> int:
        """Bytes of job *name*'s payloads stored here (pickles and metadata)."""
        with self._db.tx(write=False) as cur:
            cur.execute(self._db.sql("SELECT COALESCE(SUM(LENGTH(data) + LENGTH(metadata)), 0) "
                                     "FROM job_payloads WHERE job_name = ?"), (name,))
            row = cur.fetchone()
        assert row is not None  # an aggregate without GROUP BY gives one row
        return int(row[0] or 0)
