"""``HttpJobStore``: the ``JobStore`` port (job records, transitions, handles, small payloads)
over a team server.

Each method is one request, and the server makes it one store call: a compare-and-set
(``expected``, ``expected_attempt``) is decided by the server's store, atomically, and a
lost race comes back as the same ``InvalidTransitionError``. Transitions are POSTs, never
retried (a retry could apply a move twice); reads and handle writes are retried.
"""

from __future__ import annotations

import base64
import heapq
from collections.abc import Iterator, Mapping, Sequence
from enum import StrEnum
from typing import Any
from urllib.parse import quote

from shoal.client.http import ServerConnection
from shoal.core.jobs import FailureKind, JobChange, JobRecord, JobSpec, JobStatus
from shoal.core.ports import Handle, JobQuery, JobSort
from shoal.errors import InvalidArgumentError, JobNotFound

__all__ = ["HttpJobStore"]

#: Names per ``GET /jobs`` of a query by names (they travel in the URL).
_NAMES_PER_REQUEST = 100


def _order_key(query: JobQuery) -> Any:
    """The store's order of *query* (``storage.sql._jobquery``), to merge pages by."""
    def key(r: JobRecord) -> tuple[Any, ...]:
        if query.sort is JobSort.NAME:
            return (r.name,)
        if query.sort is JobSort.STATUS:
            return (r.status.value, r.created_at, r.name)
        if query.sort is JobSort.DURATION:
            ran = None if r.started_at is None or r.ended_at is None else \
                (r.ended_at - r.started_at).total_seconds()
            return (ran if ran is not None else -1.0 if query.descending else 1e300,
                    r.created_at, r.name)
        return (r.created_at, r.name)
    return key


def job_record(body: Mapping[str, Any]) -> JobRecord:
    """A ``JobRecord`` from the server's JSON (``server._wire_jobs.JobOut``)."""
    return JobRecord.from_json(body)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _enum(value: StrEnum | None) -> str | None:
    return None if value is None else str(value)  # a StrEnum's str is its value


class HttpJobStore:
    """Job records through ``shoal server``'s ``/api/v1``."""

    def __init__(self, connection: ServerConnection) -> None:
        self._http = connection

    @classmethod
    def open(cls, url: str, token: str | None) -> HttpJobStore:
        return cls(ServerConnection(url, token))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> HttpJobStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- records ------------------------------------------------------------------------

    def create_job(self, spec: JobSpec, *, key_salt: str, backend: str,
                   owner: str = "local") -> JobRecord:
        # *owner* is not sent: the server records its caller's user.
        return job_record(self._http.call("POST", "/jobs", json={
            "spec": spec.to_json(), "key_salt": key_salt, "backend": backend}))

    def create_jobs(self, specs: Sequence[JobSpec], *, key_salts: Sequence[str],
                    backend: str, owner: str = "local") -> list[JobRecord]:
        if len(key_salts) != len(specs):
            raise ValueError("create_jobs needs one key salt per spec")
        if not specs:
            return []
        return [job_record(r) for r in self._http.call("POST", "/job-batches", json={
            "specs": [s.to_json() for s in specs], "key_salts": list(key_salts),
            "backend": backend})]

    def get_job(self, name: str) -> JobRecord:
        return job_record(self._http.call("GET", _job(name)))

    def find_job(self, name: str) -> JobRecord | None:
        try:
            return self.get_job(name)
        except JobNotFound:
            return None

    def list_jobs(self, query: JobQuery) -> list[JobRecord]:
        if len(query.names) <= _NAMES_PER_REQUEST:
            return self._list(query, query.names)
        # Many names (a batch's jobs) go in parts; the parts' newest-first lists are merged.
        parts = [self._list(query, query.names[i:i + _NAMES_PER_REQUEST])
                 for i in range(0, len(query.names), _NAMES_PER_REQUEST)]
        merged = heapq.merge(*parts, key=_order_key(query), reverse=query.descending)
        return list(merged)[:query.limit]

    def _list(self, query: JobQuery, names: Sequence[str]) -> list[JobRecord]:
        params: list[tuple[str, str]] = [("status", str(s)) for s in query.statuses]
        params += [("name", n) for n in names]
        for key, value in (("name_prefix", query.name_prefix),
                           ("name_contains", query.name_contains)):
            if value is not None:
                params.append((key, value))
        for key, moment in (("created_after", query.created_after),
                            ("ended_before", query.ended_before)):
            if moment is not None:
                params.append((key, moment.isoformat()))
        if query.owner is not None:
            params.append(("owner", query.owner))
        if query.before is not None:
            params += [("before", query.before[0].isoformat()), ("before_name", query.before[1])]
        for key, value in query.tags:
            if "=" in key:
                raise InvalidArgumentError(f"tag key {key!r} holds '=', which a filter through "
                                           "a team server cannot carry (tag=key=value)", tag=key)
            params.append(("tag", f"{key}={value}"))
        if query.sort is not JobSort.CREATED or not query.descending:
            params += [("sort", query.sort.value), ("order", "desc" if query.descending else "asc")]
        if query.after is not None:
            params.append(("after", query.after))
        params.append(("limit", str(int(query.limit))))
        return [job_record(r) for r in self._http.call("GET", "/jobs", params=params)]

    def iter_unfinished(self) -> Iterator[JobRecord]:
        return iter([job_record(r) for r in self._http.call("GET", "/unfinished-jobs")])

    def get_job_key_salt(self, name: str) -> str:
        return str(self._http.call("GET", _job(name) + "/key-salt")["key_salt"])

    def delete_jobs(self, names: Sequence[str]) -> list[str]:
        if not names:
            return []
        return list(self._http.call("POST", "/job-deletions", json={"names": list(names)}))

    # --- payloads -----------------------------------------------------------------------

    def put_job_payloads(self, name: str, payloads: Mapping[str, tuple[bytes, bytes]]) -> None:
        self._http.call("PUT", _job(name) + "/payloads", json={"payloads": {
            kind: [_b64(p), _b64(m)] for kind, (p, m) in payloads.items()}})

    def get_job_payload(self, name: str, kind: str) -> tuple[bytes, bytes] | None:
        found = self._http.call("GET", _job(name) + f"/payloads/{_q(kind)}")
        if found is None:
            return None
        return base64.b64decode(found["pickle"]), base64.b64decode(found["metadata"])

    def job_payload_bytes(self, name: str) -> int:
        return int(self._http.call("GET", _job(name) + "/payload-bytes")["bytes"])

    # --- transitions and handles --------------------------------------------------------

    def update_job(
        self, name: str, *, status: JobStatus, expected: JobStatus | None = None,
        reason: str | None = None, failure_kind: FailureKind | None = None,
        exit_code: int | None = None, attempt: int | None = None,
        handle: Handle | None = None, env_setup_seconds: float | None = None,
        want_record: bool = True, expected_attempt: int | None = None,
    ) -> JobRecord | None:
        body = {"status": _enum(status), "expected": _enum(expected), "reason": reason,
                "failure_kind": _enum(failure_kind), "exit_code": exit_code,
                "attempt": attempt, "handle": None if handle is None else dict(handle),
                "env_setup_seconds": env_setup_seconds, "want_record": want_record,
                "expected_attempt": expected_attempt}
        found = self._http.call("POST", _job(name) + "/transitions", json=body)
        return None if found is None else job_record(found)

    def update_jobs(self, changes: Sequence[JobChange]) -> list[bool]:
        if not changes:
            return []
        return [bool(b) for b in self._http.call("POST", "/job-transitions", json={
            "changes": [_change(c) for c in changes]})]

    def take_batch(self, names: Sequence[str], handle: Handle, batch: str
                   ) -> tuple[dict[str, JobStatus], JobRecord, bytes]:
        """``BatchTaker``: ``PUT /job-handles/take``, the handles set, the first job's
        record and the batch's calls file in one request."""
        out = self._http.call("PUT", "/job-handles/take", json={
            "names": list(names), "handle": dict(handle), "batch": batch})
        return ({str(n): JobStatus(s) for n, s in out["statuses"].items()},
                job_record(out["record"]), base64.b64decode(out["calls"]))

    def update_jobs_with_files(self, changes: Sequence[JobChange],
                               files: Mapping[str, bytes]) -> list[bool]:
        """``OutcomeRecorder``: the files and the changes in one ``POST /job-transitions``
        (the server stores the files first)."""
        return [bool(b) for b in self._http.call("POST", "/job-transitions", json={
            "changes": [_change(c) for c in changes],
            "files": {k: _b64(v) for k, v in files.items()}})]

    def set_handle(self, name: str, handle: Handle) -> None:
        self._http.call("PUT", _job(name) + "/handle", json={"handle": dict(handle)})

    def set_handles(self, names: Sequence[str], handle: Handle) -> dict[str, JobStatus]:
        if not names:
            return {}
        found = self._http.call("PUT", "/job-handles", json={"names": list(names),
                                                             "handle": dict(handle)})
        return {str(n): JobStatus(s) for n, s in found.items()}


def _change(c: JobChange) -> dict[str, Any]:
    return c.to_json()


def _q(segment: str) -> str:
    return quote(segment, safe="")


def _job(name: str) -> str:
    return f"/jobs/{_q(name)}"
