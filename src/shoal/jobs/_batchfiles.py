"""Where the payloads of batched jobs live in the artifact store.

A batch (``JobService.submit_batch``) is many calls of one function, each its own job. Their
payloads take one file per batch instead of four files (and three directories) per job:

- ``_functions/<sha256>/payload.pkl``: the function's pickle, content-addressed, shared by every
  batch that calls it (written once);
- ``_batches/<day>/<batch>.calls.pkl``: per job, the function's metadata (format, Python version
  and HMAC-SHA256 under that job's own key) and its arguments' pickle and metadata;
- ``_batches/<day>/<batch>.outcomes-<n>.pkl`` (n = 1, 2...): the results (or exceptions) of
  jobs that ended together, each with its metadata (HMAC under its job's key), written by the
  worker before it records those jobs ended.

``<day>`` is the batch's creation date (its id starts with it): one directory a day, so a batch
makes no directory of its own.

Each is one JSON line (per job: where its blobs are and their metadata) followed by the blobs,
written atomically like every artifact. Each job's record names its batch
(``spec.batch``); logs stay per job (``<job>/logs/output.log``). ``_`` never starts a
job name, so these prefixes cannot clash with a job's.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shoal.core.ports import ArtifactStore
from shoal.errors import ArtifactNotFound
from shoal.serialization import Payload

__all__ = ["BatchPayloads", "batch_files", "calls_key", "find_outcome", "is_batch_file", "is_function_key",
           "job_payload", "new_batch_id", "outcome_files", "read_batch", "write_batch"]

FORMAT = 1


def new_batch_id(now: datetime) -> str:
    return f"{now.strftime('%y%m%d-%H%M%S')}-{secrets.token_hex(6)}"


def _function_key(sha: str) -> str:
    return f"_functions/{sha}/payload.pkl"


def _batch_key(batch: str, name: str) -> str:
    return f"_batches/{batch[:6]}/{batch}.{name}"


def _pack(header: dict[str, Any], blobs: Sequence[bytes]) -> bytes:
    return json.dumps(header).encode() + b"\n" + b"".join(blobs)


def _unpack(data: bytes) -> tuple[dict[str, Any], memoryview]:
    end = data.index(b"\n")
    return json.loads(data[:end]), memoryview(data)[end + 1:]


def write_batch(artifacts: ArtifactStore, batch: str, function: Payload,
                jobs: Sequence[tuple[str, Payload, Payload]], *, known: set[str]) -> None:
    """Store a batch: *jobs* are ``(name, function payload signed for it, arguments)``.
    *known* holds the function digests this process already stored (it is updated)."""
    files, sha = batch_files(batch, function, jobs, known=known)
    fn_key = _function_key(sha)
    if fn_key in files and not artifacts.exists(fn_key):
        artifacts.put_bytes(fn_key, files[fn_key])
    known.add(sha)
    calls = _batch_key(batch, "calls.pkl")
    artifacts.put_bytes(calls, files[calls])


def batch_files(batch: str, function: Payload, jobs: Sequence[tuple[str, Payload, Payload]],
                *, known: set[str]) -> tuple[dict[str, bytes], str]:
    """The files of a batch (``write_batch``), key -> bytes, the function's pickle only when
    its digest is not in *known*; and that digest (the caller adds it to *known* once the
    files are stored)."""
    sha = hashlib.sha256(function.data).hexdigest()
    files = {} if sha in known else {_function_key(sha): function.data}
    index: dict[str, Any] = {}
    offset = 0
    for name, fn, args in jobs:
        index[name] = {"function": fn.metadata.decode(), "offset": offset,
                       "size": len(args.data), "arguments": args.metadata.decode()}
        offset += len(args.data)
    files[_batch_key(batch, "calls.pkl")] = _pack(
        {"format": FORMAT, "function": sha, "jobs": index}, [a.data for _, _, a in jobs])
    return files, sha


def is_function_key(key: str, data: bytes) -> bool:
    """Whether *key* is the content-addressed key of the function pickle *data*."""
    return key == _function_key(hashlib.sha256(data).hexdigest())


def is_batch_file(key: str, batch: str) -> bool:
    """Whether *key* is one of batch *batch*'s own files (calls, outcome parts)."""
    return key.startswith(_batch_key(batch, "")) and "/" not in key[len(_batch_key(batch, "")):]


@dataclass(frozen=True, slots=True)
class BatchPayloads:
    """A batch as read back: the function's pickle and, per job, what it needs to run."""

    function: bytes
    #: job name -> (function metadata, arguments pickle, arguments metadata)
    jobs: dict[str, tuple[bytes, bytes, bytes]]


def calls_key(batch: str) -> str:
    """The key of a batch's calls file."""
    return _batch_key(batch, "calls.pkl")


def read_batch(artifacts: ArtifactStore, batch: str, *, cache: dict[str, bytes] | None = None,
               calls: bytes | None = None) -> BatchPayloads:
    """Read a batch's payloads (*cache*: function pickles by digest, kept by the caller;
    *calls*: the calls file's bytes, when they came already)."""
    index, blobs = _unpack(artifacts.get_bytes(_batch_key(batch, "calls.pkl"))
                           if calls is None else calls)
    sha = str(index["function"])
    function = cache.get(sha) if cache is not None else None
    if function is None:
        function = artifacts.get_bytes(_function_key(sha))
        if cache is not None:
            cache.clear()  # one function at a time is what a warm pool sees
            cache[sha] = function
    jobs = {name: (e["function"].encode(), bytes(blobs[e["offset"]:e["offset"] + e["size"]]),
                   e["arguments"].encode()) for name, e in index["jobs"].items()}
    return BatchPayloads(function, jobs)


def job_payload(artifacts: ArtifactStore, batch: str, name: str, kind: str) -> Payload:
    """One job's ``function`` or ``arguments`` payload, out of its batch."""
    payloads = read_batch(artifacts, batch)
    if name not in payloads.jobs:
        raise ArtifactNotFound(f"job {name} is not in batch {batch}",
                               key=_batch_key(batch, "calls.pkl"))
    fmeta, adata, ameta = payloads.jobs[name]
    if kind == "function":
        return Payload(payloads.function, fmeta)
    return Payload(adata, ameta)


def outcome_files(batch: str, part: int, outcomes: Sequence[tuple[str, str, Payload]]
                  ) -> dict[str, bytes]:
    """The results or exceptions (*outcomes*: ``(job, kind, payload)``) of jobs that ended
    together, as part *part* (1, 2...) of the batch: its one file, key -> bytes (stored
    before those jobs' ends are recorded: ``JobService.advance_many(files=)``)."""
    index: dict[str, Any] = {}
    offset = 0
    for name, kind, payload in outcomes:
        index[name] = {"kind": kind, "offset": offset, "size": len(payload.data),
                       "metadata": payload.metadata.decode()}
        offset += len(payload.data)
    return {_batch_key(batch, f"outcomes-{part}.pkl"): _pack(
        {"format": FORMAT, "jobs": index}, [p.data for _, _, p in outcomes])}


def find_outcome(artifacts: ArtifactStore, batch: str, name: str) -> tuple[str, Payload] | None:
    """A batched job's result or exception (``(kind, payload)``); None when it has none."""
    for part in itertools.count(1):
        try:
            index, blobs = _unpack(artifacts.get_bytes(_batch_key(batch, f"outcomes-{part}.pkl")))
        except ArtifactNotFound:
            return None
        entry = index["jobs"].get(name)
        if entry is not None:
            start = int(entry["offset"])
            return str(entry["kind"]), Payload(bytes(blobs[start:start + int(entry["size"])]),
                                               entry["metadata"].encode())
    return None
