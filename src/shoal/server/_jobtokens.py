"""Job tokens: what a job's supervisor (and the job) send to the team server.

The server mints one per launch (a job, or the jobs of a batch handed over together) when it
starts the supervisor, owned by the user who submitted it. A token is stateless:
``shoalj_<payload>.<mac>``, the payload (base64url JSON: user, jobs, batch id) signed with
HMAC-SHA256 under a secret only the server holds (``<server home>/server/job-token-secret``,
32 random bytes, 0600, created on first use). Nothing is written per launch (the warm
``@remote`` path stays one round trip) and nothing needs cleaning up; deleting the secret file
revokes every job token at once. What a token may touch is checked per request
(``JobToken.may_touch_key`` and ``server/_auth.py``): its jobs' records, payloads and keys
(``<job>/...``), its batch's files (``_batches/<day>/<batch>.*``), function pickles
(``_functions/<sha256>/``, read only: content-addressed, shared by batches) and metrics of the
owner ``job:<name>``; and the experiment run each job is linked to on its record
(``JobSpec.run``: the ``with Run(...)`` the client had open, or ``experiment_config``), with
its metrics (``run:<experiment>/<run>``) and logged files (``experiments/<experiment>/<run>/``),
which :class:`JobGrants` reads from the server's records, never from the token. Once every
job of a token has ended (or its record is gone, or is another user's), the token may write
nothing more (``JobGrants.why_ended``); it still reads.

Replica tokens (``shoale_``, the same secret under another label, so neither kind passes for
the other) are what the Ray Serve replicas of an endpoint the server started send
(``server/_endpoint_runtime.py``): minted for the endpoint's owner, they read the endpoint's
model (its ``model_data`` key, or the keys under it) and its ``endpoints/<name>/`` code,
requirements and model, and write its replicas' logs (``endpoints/<name>/logs/``) while the
endpoint exists; nothing else (``EndpointToken.may_touch_key``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from shoal.core.jobs import JobStatus, RunRef
from shoal.core.ports import JobQuery, JobStore
from shoal.errors import AuthenticationError

__all__ = ["ENDPOINT_TOKEN_PREFIX", "JOB_TOKEN_PREFIX", "RUN_FILES", "EndpointToken",
           "JobGrants", "JobToken", "JobTokens"]

JOB_TOKEN_PREFIX = "shoalj_"
ENDPOINT_TOKEN_PREFIX = "shoale_"
_LABEL = b"shoal/job-token/v1\0"
_ENDPOINT_LABEL = b"shoal/endpoint-token/v1\0"
#: What an endpoint's replicas read under ``endpoints/<name>/`` (and write: ``logs``).
_ENDPOINT_READS = ("model", "code", "env", "logs")


@dataclass(frozen=True, slots=True)
class JobToken:
    """What a verified job token allows: the jobs of one launch, for their owner."""

    user: str
    jobs: frozenset[str]
    #: The batch id when the jobs were handed over together (its files are theirs too).
    batch: str | None = None

    @property
    def shown(self) -> str:
        """How errors name the token: its job, or its batch and first job."""
        first = min(self.jobs)
        return f"job {first}" if len(self.jobs) == 1 else \
            f"batch {self.batch or '?'} (jobs {first}, ... {len(self.jobs)} in all)"

    def may_touch_key(self, key: str, *, write: bool) -> bool:
        key = key.lstrip("/")
        job = key.split("/", 1)[0]
        if job in self.jobs:
            return True
        if self.batch is not None and key.startswith(f"_batches/{self.batch[:6]}/{self.batch}."):
            return True
        return not write and key.startswith("_functions/") and key.count("/") >= 2


@dataclass(frozen=True, slots=True)
class EndpointToken:
    """What a verified replica token allows: one endpoint's files, for its owner."""

    user: str
    endpoint: str
    #: The endpoint's ``model_data`` as a key of the server's store (a file, or a prefix).
    model_key: str

    @property
    def shown(self) -> str:
        return f"endpoint {self.endpoint}"

    def may_touch_key(self, key: str, *, write: bool) -> bool:
        key = key.lstrip("/")
        parts = key.split("/")
        if ".." in parts or len(parts) < 3 or parts[:2] != ["endpoints", self.endpoint]:
            if write:
                return False
            model = self.model_key.rstrip("/")
            return key == model or key.startswith(model + "/")
        return parts[2] == "logs" if write else parts[2] in _ENDPOINT_READS


class JobTokens:
    """Mints and verifies job tokens (and endpoints' replica tokens) with the server's
    secret (read, or created, on first use)."""

    def __init__(self, secret_path: Path) -> None:
        self._path = Path(secret_path)
        self._secret: bytes | None = None

    def _key(self) -> bytes:
        if self._secret is None:
            from shoal.jobs.keys import load_user_secret  # same rules: 0600, 0700 dir, 32 bytes

            self._secret = load_user_secret(self._path)
        return self._secret

    def mint(self, user: str, jobs: Sequence[str], batch: str | None = None) -> str:
        payload = json.dumps({"u": user, "j": sorted(jobs), "b": batch},
                             separators=(",", ":")).encode()
        mac = hmac.new(self._key(), _LABEL + payload, hashlib.sha256).digest()
        return f"{JOB_TOKEN_PREFIX}{_b64(payload)}.{_b64(mac)}"

    def mint_endpoint(self, user: str, endpoint: str, model_key: str) -> str:
        """A replica token of *endpoint* (owned by *user*, its model at *model_key*)."""
        payload = json.dumps({"u": user, "e": endpoint, "m": model_key},
                             separators=(",", ":")).encode()
        mac = hmac.new(self._key(), _ENDPOINT_LABEL + payload, hashlib.sha256).digest()
        return f"{ENDPOINT_TOKEN_PREFIX}{_b64(payload)}.{_b64(mac)}"

    def verify(self, token: str) -> JobToken:
        """The token's jobs; AuthenticationError when it was not minted by this server."""
        data = self._open(token[len(JOB_TOKEN_PREFIX):], _LABEL, "job token")
        return JobToken(str(data["u"]), frozenset(str(j) for j in data["j"]),
                        None if data.get("b") is None else str(data["b"]))

    def verify_endpoint(self, token: str) -> EndpointToken:
        """The replica token's endpoint; AuthenticationError when this server did not mint
        it."""
        data = self._open(token[len(ENDPOINT_TOKEN_PREFIX):], _ENDPOINT_LABEL,
                          "endpoint replica token")
        return EndpointToken(str(data["u"]), str(data["e"]), str(data["m"]))

    def _open(self, body: str, label: bytes, what: str) -> dict[str, Any]:
        payload_part, _, mac_part = body.partition(".")
        try:
            payload, mac = _unb64(payload_part), _unb64(mac_part)
        except ValueError:
            payload, mac = b"", b""
        expected = hmac.new(self._key(), label + payload, hashlib.sha256).digest()
        if not payload or not hmac.compare_digest(mac, expected):
            raise AuthenticationError(
                f"the {what} is not valid on this server (damaged, or minted by another "
                "server or before its job-token secret was replaced)")
        data: dict[str, Any] = json.loads(payload)
        return data


_K = TypeVar("_K")
_V = TypeVar("_V")
#: What a job's record may be in while its token still writes.
_LIVE = tuple(s for s in JobStatus if not s.is_terminal)
#: Logged files of a run (``Run.log_file``'s default ``artifact_prefix``).
RUN_FILES = "experiments"


class JobGrants:
    """What a job token reaches beyond its own jobs, decided from their records on this
    server: the runs they are linked to, and whether they may still write.

    A job's owner and run never change after it is created, so they are cached by job name
    (one read the first time a token reaches a run). Whether a job has ended is read per
    write (one indexed query for a live job of the token's, ``limit=1``) until it has: ended
    is final (no transition leaves a terminal status), so that answer is cached too and a
    leaked token of a finished job costs no read at all.
    """

    def __init__(self, store: JobStore, *, cache_size: int = 4096) -> None:
        self._store = store
        self._size = cache_size
        self._links: OrderedDict[str, tuple[str, RunRef | None]] = OrderedDict()
        self._ended: OrderedDict[tuple[str, frozenset[str]], str] = OrderedDict()

    def runs(self, token: JobToken) -> frozenset[tuple[str, str]]:
        """``(experiment, run)`` of each of the token's jobs that its user owns and that is
        linked to a run."""
        missing = sorted(j for j in token.jobs if j not in self._links)
        if missing:
            for record in self._store.list_jobs(JobQuery(names=missing, limit=len(missing))):
                _remember(self._links, record.name, (record.owner, record.spec.run),
                          self._size)
        found = set()
        for job in token.jobs:
            owner, run = self._links.get(job, ("", None))
            if run is not None and owner == token.user:
                found.add((run.experiment_name, run.run_name))
        return frozenset(found)

    def run_of_key(self, token: JobToken, key: str) -> bool:
        """Whether *key* is a logged file of one of the token's runs."""
        parts = key.lstrip("/").split("/")
        if len(parts) < 4 or parts[0] != RUN_FILES:
            return False
        return (parts[1], parts[2]) in self.runs(token)

    def why_ended(self, token: JobToken, job: str | None = None) -> str | None:
        """None while *job* (one of the token's, the one a request names), or else one of
        the token's jobs, has not ended and is the token user's; else why the token writes
        nothing more. A batch's token thus writes a job's files only while that job runs,
        and the batch's own while any of its jobs does."""
        names = frozenset((job,)) if job is not None and job in token.jobs else token.jobs
        cached = self._ended.get((token.user, names))
        if cached is not None:
            return cached
        live = self._store.list_jobs(JobQuery(names=sorted(names), statuses=_LIVE, limit=1))
        if live and live[0].owner == token.user:
            return None
        if live:
            why = (f"job {live[0].name}'s record belongs to user {live[0].owner!r}, not to the "
                   f"token's user {token.user!r}")
        elif len(names) == 1:
            [name] = names
            record = self._store.find_job(name)
            why = f"job {name} has ended ({record.status})" if record is not None else \
                f"job {name}'s record is gone"
        else:
            why = f"all {len(names)} jobs of batch {token.batch or '?'} have ended"
        _remember(self._ended, (token.user, names), why, self._size)
        return why


def _remember(cache: OrderedDict[_K, _V], key: _K, value: _V, size: int) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > size:
        cache.popitem(last=False)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    import binascii

    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, UnicodeEncodeError) as e:
        raise ValueError(str(e)) from e
