"""``HttpJobKeys``: the ``JobKeys`` port through a team server, which holds one secret per
user (``<server home>/server/user-secrets/``, 0600) and derives a job's secret from the
caller's: the client never holds a user secret, and another user's token gets a key the job's
payloads were not signed with."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from shoal.client.http import ServerConnection
from shoal.core.api import MAX_JOB_SECRETS_PER_REQUEST
from shoal.core.leases import leased_job_secret, leased_salt

__all__ = ["HttpJobKeys"]


class HttpJobKeys:
    """``secret(job, salt)``: ``POST /api/v1/keys/job-secret``; ``secrets([...])``, a batch's:
    ``POST /api/v1/keys/job-secrets``, one request (both cached per job and salt).
    ``new_secrets(jobs)`` (``SaltingKeys``): new jobs' salts and secrets under one key lease
    (``POST /api/v1/keys/lease``, once), derived here without a request per job."""

    def __init__(self, connection: ServerConnection) -> None:
        self._http = connection
        self._known: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()
        self._lease: tuple[str, bytes] | None = None

    def new_secrets(self, jobs: Sequence[str]) -> list[tuple[str, str]]:
        with self._lock:
            lease = self._lease
        if lease is None:
            body = self._http.call("POST", "/keys/lease")
            lease = (str(body["lease"]), bytes.fromhex(str(body["secret"])))
            with self._lock:
                self._lease = self._lease or lease
                lease = self._lease
        out = []
        for job in jobs:
            salt = leased_salt(lease[0])
            out.append((salt, leased_job_secret(lease[1], job, salt)))
        return out

    def secret(self, job: str, salt: str) -> str:
        with self._lock:
            known = self._known.get((job, salt))
        if known is not None:
            return known
        body = self._http.call("POST", "/keys/job-secret", json={"job": job, "salt": salt})
        secret = str(body["secret"])
        self._remember({(job, salt): secret})
        return secret

    def secrets(self, jobs: Sequence[tuple[str, str]]) -> list[str]:
        with self._lock:
            have = {j: self._known[j] for j in jobs if j in self._known}
        missing = list(dict.fromkeys(j for j in jobs if j not in have))
        found: dict[tuple[str, str], str] = {}
        for start in range(0, len(missing), MAX_JOB_SECRETS_PER_REQUEST):
            chunk = missing[start:start + MAX_JOB_SECRETS_PER_REQUEST]
            body = self._http.call("POST", "/keys/job-secrets", json={
                "jobs": [{"job": job, "salt": salt} for job, salt in chunk]})
            found.update(zip(chunk, (str(s) for s in body["secrets"]), strict=True))
        self._remember(found)
        have.update(found)
        return [have[j] for j in jobs]

    def _remember(self, secrets: dict[tuple[str, str], str]) -> None:
        with self._lock:
            if len(self._known) + len(secrets) > 4096:
                self._known.clear()
            self._known.update(secrets)
