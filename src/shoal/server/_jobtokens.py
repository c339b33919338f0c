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
owner ``job:<name>``; nothing else.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from shoal.errors import AuthenticationError

__all__ = ["JOB_TOKEN_PREFIX", "JobToken", "JobTokens"]

JOB_TOKEN_PREFIX = "shoalj_"
_LABEL = b"shoal/job-token/v1\0"


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


class JobTokens:
    """Mints and verifies job tokens with the server's secret (read, or created, on first
    use)."""

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

    def verify(self, token: str) -> JobToken:
        """The token's jobs; AuthenticationError when it was not minted by this server."""
        body = token[len(JOB_TOKEN_PREFIX):]
        payload_part, _, mac_part = body.partition(".")
        try:
            payload, mac = _unb64(payload_part), _unb64(mac_part)
        except ValueError:
            payload, mac = b"", b""
        expected = hmac.new(self._key(), _LABEL + payload, hashlib.sha256).digest()
        if not payload or not hmac.compare_digest(mac, expected):
            raise AuthenticationError(
                "the job token is not valid on this server (damaged, or minted by another "
                "server or before its job-token secret was replaced)")
        data = json.loads(payload)
        return JobToken(str(data["u"]), frozenset(str(j) for j in data["j"]),
                        None if data.get("b") is None else str(data["b"]))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    import binascii

    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, UnicodeEncodeError) as e:
        raise ValueError(str(e)) from e
