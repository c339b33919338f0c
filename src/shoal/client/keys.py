"""``HttpJobKeys``: the ``JobKeys`` port through a team server, which holds one secret per
user (``<server home>/server/user-secrets/``, 0600) and derives a job's secret from the
caller's: the client never holds a user secret, and another user's token gets a key the job's
payloads were not signed with."""

from __future__ import annotations

import threading

from shoal.client.http import ServerConnection

__all__ = ["HttpJobKeys"]


class HttpJobKeys:
    """``secret(job, salt)``: ``POST /api/v1/keys/job-secret`` (cached per job and salt)."""

    def __init__(self, connection: ServerConnection) -> None:
        self._http = connection
        self._known: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def secret(self, job: str, salt: str) -> str:
        with self._lock:
            known = self._known.get((job, salt))
        if known is not None:
            return known
        body = self._http.call("POST", "/keys/job-secret", json={"job": job, "salt": salt})
        secret = str(body["secret"])
        with self._lock:
            if len(self._known) > 4096:
                self._known.clear()
            self._known[(job, salt)] = secret
        return secret
